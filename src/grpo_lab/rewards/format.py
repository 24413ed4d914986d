"""Format rewards: how closely a completion follows the ``<reasoning>``/``<answer>`` layout the system prompt asks for.

The expected layout::

    <reasoning>
    ...
    </reasoning>
    <answer>
    42
    </answer>
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_lab.errors import RewardError
from grpo_lab.rewards.parsing import Completion, completion_text

_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
_STRICT = re.compile(r"<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>", re.DOTALL)
_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
# xmlcount's four tags, with the newlines the layout puts around them.
_XML_PIECES = ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>")
# Per character after </answer>: enough to prefer stopping there, too little to outweigh a tag.
TRAILING_PENALTY = 0.001


def strict_format(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion is exactly the expected layout (only surrounding whitespace allowed), else 0.0.

    Each tag must appear once: a second ``<answer>`` hidden inside the reasoning fails.

    >>> strict_format(["<reasoning>\\nstep 1\\nstep 2\\n</reasoning>\\n<answer>\\n42\\n</answer>\\n",
    ...                "<reasoning>step</reasoning>\\n<answer>\\n42\\n</answer>",
    ...                "Sure! <reasoning>\\nstep\\n</reasoning>\\n<answer>\\n42\\n</answer>"])
    [1.0, 0.0, 0.0]
    """
    scores: list[float | None] = []
    for completion in completions:
        text = completion_text(completion).strip()
        ok = _STRICT.fullmatch(text) is not None and all(text.count(tag) == 1 for tag in _TAGS)
        scores.append(1.0 if ok else 0.0)
    return scores


def soft_format(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion contains ``<reasoning>...</reasoning>`` then ``<answer>...</answer>``, else 0.0.

    Any spacing, and text before or after, is allowed.

    >>> soft_format(["Sure! <reasoning>step</reasoning> <answer>42</answer> Done.", "<answer>42</answer>"])
    [1.0, 0.0]
    """
    return [1.0 if _SOFT.search(completion_text(c)) else 0.0 for c in completions]


def _xml_score(text: str) -> float:
    score = float(sum(text.count(piece) == 1 for piece in _XML_PIECES))
    if "</answer>" in text:
        # Whitespace after the closing tag (a final newline) is free; anything else costs.
        trailing = text.rpartition("</answer>")[2].strip()
        score -= TRAILING_PENALTY * len(trailing)
    return max(0.0, score)


def xmlcount(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """0..4: one point for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``, ``\\n<answer>\\n``, ``\\n</answer>``
    found exactly once, minus 0.001 per character after the last ``</answer>``.

    Whitespace around that trailing text is not counted, so a final newline is free.

    The score is floored at 0. A partial layout earns partial credit, which gives GRPO a gradient
    toward the format before the model ever writes it fully.

    >>> xmlcount(["<reasoning>\\nstep\\n</reasoning>\\n<answer>\\n42\\n</answer>\\n",
    ...           "<reasoning>\\nstep\\n</reasoning>\\n<answer>\\n42\\n</answer>\\nThe end.",
    ...           "<reasoning>\\nstep"])
    [4.0, 3.992, 1.0]
    """
    return [_xml_score(completion_text(c)) for c in completions]


def regex_format(completions: Sequence[Completion], pattern: str, **kwargs: Any) -> list[float | None]:
    """1.0 when the whole stripped completion matches ``pattern`` (``re.DOTALL``), else 0.0.

    >>> regex_format(["  <answer>42</answer>\\n", "<answer>42</answer> and more"], pattern=r"<answer>\\d+</answer>")
    [1.0, 0.0]
    """
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except (re.error, TypeError) as exc:
        raise RewardError(f"regex_format: invalid pattern {pattern!r}: {exc}") from exc
    return [1.0 if compiled.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]
