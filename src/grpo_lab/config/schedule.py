"""Reward weights that change over training: `reward.schedule.<name>`, checked before any model loads.

A schedule is piecewise linear in training progress (a fraction of `max_steps`, or steps with
`reward.schedule_unit=steps`), through points `[[x, weight], ...]` with x strictly increasing; before its first point a
reward has weight 0 (it enters later), after its last it keeps the last weight. A schedule may also be written as a
ramp, the form a sweep sets one number of: `{start: 0.5, end: 0.8, from: 0.2, to: 0.5}` is
`[[0, 0.5], [0.2, 0.5], [0.5, 0.8]]` (`start` holds until `from`, default 0; `end` is reached at `to`, default 1).
A reward without a schedule keeps `reward.weights.<name>`.

The rules (each broken one is one line, naming the key): a scheduled reward must be a reward of `reward.functions`
(the nearest name is offered); points in order and inside [0, 1] (or [0, max_steps]); no negative weight; and at no
point of training are all the weights 0 (GRPO would learn from nothing there). A scheduled reward's weight is its
schedule's: TRL starts from where the schedule starts (:func:`start_weights`); `reward.weights.<name>` is refused
only when the user (or a sweep) gives it beside the schedule and they disagree (grpo_lab.config.rules).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from grpo_lab.config.problems import Problem, fail, unknown_key

_RAMP = "{start: W, end: W, from: X, to: X}"
_POINTS = f"must be a list of [x, weight] points, e.g. [[0, 0.5], [0.5, 0.8]], or a ramp {_RAMP}"


@dataclass(frozen=True)
class Schedule:
    """Each reward's weight at any step: scheduled ones from their points, the others fixed."""

    names: tuple[str, ...]  # the rewards, in TRL's reward_weights order
    fixed: dict[str, float]
    points: dict[str, tuple[tuple[float, float], ...]]  # name -> ((progress, weight), ...), progress in [0, 1]

    def __bool__(self) -> bool:
        return bool(self.points)

    def weight(self, name: str, progress: float) -> float:
        """`name`'s weight at `progress` (0 at the first step, 1 at max_steps)."""
        if name not in self.points:
            return self.fixed[name]
        points = self.points[name]
        if progress < points[0][0]:
            return 0.0
        for (x0, w0), (x1, w1) in pairwise(points):
            if x0 <= progress <= x1:
                return w0 + (w1 - w0) * (progress - x0) / (x1 - x0)
        return points[-1][1]

    def weights(self, progress: float) -> list[float]:
        """TRL's `reward_weights` at `progress`."""
        return [self.weight(name, progress) for name in self.names]

    def at_step(self, step: int, max_steps: int) -> list[float]:
        """The weights of the step that starts after `step` completed steps."""
        return self.weights(step / max_steps)

    def last(self, max_steps: int) -> list[float]:
        """The weights of the last step (progress (max_steps - 1) / max_steps: 1.0 itself is never trained)."""
        return self.at_step(max_steps - 1, max_steps)

    def describe(self) -> list[str]:
        """One line per scheduled reward, e.g. `strict_format 0.5 -> 0.8 (0% -> 50%)`."""
        lines = []
        for name, points in self.points.items():
            weights = " -> ".join(f"{w:g}" for _, w in points)
            where = " -> ".join(f"{100 * x:.0f}%" for x, _ in points)
            entry = "" if points[0][0] == 0 else f", 0 before {100 * points[0][0]:.0f}%"
            lines.append(f"{name} {weights} ({where}{entry})")
        return lines

    def record(self) -> dict[str, list[list[float]]]:
        """For metrics.json: each scheduled reward's points, as fractions of max_steps."""
        return {name: [list(p) for p in points] for name, points in self.points.items()}


