"""The readable end of a run: what was learned, where everything is, what to do next."""

from __future__ import annotations

import math
from typing import Any


def _num(value: Any, digits: int = 3) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}%"


def format_trial(result: Any, number: int, summary_file: Any) -> str:
    """One line per sweep trial (its full summary is in the trial folder): the sweep's table comes last."""
    m = result.metrics
    return (
        f"Trial {number} {result.status}: {result.objective_metric} = {_num(result.objective, 4)}, reward "
        f"{_num(m.get('train/reward_start'))} -> {_num(m.get('train/reward_end'))} over {int(m.get('train/steps', 0))} "
        f"steps, {_num(result.durations.get('total'), 1)} s  ({summary_file})"
    )


def format_run(result: Any) -> str:
    """A short block of text for the end of `python -m grpo_lab` (RunResult -> str)."""
    m = result.metrics
    t = result.tracker
    lines = [
        "",
        f"== grpo_lab run `{result.run_name}`: {result.status} ==",
        f"  reward       {_num(m.get('train/reward_start'))} (first steps) -> {_num(m.get('train/reward_end'))} "
        f"(last steps) over {int(m.get('train/steps', 0))} steps",
        f"  kl (last)    {_num(m.get('train/kl'), 4)}   completion length (last) "
        f"{_num(m.get('train/completions/mean_length'), 1)} tokens",
        f"  accuracy     {_pct(m.get('eval_before/accuracy'))} -> {_pct(m.get('eval_after/accuracy'))} "
        "(held-out, greedy)",
        f"  format       {_pct(m.get('eval_before/format'))} -> {_pct(m.get('eval_after/format'))} (strict tags)",
        f"  objective    {result.objective_metric} = {_num(result.objective, 4)}",
        f"  time         {_num(result.durations.get('total'), 1)} s (train {_num(result.durations.get('train'), 1)} s)",
        f"  run folder   {result.run_dir}",
    ]
    if t.mode == "online":
        lines.append(f"  W&B          {t.url}")
    elif t.mode == "offline":
        lines.append(f"  W&B          offline run in {t.run_path}")
        lines.append(f"               upload it with: {t.sync_command}")
    elif t.mode == "failed":
        lines.append("  W&B          could not start (see the warning above); metrics are in the run folder")
    else:
        lines.append("  W&B          disabled (logger=none); metrics are in the run folder")
    return "\n".join(lines) + "\n"
