"""Answer rewards: is the ``<answer>`` right (against the dataset's ``answer`` column), and is it an integer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_lab.errors import RewardError
from grpo_lab.rewards.parsing import Completion, completion_text, extract_answer, normalize_reference, parse_number

# Optional sign, then digits, with thousands separators only in proper groups of three.
_INTEGER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")


def _is_correct(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    expected = parse_number(reference)
    if expected is None:
        # A non-numeric reference ("Paris") is compared as text, with commas dropped on both sides
        # as normalize_reference drops them from the reference.
        return predicted.replace(",", "").strip() == reference
    return parse_number(predicted) == expected


def correctness(
    completions: Sequence[Completion], answer: Sequence[str | None] | None = None, **kwargs: Any
) -> list[float | None]:
    """1.0 when the last ``<answer>`` equals the reference (numerically when it is a number), else 0.0.

    None (not applicable) for a sample whose reference is None, and for every sample when the dataset
    has no ``answer`` column at all.

    >>> correctness(["<answer>\\n$1,234\\n</answer>", "<answer>1235</answer>", "<answer>7</answer>"],
    ...             answer=["#### 1,234", "1234", None])
    [1.0, 0.0, None]
    """
    if answer is None:
        return [None] * len(completions)
    if isinstance(answer, str) or len(answer) != len(completions):
        raise RewardError(
            f"correctness needs one reference `answer` per completion ({len(completions)}), got {answer!r}"
        )
    scores: list[float | None] = []
    for completion, raw_reference in zip(completions, answer, strict=True):
        reference = normalize_reference(raw_reference)
        if reference is None:
            scores.append(None)
            continue
        predicted = extract_answer(completion_text(completion))
        scores.append(1.0 if _is_correct(predicted, reference) else 0.0)
    return scores


def int_answer(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """1.0 when the last ``<answer>`` is an integer literal (sign and ``1,234``-style commas allowed), else 0.0.

    ``$12`` and ``12.0`` do not count: this rewards the bare form the prompt asks for.

    >>> int_answer(["<answer> -1,234 </answer>", "<answer>12.5</answer>", "<answer>forty</answer>", "42"])
    [1.0, 0.0, 0.0, 0.0]
    """
    scores: list[float | None] = []
    for completion in completions:
        predicted = extract_answer(completion_text(completion))
        scores.append(1.0 if predicted is not None and _INTEGER.fullmatch(predicted) else 0.0)
    return scores
