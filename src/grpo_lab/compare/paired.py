"""A run's held-out items and the interval of its objective, for the leaderboard and the paired test.

For an objective that is a held-out grader's share (`eval_after/<grader>`: accuracy, format...), each run
folder's `eval_after.jsonl` holds one graded completion per item: the items that `grpo_lab.evaluation.ranking` compares
with the leader's (same questions, same order: McNemar). Runs without per-item results (W&B sources, other
objectives, other eval sets) get no test.
"""

from __future__ import annotations

from typing import Any

from grpo_lab.compare.sources import RunRecord
from grpo_lab.config import EVAL_EXTRA_METRICS
from grpo_lab.evaluation.graders import item_value
from grpo_lab.evaluation.stats import wilson
from grpo_lab.run.folder import RunFolder


def item_outcomes(run: RunRecord, metric: str) -> list[tuple[str, bool | None]] | None:
    """(question, 0/1 or None when ungraded) per held-out item of a run folder; None when it has none."""
    prefix, _, grader = metric.partition("/")
    if prefix != "eval_after" or grader in EVAL_EXTRA_METRICS or run.run_dir is None:
        return None
    rows = RunFolder(run.run_dir).read_eval(prefix)
    if not rows or all(item_value(r, grader) is None for r in rows):  # no such grader in this run
        return None
    return [(str(r.get("question", r.get("item", ""))), _outcome(item_value(r, grader))) for r in rows]


def _outcome(value: Any) -> bool | None:
    return None if value is None else bool(value)


def interval(run: RunRecord, metric: str) -> tuple[float, float] | None:
    """The 95% interval of a run's objective: recorded in metrics.json, else from its items."""
    low, high = run.metrics.get(f"{metric}_ci_low"), run.metrics.get(f"{metric}_ci_high")
    if isinstance(low, int | float) and isinstance(high, int | float):
        return (float(low), float(high))
    outcomes = item_outcomes(run, metric)
    graded = [o for _, o in outcomes or [] if o is not None]
    return wilson(sum(graded), len(graded)) if graded else None
