"""The prompt every source's rows carry: a conversation of the system prompt, worked examples and the question.

Every row's ``prompt`` is a list of ``{"role", "content"}`` messages: the system prompt, then ``num_shots`` worked
examples as earlier user/assistant turns, then the user question (or, from a file of conversations, the file's own
turns). TRL's GRPOTrainer renders it with the model's chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.errors import DataError

Message = dict[str, str]


@dataclass(frozen=True)
class WorkedExample:
    """A few-shot example: a question, the reasoning and the final answer of a correct solution."""

    question: str
    reasoning: str
    answer: str

    def completion(self) -> str:
        """The assistant's turn."""
        return format_completion(self.reasoning, self.answer)


def format_completion(reasoning: str, answer: str) -> str:
    """A completion in the target format: ``<reasoning>`` then ``<answer>`` blocks, each on its own lines."""
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{answer}\n</answer>"


# The same shots for every dataset, written by hand (not drawn from GSM8K, so they cannot leak its test
# set). The first ones are as easy as the arithmetic problems; the later ones are multi-step like GSM8K.
WORKED_EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample(
        "Sam has 7 apples and buys 5 more. How many apples does Sam have now?",
        "Sam starts with 7 apples and buys 5 more, so 7 + 5 = 12.",
        "12",
    ),
    WorkedExample(
        "A shelf holds 23 books. Maya takes 8 of them to school. How many books are left on the shelf?",
        "The shelf starts with 23 books and Maya takes 8 away, so 23 - 8 = 15.",
        "15",
    ),
    WorkedExample(
        "Liam buys 4 packs of stickers. Each pack has 6 stickers. How many stickers does Liam buy?",
        "Liam buys 4 packs with 6 stickers in each, so 4 * 6 = 24.",
        "24",
    ),
    WorkedExample(
        "A baker makes 36 muffins. She sells 20 of them in the morning and half of the rest in the afternoon. "
        "How many muffins does she have left?",
        "After the morning she has 36 - 20 = 16 muffins. In the afternoon she sells half of them, 16 / 2 = 8, "
        "so 16 - 8 = 8 muffins are left.",
        "8",
    ),
    WorkedExample(
        "Tickets to a fair cost $5 for a child and $8 for an adult. How much does a family of 2 adults and "
        "3 children pay?",
        "The adults pay 2 * 8 = 16 dollars and the children pay 3 * 5 = 15 dollars, so the family pays "
        "16 + 15 = 31 dollars.",
        "31",
    ),
    WorkedExample(
        "Ava reads 12 pages every day. Her book has 180 pages. How many days does it take Ava to finish the book?",
        "Ava reads 12 pages a day, so she needs 180 / 12 = 15 days.",
        "15",
    ),
    WorkedExample(
        "A garden has 5 rows of tomato plants with 9 plants in each row. Then 7 plants die. How many tomato "
        "plants are left?",
        "The garden starts with 5 * 9 = 45 plants. After 7 die, 45 - 7 = 38 plants are left.",
        "38",
    ),
    WorkedExample(
        "Noah had $50. He spent $18 on a game and $12 on lunch. How much money does Noah have left?",
        "Noah spent 18 + 12 = 30 dollars, so he has 50 - 30 = 20 dollars left.",
        "20",
    ),
)


def build_prompt(
    question: str, system_prompt: str, num_shots: int, shots: Sequence[WorkedExample] = WORKED_EXAMPLES
) -> list[Message]:
    """The conversation for one question: system prompt, ``num_shots`` of the worked ``shots``, then the question.

    An empty system prompt adds no system message (a blank one only changes what some chat templates render).
    """
    if not 0 <= num_shots <= len(shots):
        raise DataError(
            f"`data.num_shots` must be between 0 and {len(shots)} "
            f"(the number of built-in worked examples), got {num_shots}."
        )
    messages: list[Message] = []
    if system_prompt.strip():
        messages.append({"role": "system", "content": system_prompt})
    for shot in shots[:num_shots]:
        messages.append({"role": "user", "content": shot.question})
        messages.append({"role": "assistant", "content": shot.completion()})
    messages.append({"role": "user", "content": question})
    return messages


def _messages(value: list[Any], where: str) -> list[Message]:
    """Validate a conversation; only ``role`` and ``content`` are kept (the columns TRL renders)."""
    messages: list[Message] = []
    for i, msg in enumerate(value):
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            raise DataError(f"{where}: prompt[{i}] must be a {{'role': str, 'content': str}} message, got {msg!r}.")
        messages.append({"role": msg["role"], "content": msg["content"]})
    if not messages:
        raise DataError(f"{where}: `prompt` is an empty list of messages.")
    return messages


def conversation(prompt: list[Any], system_prompt: str, where: str) -> tuple[list[Message], str]:
    """A file's ready conversation and its question (the last user turn): the file owns its turns, so no shots; only
    a missing system prompt is added."""
    messages = _messages(prompt, where)
    if system_prompt.strip() and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    users = [m["content"] for m in messages if m["role"] == "user"]
    return messages, users[-1] if users else messages[-1]["content"]
