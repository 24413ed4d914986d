"""Confirmation runs: after the search, the best configs again with other seeds; the winner by the seed mean.

A search crowns max(objective) over trials whose values differ by less than their own noise, so its #1 can be
a lucky seed. With `hydra.sweeper.confirm.top_k=K hydra.sweeper.confirm.seeds=S` the sweeper re-runs the K
best configs of the search with S more seeds each: new trials of the same study (user attribute `confirm_of`,
W&B tag `confirm`, the study's W&B group), never pruned. best.yaml, the sweep's final table and
`compare --export` then rank those configs by their mean over seeds and name the ones that are statistically
tied with #1 (Welch's t-test on the seed values, p >= 0.05).
"""

from __future__ import annotations

import math
from typing import Any

from grpo_lab.evaluation.ranking import CONFIRM_OF, Config, Ranking, from_trials

SEED = "confirm_seed"  # on a confirmation trial: the seed it runs with
_PLANNED = "grpo_lab_confirm_planned"  # study attribute: the number of confirmation trials enqueued


def is_confirmation(trial: Any) -> bool:
    return CONFIRM_OF in trial.user_attrs


def plan(study: Any, *, top_k: int, seeds: int, base_seed: int) -> list[tuple[int, dict[str, Any], int]]:
    """(search trial number, its params, seed) of every confirmation run: the `top_k` best search trials, each
    with seeds base_seed + 1 .. base_seed + `seeds` (the same seeds for every config, so that they compare)."""
    search = [e for e in from_trials(study).ranked if e.confirms is None][:top_k]
    return [(e.trial, dict(e.record.params), base_seed + i) for e in search for i in range(1, seeds + 1)]


def enqueue(study: Any, runs: list[tuple[int, dict[str, Any], int]]) -> None:
    """Queue the confirmation trials once per study (call under the sweep's claim lock)."""
    for number, params, seed in runs:
        study.enqueue_trial(params, user_attrs={CONFIRM_OF: number, SEED: seed}, skip_if_exists=False)
    study.set_user_attr(_PLANNED, len(runs))


def planned(study: Any) -> int | None:
    """How many confirmation trials this study queued; None before it did."""
    return study.user_attrs.get(_PLANNED)


def _vs_best(config: Config, best: Config) -> str:
    if config is best:
        return "best"
    if math.isnan(config.p_vs_best):
        return "≈#1 (too few seeds)"
    return f"≈#1 (p={config.p_vs_best:.2g})" if config.tied else f"worse (p={config.p_vs_best:.2g})"


def table(ranking: Ranking) -> str:
    """The confirmation block of the sweep's end: one line per config, best seed mean first."""
    rows = [["config", "seeds", "mean", "95% CI", "values", "vs #1"]]
    for c in ranking.configs:
        ci = "-" if math.isnan(c.mean.ci_low) else f"[{c.mean.ci_low:.4g}, {c.mean.ci_high:.4g}]"
        values = " ".join(f"{v:.3g}" for v in c.values)
        rows.append([f"#{c.trial}", str(c.mean.n), f"{c.mean.mean:.4g}", ci, values, _vs_best(c, ranking.configs[0])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def verdict(ranking: Ranking) -> str:
    """One line: the winner by seed mean, and whether the runners-up can be told apart from it."""
    best = ranking.configs[0]
    line = f"Best config by the mean over {best.mean.n} seeds: #{best.trial} ({best.mean.mean:.4g})."
    if tied := [c for c in ranking.configs if c.tied]:
        line += (
            f" Statistically tied with {', '.join('#' + str(c.trial) for c in tied)}: more seeds or a larger"
            " eval set are needed to tell them apart."
        )
    return line


__all__ = ["CONFIRM_OF", "SEED", "enqueue", "is_confirmation", "plan", "planned", "table", "verdict"]
