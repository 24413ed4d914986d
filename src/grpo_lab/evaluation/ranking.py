"""Who won, and who cannot be told from the winner: one value, computed once, that every report renders.

A :class:`Ranking` orders the trials of a study (:func:`from_trials`) or the runs of a folder, study or W&B
group (:func:`from_runs`) and gives each a :class:`Verdict` against the leader:

- after a sweep's confirmation runs, configs are ranked by their mean over seeds and a runner-up whose
  seed values Welch's t-test cannot tell from the leader's (p >= 0.05, or too few seeds) is tied;
- otherwise the best value leads; a run with exactly its value is tied, and so is one whose held-out
  items, graded on the same questions as the leader's, do not differ from them (exact McNemar, p >= 0.05);
- with several objectives the Pareto front leads and nothing is tied.

The sweep's table and best.yaml, retention, the leaderboard, the multirun's end, `compare --export` and the
plots read its fields. Pure: no Optuna or torch; trials and run records are read through their attributes.
"""

from __future__ import annotations

import enum
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from grpo_lab.config.overrides import user_overrides
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
    """A config with confirmation runs: its search trial and the objective over all its seeds (search first)."""

    trial: int
    values: tuple[float, ...]
    mean: SeedMean
    p_vs_best: float  # Welch's p against the leader's config; nan for the leader, or too few seeds
    tied: bool


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

    @property
    def best(self) -> tuple[Entry, ...]:
        """The leader, or the Pareto front; never a confirmation repeat."""
        return tuple(e for e in self.entries if e.verdict is Verdict.LEADER and e.confirms is None)

    @property
    def leader(self) -> Entry | None:
        return self.best[0] if len(self.directions) == 1 and self.best else None

    @property
    def tied(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.verdict is Verdict.TIED and e.confirms is None)

    @property
    def ranked(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.verdict is not Verdict.UNRANKED)


def rerun_command(overrides: list[str]) -> str:
    """`python -m grpo_lab ...` to paste into a shell: the overrides as a user types them (the CLI adds the
    `++` again), minus the sweep machinery."""
    return shlex.join(["python", "-m", "grpo_lab", *user_overrides(overrides)])


class _Candidate(NamedTuple):
    name: str
    trial: int | None
    finished: bool
    values: tuple[float, ...] | None
    overrides: tuple[str, ...]
    confirms: int | None
    record: Any


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
        )
        for run in runs
    ]
    return _rank(cands, list(directions), items=items)


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
    elif any(c.confirms is not None for c in ranked):
        configs = _configs(ranked, signs[0])
        order = {cfg.trial: i for i, cfg in enumerate(configs)}
        groups = {id(c): order.get(_config_of(c), len(order)) for c in cands}
        verdicts = {id(c): _config_verdict(c, configs) for c in ranked}
        tested = True
    else:
        configs, groups = (), {}
        leader = min(ranked, key=lambda c: signs[0] * c.values[0], default=None)
        leader_items = items(leader.record) if items and leader is not None else None
        verdicts = {id(c): _value_verdict(c, leader, leader_items, items) for c in ranked}
        tested = bool(leader_items)
    position = {id(c): i for i, c in enumerate(cands)}

    def key(c: _Candidate) -> tuple:
        if c.values is None or verdicts.get(id(c), (Verdict.UNRANKED,))[0] is Verdict.UNRANKED:
            return (1, 0, 0.0, position[id(c)])
        return (0, groups.get(id(c), 0), signs[0] * c.values[0], position[id(c)])

    entries = tuple(_entry(c, *verdicts.get(id(c), (Verdict.UNRANKED, None))) for c in sorted(cands, key=key))
    return Ranking(entries=entries, directions=tuple(directions), configs=configs, tested=tested)


def _entry(c: _Candidate, verdict: Verdict, versus: Versus | None) -> Entry:
    return Entry(c.name, c.trial, c.values, verdict, c.overrides, c.confirms, versus, c.record)


def _pareto(ranked: list[_Candidate], signs: list[float]) -> set[int]:
    """ids of the non-dominated candidates (equal ones are all on the front)."""
    losses = {id(c): [s * v for s, v in zip(signs, c.values, strict=True)] for c in ranked}

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    return {i for i, loss in losses.items() if not any(dominates(other, loss) for other in losses.values())}


def _config_of(c: _Candidate) -> int | None:
    return c.confirms if c.confirms is not None else c.trial


def _configs(ranked: list[_Candidate], sign: float) -> tuple[Config, ...]:
    """Each confirmed config's seed values (its search trial's first), best mean first, with Welch's test."""
    values: dict[int, list[float]] = {c.confirms: [] for c in ranked if c.confirms is not None}
    for c in sorted(ranked, key=lambda c: c.trial if c.trial is not None else -1):
        if (number := _config_of(c)) in values:
            values[number].append(c.values[0])
    means = {n: seed_mean(v) for n, v in values.items()}
    order = sorted(values, key=lambda n: sign * means[n].mean)
    best = order[0]
    configs = []
    for n in order:
        p = math.nan if n == best else welch_p(values[best], values[n])
        # nan (too few seeds) counts as tied: not shown to differ
        configs.append(Config(n, tuple(values[n]), means[n], p, n != best and not p < ALPHA))
    return tuple(configs)


def _config_verdict(c: _Candidate, configs: tuple[Config, ...]) -> tuple[Verdict, Versus | None]:
    found = next((cfg for cfg in configs if cfg.trial == _config_of(c)), None)
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
    if c is leader:
        return Verdict.LEADER, None
    mine = items(c.record) if leader_items and items is not None else None
    versus = paired(leader_items, mine) if leader_items and mine else None
    tied = c.values[0] == leader.values[0] or (versus is not None and versus.p_value >= ALPHA)
    return (Verdict.TIED if tied else Verdict.BEHIND), versus


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
