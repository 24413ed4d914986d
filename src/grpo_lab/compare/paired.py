"""Is #1 really better than #2? The leader against each runner-up on the same held-out items.

For an objective that is a held-out proportion (`eval_after/accuracy` or `eval_after/format`), each run
folder's `eval_after.jsonl` holds one graded completion per item. Two runs evaluated on the same items (same
questions, same order) are compared pairwise: the difference, Newcombe's paired 95% interval and the exact
McNemar p-value; a runner-up whose p-value is 0.05 or more cannot be told from the leader and is marked
tied (`≈#1`). Runs without per-item results (W&B sources, other objectives, other eval sets) get no verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_lab import records
from grpo_lab.compare.sources import RunRecord
from grpo_lab.stats import ALPHA, paired_change, wilson

# Objective -> (eval file, per-item key)
ITEM_METRICS = {f"eval_after/{name}": ("eval_after", key) for name, key in records.EVAL_ITEM_KEYS.items()}


@dataclass(frozen=True)
class Versus:
    """A runner-up against the leader, on the items both were graded on."""

    items: int
    difference: float  # runner-up - leader (negative: worse, for a maximised metric)
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def tied(self) -> bool:
        return self.p_value >= ALPHA

    def label(self) -> str:
        return (
            f"≈#1 (p={self.p_value:.2g})" if self.tied else f"{100 * self.difference:+.0f} pts (p={self.p_value:.2g})"
        )


def item_outcomes(run: RunRecord, metric: str) -> list[tuple[str, bool | None]] | None:
    """(question, 0/1 or None when ungraded) per held-out item of a run folder; None when it has none."""
    if metric not in ITEM_METRICS or run.run_dir is None:
        return None
    name, key = ITEM_METRICS[metric]
    rows = records.read_eval(run.run_dir, name)
    if not rows:
        return None
    return [(str(r.get("question", "")), None if r.get(key) is None else bool(r[key])) for r in rows]


def interval(run: RunRecord, metric: str) -> tuple[float, float] | None:
    """The 95% interval of a run's objective: recorded in metrics.json, else from its items."""
    low, high = run.metrics.get(f"{metric}_ci_low"), run.metrics.get(f"{metric}_ci_high")
    if isinstance(low, int | float) and isinstance(high, int | float):
        return (float(low), float(high))
    outcomes = item_outcomes(run, metric)
    graded = [o for _, o in outcomes or [] if o is not None]
    return wilson(sum(graded), len(graded)) if graded else None


def versus(leader: list[tuple[str, bool | None]], other: list[tuple[str, bool | None]]) -> Versus | None:
    """`other` against `leader` when both were graded on the same items (same questions, same order)."""
    if len(leader) != len(other) or any(q1 != q2 for (q1, _), (q2, _) in zip(leader, other, strict=True)):
        return None
    pairs = [(a, b) for (_, a), (_, b) in zip(leader, other, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    change = paired_change([a for a, _ in pairs], [b for _, b in pairs])
    return Versus(len(pairs), change.change, change.ci_low, change.ci_high, change.p_value)


def annotate(rows: list[dict[str, Any]], metric: str) -> None:
    """Fill each row's `ci95` and, for finished runs after the first, `vs_#1` and its numbers."""
    leader_items = None
    for row in rows:
        run: RunRecord = row["_run"]
        found = interval(run, metric) if run.objective is not None else None
        row["ci_low"], row["ci_high"] = found if found else (None, None)
        row["ci95"] = f"[{found[0]:.2f}, {found[1]:.2f}]" if found and not math.isnan(found[0]) else None
        row["vs_#1"] = row["p_vs_#1"] = row["diff_vs_#1"] = row["diff_ci_low"] = row["diff_ci_high"] = None
        if run.state != "finished" or run.objective is None:
            continue
        if leader_items is None:
            leader_items = item_outcomes(run, metric) or []
            row["vs_#1"] = "leader" if leader_items else None
            continue
        mine = item_outcomes(run, metric)
        result = versus(leader_items, mine) if leader_items and mine else None
        if result is not None:
            row["vs_#1"] = result.label()
            row["p_vs_#1"], row["diff_vs_#1"] = result.p_value, result.difference
            row["diff_ci_low"], row["diff_ci_high"] = result.ci_low, result.ci_high
