"""The leaderboard: one row per run or trial in the order of `grpo_lab.evaluation.ranking` (the objective, or the
mean over
seeds after a sweep's confirmation runs), with health flags and, for one objective, each run's 95% interval and
its comparison with the leader (`ci95`, `vs_#1`).

Health flags: the rules of grpo_lab.run.health (`FLAGS`: nan, kl-high, no-signal, length-jump, clipped) that fired
in the run, as recorded, or replayed over its logged steps for a run recorded without them.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.compare.paired import interval, item_outcomes
from grpo_lab.compare.sources import RunRecord, Source
from grpo_lab.config.overrides import as_dict
from grpo_lab.evaluation.ranking import Entry, Ranking, Verdict, from_runs
from grpo_lab.files import write_atomic
from grpo_lab.redact import redact
from grpo_lab.run.summary import HEADLINES

# (column, metrics key in metrics.json / W&B summary, history key)
TRAIN_COLUMNS = tuple((h.column, h.metric, h.key) for h in HEADLINES)


def vary(runs: list[RunRecord]) -> list[str]:
    """Fill `params` from the overrides where runs differ (values typed by Hydra's grammar: `lr=1e-5` -> 1e-05);
    returns the varied parameter names in order."""
    parsed = [as_dict(run.overrides) for run in runs]
    keys: list[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    varied = [k for k in keys if len({repr(p[k]) if k in p else None for p in parsed}) > 1]
    for run, p in zip(runs, parsed, strict=True):
        if not run.params:
            run.params = {k: p[k] for k in varied if k in p}
    names: list[str] = []
    for run in runs:
        names += [k for k in run.params if k not in names]
    return names


def _series(run: RunRecord, key: str) -> list[float]:
    return [float(r[key]) for r in run.history if isinstance(r.get(key), int | float)]


def health(run: RunRecord) -> list[str]:
    """The run's health flags: its recorded events (grpo_lab.run.health, live during training), or, for a run
    recorded before those existed (or one from W&B), the same rules replayed over its history."""
    from grpo_lab.run import health as rules

    if run.health is not None:
        return list(dict.fromkeys(rules.FLAGS[e["rule"]] for e in run.health if e.get("rule") in rules.FLAGS))
    return [event.flag for event in rules.replay(run.history)]


@dataclass
class Board:
    source: Source
    params: list[str]
    rows: list[dict[str, Any]]  # in the ranking's order, best first
    ranking: Ranking
    paired: bool = False  # rows carry intervals and the comparison with the leader (compare/paired.py)

    @property
    def csv_columns(self) -> list[str]:
        """The columns plus the numbers behind `ci95` and `vs_#1`."""
        numbers = ["ci_low", "ci_high", "diff_vs_#1", "diff_ci_low", "diff_ci_high", "p_vs_#1"]
        return self.columns + (numbers if self.paired else [])

    @property
    def columns(self) -> list[str]:
        objectives = self.source.metrics
        return [
            "rank",
            "run",
            "state",
            *objectives,
            *(["ci95", "vs_#1"] if self.paired else []),
            *self.params,
            *(c for c, _, _ in TRAIN_COLUMNS),
            "duration_s",
            "health",
            "wandb",
        ]


def _final(run: RunRecord, metric_key: str, history_key: str) -> float | None:
    value = run.metrics.get(metric_key)
    if value is None:
        series = _series(run, history_key)
        value = series[-1] if series else None
    return value


def build(source: Source) -> Board:
    """The rows in the ranking's order (`grpo_lab.evaluation.ranking`); with one objective, each run's interval and its
    comparison with the leader."""
    params = vary(source.runs)
    metric = source.metrics[0]
    paired = len(source.metrics) == 1
    items = (lambda run: item_outcomes(run, metric)) if paired else None
    ranking = from_runs(source.runs, source.directions, items)
    rows = [_row(rank, entry, source, params) for rank, entry in enumerate(ranking.entries, start=1)]
    if paired:
        for row in rows:
            row |= _versus_columns(row["_entry"], ranking, metric)
    return Board(source=source, params=params, rows=rows, ranking=ranking, paired=paired)


def _row(rank: int, entry: Entry, source: Source, params: list[str]) -> dict[str, Any]:
    run: RunRecord = entry.record
    values = run.values if run.values is not None else [run.objective]
    row: dict[str, Any] = {"rank": rank, "run": entry.name, "state": run.state}
    for metric, value in zip(source.metrics, values + [None] * len(source.metrics), strict=False):
        row[metric] = value
    for name in params:
        row[name] = run.params.get(name)
    for column, metric_key, history_key in TRAIN_COLUMNS:
        row[column] = _final(run, metric_key, history_key)
    row["duration_s"] = run.duration_s
    row["health"] = ",".join(health(run))
    row["wandb"] = run.wandb
    row["_run"] = run
    row["_entry"] = entry
    return row


def _versus_columns(entry: Entry, ranking: Ranking, metric: str) -> dict[str, Any]:
    """`ci95` and `vs_#1` with the numbers behind them (the CSV's extra columns)."""
    run: RunRecord = entry.record
    found = interval(run, metric) if run.objective is not None else None
    versus = entry.versus
    return {
        "ci_low": found[0] if found else None,
        "ci_high": found[1] if found else None,
        "ci95": f"[{found[0]:.2f}, {found[1]:.2f}]" if found and not math.isnan(found[0]) else None,
        "vs_#1": vs_leader(entry, ranking),
        "p_vs_#1": versus.p_value if versus else None,
        "diff_vs_#1": versus.difference if versus else None,
        "diff_ci_low": versus.ci_low if versus else None,
        "diff_ci_high": versus.ci_high if versus else None,
    }


def vs_leader(entry: Entry, ranking: Ranking) -> str | None:
    """The `vs_#1` cell: `leader`, `≈#1 (p=...)` when tied with it, else how far behind and the test's p. With one
    seed per config every config is tied with the leader's: the cell gives the two models' paired difference on
    the same items, which says nothing of their configs."""
    if entry.verdict is Verdict.LEADER:
        return "leader" if ranking.tested else ("best, 1 seed" if ranking.one_seed else None)
    versus = entry.versus
    if entry.verdict is Verdict.UNRANKED:
        return None
    if ranking.one_seed:
        if versus is None or versus.test != "paired":
            return "≈#1 (1 seed)"
        return f"{100 * versus.difference:+.0f} pts (p={versus.p_value:.2g}), ≈#1 (1 seed)"
    if versus is None:
        return None
    if entry.verdict is Verdict.TIED:
        return "≈#1 (too few seeds)" if math.isnan(versus.p_value) else f"≈#1 (p={versus.p_value:.2g})"
    if versus.test == "paired":
        return f"{100 * versus.difference:+.0f} pts (p={versus.p_value:.2g})"
    return f"worse (p={versus.p_value:.2g})"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return redact(str(value))


def as_text(board: Board, *, wandb_column: bool = False) -> str:
    columns = [c for c in board.columns if wandb_column or c != "wandb"]
    cells = [[_cell(row.get(c)) for c in columns] for row in board.rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def heading(board: Board) -> str:
    by = f"by {board.source.metrics[0]} ({board.source.directions[0]})"
    return redact(f"\n== {board.source.label}: {len(board.rows)} runs, {by} ==")


def write_files(board: Board, folder: Path) -> list[Path]:
    """leaderboard.csv and leaderboard.md in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    return [write_csv(board, folder / "leaderboard.csv"), write_markdown(board, folder / "leaderboard.md")]


def write_csv(board: Board, path: Path) -> Path:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(board.csv_columns)
    for row in board.rows:
        writer.writerow(redact(["" if row.get(c) is None else row.get(c) for c in board.csv_columns]))
    write_atomic(path, text.getvalue())  # the workers of one sweep all write it when they end
    return path


def write_markdown(board: Board, path: Path) -> Path:
    columns = board.columns
    lines = [
        f"# Leaderboard: {redact(board.source.label)}",
        "",
        f"Sorted by {board.source.metrics[0]} ({board.source.directions[0]})."
        + (
            " ci95: its 95% interval. vs_#1: each run against the leader on the same held-out items "
            "(exact McNemar p-value); ≈#1: not distinguishable from the leader at 95%."
            if board.paired
            else ""
        ),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(_cell(row.get(c)).replace("|", "\\|") for c in columns) + " |" for row in board.rows]
    write_atomic(path, "\n".join(lines) + "\n")
    return path
