"""Confirmation runs: after the search, the best configs again with other seeds; the winner by the seed mean.

A search crowns max(objective) over trials whose values differ by less than their own noise, so its #1 can be
a lucky seed. With `hydra.sweeper.confirm.top_k=K hydra.sweeper.confirm.seeds=S` the sweeper re-runs the K
best configs of the search with S more seeds each: new trials of the same study (user attribute `confirm_of`,
W&B tag `confirm`, the study's W&B group), never pruned. best.yaml, the sweep's final table and
`compare --export` then rank those configs by their mean over seeds and name the ones that are statistically
tied with #1 (Welch's t-test on the seed values, p >= 0.05).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_lab.stats import ALPHA, SeedMean, seed_mean, welch_p

CONFIRM_OF = "confirm_of"  # on a confirmation trial: the number of the search trial whose config it repeats
SEED = "confirm_seed"  # and the seed it runs with
_PLANNED = "grpo_lab_confirm_planned"  # study attribute: the number of confirmation trials enqueued


def is_confirmation(trial: Any) -> bool:
    return CONFIRM_OF in trial.user_attrs


def _complete(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _maximize(study: Any) -> bool:
    from optuna.study import StudyDirection

    return study.direction == StudyDirection.MAXIMIZE


def plan(study: Any, *, top_k: int, seeds: int, base_seed: int) -> list[tuple[int, dict[str, Any], int]]:
    """(search trial number, its params, seed) of every confirmation run: the `top_k` best search trials, each
    with seeds base_seed + 1 .. base_seed + `seeds` (the same seeds for every config, so that they compare)."""
    search = [t for t in _complete(study) if not is_confirmation(t)]
    best = sorted(search, key=lambda t: t.value, reverse=_maximize(study))[:top_k]
    return [(t.number, dict(t.params), base_seed + i) for t in best for i in range(1, seeds + 1)]


def enqueue(study: Any, runs: list[tuple[int, dict[str, Any], int]]) -> None:
    """Queue the confirmation trials once per study (call under the sweep's claim lock)."""
    for number, params, seed in runs:
        study.enqueue_trial(params, user_attrs={CONFIRM_OF: number, SEED: seed}, skip_if_exists=False)
    study.set_user_attr(_PLANNED, len(runs))


def planned(study: Any) -> int | None:
    """How many confirmation trials this study queued; None before it did."""
    return study.user_attrs.get(_PLANNED)


@dataclass(frozen=True)
class ConfigResult:
    """One confirmed config: its search trial and the objective over all its seeds (the search's first)."""

    trial: int
    values: list[float]
    mean: SeedMean
    p_vs_best: float  # Welch's p against #1; nan for #1 itself or with fewer than two values on a side
    tied: bool  # not distinguishable from #1 at the 95% level

    @property
    def label(self) -> str:
        if self.p_vs_best != self.p_vs_best:  # nan: #1, or too few seeds to tell
            return "best" if not self.tied else "≈#1 (too few seeds)"
        return f"≈#1 (p={self.p_vs_best:.2g})" if self.tied else f"worse (p={self.p_vs_best:.2g})"


def rank(study: Any) -> list[ConfigResult]:
    """The configs that have confirmation runs, best seed mean first; [] when the study has none (and for
    several objectives, which are not confirmed)."""
    if len(study.directions) > 1:
        return []
    complete = _complete(study)
    values: dict[int, list[float]] = {}
    for t in complete:
        if is_confirmation(t):
            values.setdefault(int(t.user_attrs[CONFIRM_OF]), [])
    for t in sorted(complete, key=lambda t: t.number):  # the search trial's value first, then its seeds'
        number = int(t.user_attrs.get(CONFIRM_OF, t.number))
        if number in values:
            values[number].append(float(t.value))
    means = {n: seed_mean(v) for n, v in values.items()}
    order = sorted(values, key=lambda n: means[n].mean, reverse=_maximize(study))
    results = []
    for n in order:
        p = float("nan") if n == order[0] else welch_p(values[order[0]], values[n])
        tied = n != order[0] and not p < ALPHA  # nan (too few seeds) counts as tied: not shown to differ
        results.append(ConfigResult(n, values[n], means[n], p, tied))
    return results


def table(results: list[ConfigResult]) -> str:
    """The confirmation block of the sweep's end: one line per config, best seed mean first."""
    rows = [["config", "seeds", "mean", "95% CI", "values", "vs #1"]]
    for r in results:
        ci = "-" if r.mean.ci_low != r.mean.ci_low else f"[{r.mean.ci_low:.4g}, {r.mean.ci_high:.4g}]"
        rows.append(
            [f"#{r.trial}", str(r.mean.n), f"{r.mean.mean:.4g}", ci, " ".join(f"{v:.3g}" for v in r.values), r.label]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def verdict(results: list[ConfigResult]) -> str:
    """One line: the winner by seed mean, and whether the runners-up can be told apart from it."""
    best, tied = results[0], [r for r in results[1:] if r.tied]
    line = f"Best config by the mean over {best.mean.n} seeds: #{best.trial} ({best.mean.mean:.4g})."
    if tied:
        line += (
            f" Statistically tied with {', '.join('#' + str(r.trial) for r in tied)}: more seeds or a larger"
            " eval set are needed to tell them apart."
        )
    return line


__all__ = ["CONFIRM_OF", "SEED", "ConfigResult", "enqueue", "is_confirmation", "plan", "planned", "rank"]