def _as_points(value: Any, key: str) -> list[tuple[float, float]]:
    """A schedule's points from its list form or its ramp form (see the module docstring)."""
    if isinstance(value, Mapping):
        extra = sorted(set(value) - {"start", "end", "from", "to"})
        if extra or "start" not in value or "end" not in value:
            raise fail(Problem(key, "rule", dict(value), f"must be [[x, weight], ...] or a ramp {_RAMP}"))
        start, end = value.get("from", 0.0), value.get("to", 1.0)
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (start, end)) or not start < end:
            raise fail(Problem(key, "rule", dict(value), "a ramp's `from` must be a number below its `to`"))
        # `start` holds until `from`, then moves linearly to `end` at `to`.
        return [(0.0, value["start"]), *([(start, value["start"])] if start > 0 else []), (end, value["end"])]
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        points = []
        for point in value:
            if not (isinstance(point, Sequence) and not isinstance(point, str) and len(point) == 2):
                raise fail(Problem(key, "rule", value, _POINTS))
            points.append((point[0], point[1]))
        return points
    raise fail(Problem(key, "rule", value, _POINTS))


def build(
    functions: Sequence[str],
    weights: Mapping[str, float],
    schedule: Mapping[str, Any],
    unit: str,
    max_steps: int,
) -> Schedule:
    """The run's Schedule from `reward.functions`, `reward.weights`, `reward.schedule` and its unit; raises a
    one-line ConfigError for any rule of the module docstring."""
    names = tuple(functions)
    points: dict[str, tuple[tuple[float, float], ...]] = {}
    for name, value in schedule.items():
        key = f"reward.schedule.{name}"
        if name not in names:
            raise fail(unknown_key("reward.schedule", name, list(names)))
        raw = _as_points(value, key)
        for x, w in raw:
            if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (x, w)):
                raise fail(Problem(key, "rule", [list(p) for p in raw], "the points must hold finite numbers only"))
        scale = max_steps if unit == "steps" else 1.0
        limit = "max_steps" if unit == "steps" else "1 (a fraction of max_steps; steps: reward.schedule_unit=steps)"
        if any(not 0 <= x <= scale for x, _ in raw):
            raise fail(Problem(key, "range", [list(p) for p in raw], f"have every x between 0 and {limit}"))
        if any(b[0] <= a[0] for a, b in pairwise(raw)):
            raise fail(Problem(key, "rule", [list(p) for p in raw], "the points' x must increase strictly"))
        if any(w < 0 for _, w in raw):
            raise fail(Problem(key, "range", [list(p) for p in raw], "have no negative weight"))
        points[name] = tuple((x / scale, float(w)) for x, w in raw)
    result = Schedule(names, {n: float(weights[n]) for n in names if n in weights}, points)
    _check_never_all_zero(result, max_steps)
    return result


def of_run(run: Any) -> Schedule:
    """The run's reward weights over training (falsy without `reward.schedule`)."""
    reward = run.reward
    return build(list(reward.functions), reward.weights, reward.schedule, reward.schedule_unit, run.max_steps)


def start_weights(reward: Any) -> list[float]:
    """TRL's `reward_weights` at the first step, in `reward.functions`' order: a scheduled reward's is where its
    schedule starts, the others' their `reward.weights` (the schedule's rules are checked elsewhere: a schedule
    that does not parse starts at its reward's weight here)."""
    starts: dict[str, float] = {}
    for name, value in reward.schedule.items():
        try:
            first_x, first_w = _as_points(value, f"reward.schedule.{name}")[0]
            starts[name] = float(first_w) if first_x == 0 else 0.0
        except Exception:  # checked, and refused in one line, by the schedule rule
            continue
    return [starts.get(name, reward.weights.get(name, 0.0)) for name in reward.functions]


def _check_never_all_zero(schedule: Schedule, max_steps: int) -> None:
    """At every step training takes (progress k / max_steps, k < max_steps), some weight is not 0."""
    if not schedule:
        return
    for x in (k / max_steps for k in range(max_steps)):
        if all(w == 0 for w in schedule.weights(x)):
            raise fail(
                Problem(
                    "reward.schedule",
                    "rule",
                    must=f"at {100 * x:.0f}% of training every weight is 0 and GRPO would learn from nothing: leave "
                    f"some reward a non-zero weight at every step",
                )
            )


__all__ = ["Schedule", "build", "of_run", "start_weights"]
