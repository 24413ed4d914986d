"""Who won, and who cannot be told from the winner: one value, computed once, that every report renders.

A :class:`Ranking` orders the trials of a study (:func:`from_trials`) or the runs of a folder, study or W&B
group (:func:`from_runs`) and gives each a :class:`Verdict` against the leader:

- when a config ran with several seeds (a sweep's confirmation runs; a grid's jobs that differ only in `seed`),
  configs are ranked by their mean over seeds and a runner-up whose seed values Welch's t-test cannot tell from
  the leader's (p >= 0.05, or too few seeds) is tied;
- with one seed per config the best value leads and every other config is tied with it: two seeds of one config
  differ as much as two configs (benchmarks/selection.py measured how often identical configs "differed" on the
  same held-out items), so one seed cannot tell configs apart. The paired test on the leader's held-out items
  (exact McNemar) is still given beside each run: it compares the two models, not their configs;
- with several objectives the Pareto front leads and nothing is tied.

The sweep's table and best.yaml, retention, the leaderboard, the multirun's end, `compare --export` and the
plots read its fields. Pure: no Optuna or torch; trials and run records are read through their attributes.
"""

from __future__ import annotations

import enum
import math
import shlex
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from grpo_lab.config.overrides import key, user_overrides
from grpo_lab.evaluation.stats import ALPHA, SeedMean, paired_change, seed_mean, welch_p
from grpo_lab.paths import trial_name

CONFIRM_OF = "confirm_of"  # on a confirmation trial: the number of the search trial whose config it repeats

Items = list[tuple[str, bool | None]]  # (question, graded 0/1 or None) per held-out item


class Verdict(enum.StrEnum):
    LEADER = "leader"  # the winner (or its config's seed runs; with several objectives: the Pareto front)
    TIED = "tied"  # not shown to differ from the leader
    BEHIND = "behind"  # shown to be worse, or worse by value with no test to say otherwise
    UNRANKED = "unranked"  # no result to rank: failed, pruned, running, or no objective value


@dataclass(frozen=True)
class Versus:
    """An entry against the leader: McNemar on the same items ("paired") or Welch on seed values ("welch")."""

    test: str
    p_value: float  # nan: too few seeds to test
    difference: float  # entry - leader (paired: the proportion; welch: the seed means)
    ci_low: float | None = None  # the paired difference's 95% interval (Newcombe)
    ci_high: float | None = None
    items: int | None = None


@dataclass(frozen=True)
class Config:
    """A config with several seeds (a sweep's confirmed config, a grid's seeds) and its objective over them."""

    trial: int | None  # a sweep's: its search trial (None for a grid's config)
    values: tuple[float, ...]
    mean: SeedMean
    p_vs_best: float  # Welch's p against the leader's config; nan for the leader, or too few seeds
    tied: bool
    key: Hashable = None  # the entries' `config`
    name: str = ""  # its first run's (a sweep's: trial_<n>)


@dataclass(frozen=True)
class Entry:
    name: str
    trial: int | None
    values: tuple[float, ...] | None
    verdict: Verdict
    overrides: tuple[str, ...] = ()
    confirms: int | None = None  # the search trial whose config this run repeats with another seed
    versus: Versus | None = None
    record: Any = field(default=None, compare=False, repr=False)  # the trial or run record it was built from
    config: Hashable = field(default=None, compare=False, repr=False)  # what its seeds share (see _config_key)

    @property
    def objective(self) -> float | None:
        return self.values[0] if self.values else None

    @property
    def command(self) -> str:
        return rerun_command(list(self.overrides))


@dataclass(frozen=True)
class Ranking:
    entries: tuple[Entry, ...]  # best first; unranked entries last, in their input order
    directions: tuple[str, ...]
    configs: tuple[Config, ...] = ()  # confirmed configs, best seed mean first
    tested: bool = False  # runners-up were tested against the leader (seed runs, or the leader's items)

    one_seed: bool = False  # one seed per config: the configs cannot be told apart (all tied with the leader)

    @property
    def best(self) -> tuple[Entry, ...]:
        """The leader, or the Pareto front; never a repeat of a config with another seed."""
        return _firsts(e for e in self.entries if e.verdict is Verdict.LEADER and e.confirms is None)

    @property
    def leader(self) -> Entry | None:
        return self.best[0] if len(self.directions) == 1 and self.best else None

    @property
    def tied(self) -> tuple[Entry, ...]:
        """The configs not shown to differ from the leader's (each by its best run)."""
        return _firsts(e for e in self.entries if e.verdict is Verdict.TIED and e.confirms is None)

    def seeds_of(self, entry: Entry) -> tuple[Entry, ...]:
        """Every ranked run of `entry`'s config (its seeds), best first."""
        return tuple(e for e in self.ranked if e.config == entry.config)

    @property
    def ranked(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.verdict is not Verdict.UNRANKED)


