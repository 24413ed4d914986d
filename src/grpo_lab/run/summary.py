"""The readable end of a run: what was learned, where everything is, what to do next."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_lab.evaluation.stats import ALPHA, detectable_difference


@dataclass(frozen=True)
class Headline:
    """A training metric that every view of a run shows first (progress bar, leaderboard, curves, W&B)."""

    key: str  # TRL's log key: a history.jsonl row's key
    column: str  # the leaderboard's column
    short: str  # beside the progress bar
    title: str  # the training curve's title

    @property
    def metric(self) -> str:
        """The key in metrics.json's `metrics` and in the W&B run (summary and history)."""
        return f"train/{self.key}"


HEADLINES = (
    Headline("reward", "reward", "reward", "reward"),
    Headline("reward_std", "reward_std", "std", "reward std"),
    Headline("kl", "kl", "kl", "KL to the reference"),
    Headline("completions/mean_length", "length", "len", "mean completion length (tokens)"),
)


def _num(value: Any, digits: int = 3) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}%"


def _with_ci(m: dict[str, Any], prefix: str, name: str) -> str:
    """`21.9% [11%, 39%]`: the value and its 95% interval (when recorded)."""
    value = _pct(m.get(f"{prefix}/{name}"))
    low, high = m.get(f"{prefix}/{name}_ci_low"), m.get(f"{prefix}/{name}_ci_high")
    if value == "-" or not isinstance(low, int | float) or not isinstance(high, int | float):
        return value
    return f"{value} [{100 * low:.0f}%, {100 * high:.0f}%]"


def _items(m: dict[str, Any], part: str = "eval") -> str:
    """`, 32 items: differences under ~24 pts are noise`: what the part's size can tell apart."""
    n = m.get(f"{part}_after/num_samples") or m.get(f"{part}_before/num_samples")
    if not isinstance(n, int | float) or n <= 0:
        return ""
    return f", {int(n)} items: differences under ~{100 * detectable_difference(int(n)):.0f} pts are noise"


def _change(m: dict[str, Any], name: str, part: str = "eval") -> list[str]:
    """The paired change before -> after on the same items, when both evaluations ran."""
    key = f"{part}_change/{name}"
    if not isinstance(m.get(key), int | float) or math.isnan(m[key]):
        return []
    if f"{key}_p_value" not in m:  # a sampled pass@k: the mean of per-item changes, with its t-interval
        return [
            f"               change {100 * m[key]:+.1f} pts [{100 * m[f'{key}_ci_low']:+.0f}, "
            f"{100 * m[f'{key}_ci_high']:+.0f}] (mean of the items' paired changes)"
        ]
    p = m[f"{key}_p_value"]
    verdict = "a real change at 95%" if p < ALPHA else "not distinguishable from no change"
    return [
        f"               change {100 * m[key]:+.1f} pts [{100 * m[f'{key}_ci_low']:+.0f}, "
        f"{100 * m[f'{key}_ci_high']:+.0f}], McNemar p = {p:.2g} ({int(m[f'{key}_gained'])} items gained, "
        f"{int(m[f'{key}_lost'])} lost): {verdict}"
    ]


def _graders(m: dict[str, Any]) -> list[str]:
    """The graders' names in the order the evaluations recorded them (every grader has an interval)."""
    names = [k.partition("/")[2].removesuffix("_ci_low") for k in m if k.endswith("_ci_low")]
    found = [n for n in names if f"eval_before/{n}_ci_low" in m or f"eval_after/{n}_ci_low" in m]
    return list(dict.fromkeys(found))


def _graded(m: dict[str, Any]) -> list[str]:
    """Per grader, before -> after with intervals and the paired change, on validation (which choices read) and,
    where graded, on test (which only reports); each part's first line says what was evaluated."""
    lines: list[str] = []
    tested = any(k.startswith(("test_before/", "test_after/")) for k in m)
    for i, name in enumerate(_graders(m)):
        note = f" (validation, greedy{_items(m)})" if i == 0 else ""
        lines += [f"  {name:<12} {_with_ci(m, 'eval_before', name)} -> {_with_ci(m, 'eval_after', name)}{note}"]
        lines += _change(m, name)
        if tested:
            note = f" (test{_items(m, 'test')}; reported, no choice read it)" if i == 0 else ""
            lines += [
                f"  {'  on test':<12} {_with_ci(m, 'test_before', name)} -> {_with_ci(m, 'test_after', name)}{note}"
            ]
            lines += _change(m, name, "test")
    return lines


def _kept(m: dict[str, Any]) -> list[str]:
    """output.keep=best|top_k: which step's model the run ended with, and what its numbers are worth."""
    step, candidates = m.get("keep/step"), m.get("keep/candidates")
    if not isinstance(step, int | float) or not isinstance(candidates, int | float):
        return []
    return [
        f"  kept         step {int(step)}, the best of {int(candidates)} evaluations during training (output.keep): "
        "the final evaluations grade its model; its validation number is the best of several, biased upward; "
        "the test part's is not"
    ]


def _health(events: list[dict[str, Any]]) -> list[str]:
    """One line per health event (grpo_lab.run.health), or that nothing fired."""
    if not events:
        return ["  health       ok (no health rule fired)"]
    return [f"  {'health' if i == 0 else '':<12} {e['action']}: {e['message']}" for i, e in enumerate(events)]


def _schedule(history: list[dict[str, Any]]) -> list[str]:
    """The reward weights a schedule moved (reward.schedule), as they were applied: first step -> last step."""
    first = history[0] if history else {}
    names = [k.removeprefix("reward_weights/") for k in first if k.startswith("reward_weights/")]
    moved = []
    for name in names:
        values = [row[f"reward_weights/{name}"] for row in history if f"reward_weights/{name}" in row]
        if len(set(values)) > 1:
            moved.append(f"{name} {values[0]:g} -> {values[-1]:g}")
    if not moved:
        return []
    steps = f"(steps {history[0]['step']} -> {history[-1]['step']})"
    return [f"  weights      {', '.join(moved)} {steps}, as scheduled (reward.schedule)"]


def _sandbox(m: dict[str, Any]) -> list[str]:
    """Where the code rewards ran model-written code, when they did (reward.sandbox)."""
    isolated = m.get("sandbox/isolated")
    if isolated is None:
        return []
    if isolated:
        return ["  sandbox      bubblewrap: model-written code ran isolated (no network, read-only system)"]
    return [
        "  sandbox      NOT ISOLATED: model-written code ran with rlimits only (reward.sandbox.isolation=rlimits); "
        "it could reach the network and this user's files"
    ]


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
        *_schedule(result.history),
        *_graded(m),
        *_kept(m),
        f"  objective    {result.objective_metric} = {_num(result.objective, 4)}",
        *_health(result.health),
        *_sandbox(m),
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
