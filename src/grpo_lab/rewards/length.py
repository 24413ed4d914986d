"""Length reward: 1 at an ideal length, falling linearly to 0 at zero length and at twice the ideal."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grpo_lab.errors import RewardError
from grpo_lab.rewards.parsing import Completion, completion_text

UNITS = ("tokens", "chars")


def length(
    completions: Sequence[Completion],
    ideal_length: float,
    completion_ids: Sequence[Sequence[int]] | None = None,
    unit: str = "tokens",
    **kwargs: Any,
) -> list[float | None]:
    """``max(0, 1 - |n - ideal_length| / ideal_length)``, n being the completion's length in ``unit``.

    ``unit="tokens"`` counts ``completion_ids`` (TRL always passes them); ``unit="chars"`` counts the characters
    of the completion's text.

    >>> length(["abcd", "abcdefgh", "a" * 20], ideal_length=8, unit="chars")
    [0.5, 1.0, 0.0]
    >>> length(["a", "b"], ideal_length=4, completion_ids=[[1, 2, 3], [1, 2, 3, 4]])
    [0.75, 1.0]
    """
    valid = isinstance(ideal_length, int | float) and not isinstance(ideal_length, bool)
    if not (valid and math.isfinite(ideal_length) and ideal_length > 0):
        raise RewardError(f"length: `ideal_length` must be a positive number, got {ideal_length!r}")
    if unit == "tokens":
        if completion_ids is None:
            raise RewardError("length: unit='tokens' needs `completion_ids` (TRL passes them; or use unit='chars')")
        if len(completion_ids) != len(completions):
            raise RewardError(f"length: got {len(completion_ids)} `completion_ids` for {len(completions)} completions")
        sizes = [len(ids) for ids in completion_ids]
    elif unit == "chars":
        sizes = [len(completion_text(c)) for c in completions]
    else:
        raise RewardError(f"length: unknown unit {unit!r}, expected one of {', '.join(UNITS)}")
    return [max(0.0, 1.0 - abs(n - ideal_length) / ideal_length) for n in sizes]