def rerun_command(overrides: list[str]) -> str:
    """`python -m grpo_lab ...` to paste into a shell: the overrides as a user types them (the CLI adds the
    `++` again), minus the sweep machinery."""
    return shlex.join(["python", "-m", "grpo_lab", *user_overrides(overrides)])


def _firsts(entries: Any) -> tuple[Entry, ...]:
    """The first entry of each config, in order."""
    seen: set[Hashable] = set()
    out = []
    for e in entries:
        if e.config not in seen:
            seen.add(e.config)
            out.append(e)
    return tuple(out)


class _Candidate(NamedTuple):
    name: str
    trial: int | None
    finished: bool
    values: tuple[float, ...] | None
    overrides: tuple[str, ...]
    confirms: int | None
    record: Any
    config: Hashable  # what a config's seeds share: its search trial's number, or its overrides less `seed`


def from_trials(study: Any) -> Ranking:
    """The ranking of an Optuna study's trials (COMPLETE ones are ranked)."""
    cands = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        confirms = t.user_attrs.get(CONFIRM_OF)
        cands.append(
            _Candidate(
                name=trial_name(t.number),
                trial=t.number,
                finished=t.state.name == "COMPLETE",
                values=tuple(float(v) for v in t.values) if t.values is not None else None,
                overrides=tuple(t.user_attrs.get("overrides", [])),
                confirms=None if confirms is None else int(confirms),
                record=t,
                config=int(confirms) if confirms is not None else t.number,
            )
        )
    return _rank(cands, [d.name.lower() for d in study.directions], items=None)


def from_runs(
    runs: Sequence[Any], directions: Sequence[str], items: Callable[[Any], Items | None] | None = None
) -> Ranking:
    """The ranking of run records (`compare.sources.RunRecord`: name, state, objective, values, overrides,
    trial, confirms); `items(run)` gives a run's graded held-out items for the paired test."""
    cands = [
        _Candidate(
            name=run.name if run.trial is None else trial_name(run.trial),
            trial=run.trial,
            finished=run.state == "finished",
            values=_values(run),
            overrides=tuple(run.overrides),
            confirms=run.confirms,
            record=run,
            config=_config_key(run),
        )
        for run in runs
    ]
    return _rank(cands, list(directions), items=items)


def _config_key(run: Any) -> Hashable:
    """A sweep trial's config is its search trial's; a run's, its overrides less `seed` (a grid's jobs that differ
    only in their seed are one config's seeds); a run without any override (a W&B run, a hand-made record) is
    its own config: nothing says what it shares with another."""
    if run.trial is not None:
        return run.confirms if run.confirms is not None else run.trial
    if not run.overrides:
        return ("run", run.name)
    return frozenset(o for o in user_overrides(run.overrides) if _key(o) != "seed")


def _key(override: str) -> str:
    try:
        return key(override)
    except Exception:  # not Hydra's grammar (a hand-written record): the text left of `=`
        return override.partition("=")[0].lstrip("+~")


def _values(run: Any) -> tuple[float, ...] | None:
    values = run.values if run.values is not None else [run.objective]
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return tuple(float(v) for v in values)


def _rank(cands: list[_Candidate], directions: list[str], items: Callable[[Any], Items | None] | None) -> Ranking:
    signs = [-1.0 if d == "maximize" else 1.0 for d in directions]
    ranked = [c for c in cands if c.finished and c.values is not None]
    if len(directions) > 1:
        front = _pareto(ranked, signs)
        groups = {id(c): 0 if id(c) in front else 1 for c in cands}
        verdicts = {id(c): (Verdict.LEADER if id(c) in front else Verdict.BEHIND, None) for c in ranked}
        configs: tuple[Config, ...] = ()
        tested = False
    elif any(c.confirms is not None for c in ranked) or _replicated(ranked):
        configs = _configs(ranked, signs[0])
        order = {cfg.key: i for i, cfg in enumerate(configs)}
        groups = {id(c): order.get(c.config, len(order)) for c in cands}
        verdicts = {id(c): _config_verdict(c, configs) for c in ranked}
        tested = True
    else:  # one seed per config
        configs, groups = (), {}
        leader = min(ranked, key=lambda c: signs[0] * c.values[0], default=None)
        leader_items = items(leader.record) if items and leader is not None else None
        verdicts = {id(c): _value_verdict(c, leader, leader_items, items) for c in ranked}
        tested = False
    position = {id(c): i for i, c in enumerate(cands)}

    def key(c: _Candidate) -> tuple:
        if c.values is None or verdicts.get(id(c), (Verdict.UNRANKED,))[0] is Verdict.UNRANKED:
            return (1, 0, 0.0, position[id(c)])
        return (0, groups.get(id(c), 0), signs[0] * c.values[0], position[id(c)])

    entries = tuple(_entry(c, *verdicts.get(id(c), (Verdict.UNRANKED, None))) for c in sorted(cands, key=key))
    one_seed = len(directions) == 1 and not configs and len({c.config for c in ranked}) > 1
    return Ranking(entries, tuple(directions), configs=configs, tested=tested, one_seed=one_seed)


