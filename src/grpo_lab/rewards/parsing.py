"""Turn a TRL completion into text, pull out the ``<answer>`` and read numbers leniently but safely.

Number grammar (:func:`parse_number`): an optional sign, an optional ``$`` (before or after the sign), digits
with optional thousands separators in groups of three (``1,234``), an optional decimal part and an optional
trailing period (``12.`` as at the end of a sentence). Anything else is not a number: words (``forty``),
units (``12 apples``), fractions (``3/4``), percentages, exponents, ``inf``/``nan``. Being strict here keeps
``correctness`` from rewarding an answer that merely *contains* the right digits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from grpo_lab.errors import RewardError

# A completion as TRL passes it: plain text, or (conversational prompts) a list of messages.
Completion: TypeAlias = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]

# The content of an <answer>...</answer> pair that holds no other <answer>: with plain `.*?`,
# "<answer>1 <answer>2</answer>" would yield "1 <answer>2".
_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)

_NUMBER = re.compile(
    r"(?P<sign1>[+-]?)\$?(?P<sign2>[+-]?)"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))"  # "(?=\.\d)" lets ".5" through with an empty integer part
    r"(?P<frac>\.\d+)?"
    r"\.?"
)


def _message_text(message: Mapping[str, Any]) -> str:
    # A message without a role is taken as the model's own; other roles (user, tool) are not its output.
    if message.get("role", "assistant") != "assistant":
        return ""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Multimodal content: a list of parts such as {"type": "text", "text": "..."}.
    return "".join(part.get("text") or "" for part in content if isinstance(part, Mapping))


def completion_text(completion: Completion) -> str:
    """The text of one completion: the string itself, or the concatenated content of its assistant messages.

    >>> completion_text("<answer>4</answer>")
    '<answer>4</answer>'
    >>> completion_text([{"role": "assistant", "content": "<answer>"}, {"role": "assistant", "content": "4</answer>"}])
    '<answer>4</answer>'
    >>> completion_text({"role": "assistant", "content": None})
    ''
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _message_text(completion)
    if isinstance(completion, Sequence):
        return "".join(_message_text(m) for m in completion if isinstance(m, Mapping))
    raise RewardError(
        f"A completion must be a string or a list of chat messages, got {type(completion).__name__}: {completion!r}"
    )


def extract_answer(text: str) -> str | None:
    """The stripped content of the last closed ``<answer>...</answer>`` pair, or None when there is none.

    >>> extract_answer("<answer>1</answer> on second thought <answer>\\n 2 \\n</answer>")
    '2'
    >>> extract_answer("<answer>42") is None
    True
    """
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


def parse_number(text: str) -> float | None:
    """The number written in ``text``, or None when it is not just a number (see the module docstring).

    >>> parse_number(" -$1,234.50 ")
    -1234.5
    >>> parse_number("12.")
    12.0
    >>> parse_number("12 apples") is None, parse_number("3/4") is None, parse_number("forty") is None
    (True, True, True)
    """
    match = _NUMBER.fullmatch(text.strip().replace("\u2212", "-"))  # U+2212 is the typographic minus
    if match is None or (match["sign1"] and match["sign2"]):
        return None
    sign = match["sign1"] or match["sign2"]
    return float(sign + (match["int"].replace(",", "") or "0") + (match["frac"] or ""))


def normalize_reference(answer: object) -> str | None:
    """A reference answer ready to compare: GSM8K's text after the last ``####``, commas removed, stripped.

    None (no reference) stays None, and so does a reference that is empty once normalized.

    >>> normalize_reference("She has 1,000 + 234 = 1,234 apples.\\n#### 1,234")
    '1234'
    >>> normalize_reference(" 42 ")
    '42'
    >>> normalize_reference(None) is None
    True
    """
    if answer is None:
        return None
    text = str(answer).rpartition("####")[2].replace(",", "").strip()
    return text or None