def _replicated(ranked: list[_Candidate]) -> bool:
    """Whether some config has several finished seeds (a grid's `seed=1,2,3`)."""
    configs = [c.config for c in ranked]
    return len(set(configs)) < len(configs)


def _entry(c: _Candidate, verdict: Verdict, versus: Versus | None) -> Entry:
    return Entry(c.name, c.trial, c.values, verdict, c.overrides, c.confirms, versus, c.record, c.config)


def _pareto(ranked: list[_Candidate], signs: list[float]) -> set[int]:
    """ids of the non-dominated candidates (equal ones are all on the front)."""
    losses = {id(c): [s * v for s, v in zip(signs, c.values, strict=True)] for c in ranked}

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    return {i for i, loss in losses.items() if not any(dominates(other, loss) for other in losses.values())}


def _configs(ranked: list[_Candidate], sign: float) -> tuple[Config, ...]:
    """Each config's seed values (a sweep: its confirmed configs, the search trial's value first; runs: every
    config), best mean first, with Welch's test against the best."""
    sweep = any(c.trial is not None for c in ranked)
    values: dict[Hashable, list[float]] = {}
    if sweep:
        values = {c.confirms: [] for c in ranked if c.confirms is not None}
    first: dict[Hashable, _Candidate] = {}
    for c in sorted(ranked, key=lambda c: c.trial if c.trial is not None else -1):
        if c.config in values or not sweep:
            values.setdefault(c.config, []).append(c.values[0])
            first.setdefault(c.config, c)
    means = {k: seed_mean(v) for k, v in values.items()}
    order = sorted(values, key=lambda k: sign * means[k].mean)
    best = order[0]
    configs = []
    for k in order:
        p = math.nan if k == best else welch_p(values[best], values[k])
        # nan (too few seeds) counts as tied: not shown to differ
        trial = first[k].trial if sweep else None
        configs.append(Config(trial, tuple(values[k]), means[k], p, k != best and not p < ALPHA, k, first[k].name))
    return tuple(configs)


def _config_verdict(c: _Candidate, configs: tuple[Config, ...]) -> tuple[Verdict, Versus | None]:
    found = next((cfg for cfg in configs if cfg.key == c.config), None)
    if found is None:  # a search trial that was not among the confirmed top k
        return Verdict.BEHIND, None
    if found is configs[0]:
        return Verdict.LEADER, None
    versus = Versus("welch", found.p_vs_best, found.mean.mean - configs[0].mean.mean)
    return (Verdict.TIED if found.tied else Verdict.BEHIND), versus


def _value_verdict(
    c: _Candidate,
    leader: _Candidate,
    leader_items: Items | None,
    items: Callable[[Any], Items | None] | None,
) -> tuple[Verdict, Versus | None]:
    """One seed per config: every config is tied with the leader's; the paired test on the leader's items, when
    both were graded on the same ones, says how the two models differ."""
    if c is leader:
        return Verdict.LEADER, None
    mine = items(c.record) if leader_items and items is not None else None
    return Verdict.TIED, paired(leader_items, mine) if leader_items and mine else None


def paired(leader: Items, other: Items) -> Versus | None:
    """`other` against `leader` when both were graded on the same items (same questions, same order)."""
    if len(leader) != len(other) or any(q1 != q2 for (q1, _), (q2, _) in zip(leader, other, strict=True)):
        return None
    pairs = [(a, b) for (_, a), (_, b) in zip(leader, other, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    change = paired_change([a for a, _ in pairs], [b for _, b in pairs])
    return Versus("paired", change.p_value, change.change, change.ci_low, change.ci_high, len(pairs))


__all__ = ["Config", "Entry", "Ranking", "Verdict", "Versus", "from_runs", "from_trials", "paired", "rerun_command"]
