"""Word problems: synthetic arithmetic, GSM8K (local files or the Hub) and any JSONL file of prompts.

Rows have ``prompt`` (grpo_lab.data.prompts), ``question`` (the raw question, for logging) and ``answer`` (the
reference answer as a string, ``"42"``, or None when unknown). TRL's GRPOTrainer passes every column but ``prompt``
to the reward functions as keyword arguments, so a reward sees ``answer=[...]`` aligned with its completions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.config import ArithmeticData, Gsm8kData, JsonlData
from grpo_lab.data.prompts import WORKED_EXAMPLES, build_prompt, conversation
from grpo_lab.data.sets import DataParts, Row, load_local, parts, read_jsonl, require, resolve, split
from grpo_lab.errors import DataError
from grpo_lab.models.hub import hub_endpoint, hub_offline, hub_reachable
from grpo_lab.rewards.parsing import normalize_reference, parse_number

_OFFLINE_HINT = (
    "Use local data instead: `data=gsm8k data.path=/path/train.jsonl data.test_path=/path/test.jsonl`, "
    "or the synthetic `data=arithmetic`."
)


def _answer_text(value: Any, where: str) -> str | None:
    """A reference answer as a string: numbers become text (3.0 -> "3"), None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DataError(f"{where}: `answer` must be a string or a number, got {type(value).__name__}.")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def gsm8k_final_answer(solution: Any, where: str = "answer") -> str:
    """GSM8K's reference: the text after ``####``, commas removed (``"... #### 1,234"`` -> ``"1234"``).

    A bare number (already the final answer) is accepted as is. The rules are the rewards' own
    (grpo_lab.rewards.parsing), so that a reference and a completion with the same number always agree.
    """
    text = _answer_text(solution, where)
    gradable = text is not None and ("####" in text or parse_number(text) is not None)
    reference = normalize_reference(text) if gradable else None
    if reference is None:
        raise DataError(f"{where}: a GSM8K answer must end with `#### <number>`, got {solution!r}.")
    return reference


def _gsm8k_row(obj: dict[str, Any], where: str) -> dict[str, Any]:
    require(obj, ("question", "answer"), where)
    question = obj["question"]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: `question` must be a non-empty string, got {question!r}.")
    return {"question": question.strip(), "answer": gsm8k_final_answer(obj["answer"], where)}


def _jsonl_row(obj: dict[str, Any], where: str, cfg: JsonlData) -> dict[str, Any]:
    hint = " (A GSM8K-style file with `question`/`answer` loads with `data=gsm8k data.path=...`.)"
    require(obj, ("prompt",), where, hint if "question" in obj else "")
    prompt = obj["prompt"]
    answer = _answer_text(obj.get("answer"), where)
    if isinstance(prompt, str):
        return {"prompt": build_prompt(prompt, cfg.system_prompt, cfg.num_shots), "question": prompt, "answer": answer}
    if isinstance(prompt, list):
        messages, question = conversation(prompt, cfg.system_prompt, where)
        return {"prompt": messages, "question": question, "answer": answer}
    raise DataError(f"{where}: `prompt` must be a string or a list of messages, got {type(prompt).__name__}.")


def _load_file(path: str, key: str, cfg: Gsm8kData | JsonlData) -> list[Row]:
    resolved = resolve(path, key)
    rows = []
    for lineno, obj in read_jsonl(resolved):
        where = f"{resolved}:{lineno}"
        if isinstance(cfg, JsonlData):
            rows.append(_jsonl_row(obj, where, cfg))
        else:
            row = _gsm8k_row(obj, where)
            rows.append({**row, "prompt": build_prompt(row["question"], cfg.system_prompt, cfg.num_shots)})
    return rows


def _load_local(cfg: Gsm8kData | JsonlData, path: str) -> DataParts:
    return load_local(cfg, path, lambda file, key: _load_file(file, key, cfg))


def _load_hub(cfg: Gsm8kData) -> DataParts:
    """The Hub's test split is the test part; validation is a seeded split of its train split (by eval_fraction)."""
    if cfg.eval_path is not None or cfg.test_path is not None:
        key = "data.eval_path" if cfg.eval_path is not None else "data.test_path"
        raise DataError(f"`{key}` needs `data.path` (the local train file); set both or neither.")
    if hub_offline("HF_DATASETS_OFFLINE") or not hub_reachable():
        endpoint = hub_endpoint()
        raise DataError(
            f"The Hugging Face Hub cannot be reached ({endpoint}) to download `{cfg.hub_id}`. {_OFFLINE_HINT}"
        )
    from datasets import load_dataset

    try:
        splits = load_dataset(cfg.hub_id, cfg.hub_config)
    except Exception as e:  # network, auth, unknown dataset/config: all the user's to fix
        raise DataError(f"Could not load `{cfg.hub_id}` ({cfg.hub_config}) from the Hub: {e}. {_OFFLINE_HINT}") from e
    missing = [s for s in ("train", "test") if s not in splits]
    if missing:
        raise DataError(f"`{cfg.hub_id}` has splits {', '.join(splits)}; needed: train, test.")
    loaded = {}
    for name in ("train", "test"):
        rows = []
        for i, obj in enumerate(splits[name]):
            row = _gsm8k_row(obj, f"{cfg.hub_id}[{name}][{i}]")
            rows.append({**row, "prompt": build_prompt(row["question"], cfg.system_prompt, cfg.num_shots)})
        loaded[name] = rows
    train, held = split(loaded["train"], cfg.seed, f"{cfg.hub_id}[train]", eval=cfg.eval_fraction)
    return parts(train, held["eval"], loaded["test"], cfg)


@dataclass(frozen=True)
class _Template:
    op: str
    text: str  # fields: name, a, b, items, a_items, b_items, a_s, b_s


# Plural item words with their singular, so "1 apple" reads right.
_ITEMS = {
    "apples": "apple",
    "books": "book",
    "marbles": "marble",
    "coins": "coin",
    "stickers": "sticker",
    "pencils": "pencil",
    "cookies": "cookie",
    "shells": "shell",
    "cards": "card",
    "stamps": "stamp",
}


_NAMES = ("Sam", "Maya", "Liam", "Ava", "Noah", "Zoe", "Omar", "Priya", "Lena", "Kai", "Ines", "Tom")


_TEMPLATES = (
    _Template("+", "{name} has {a_items} and buys {b} more. How many {items} does {name} have now?"),
    _Template(
        "+", "{name} collected {a_items} on Monday and {b_items} on Tuesday. How many {items} did {name} collect?"
    ),
    _Template("+", "A box holds {a_items}. {name} adds {b_items} to it. How many {items} are in the box now?"),
    _Template("+", "{name} found {a_items} and then got {b} more from a friend. How many {items} does {name} have?"),
    _Template("-", "{name} has {a_items} and gives away {b}. How many {items} does {name} have left?"),
    _Template("-", "There are {a_items} on the table. {name} takes {b}. How many {items} are still on the table?"),
    _Template("-", "{name} had {a_items} and lost {b}. How many {items} does {name} have now?"),
    _Template("-", "{name} has {a_items} and a friend has {b_items}. How many more {items} does {name} have?"),
    _Template("*", "{name} has {a} bag{a_s} with {b_items} in each. How many {items} does {name} have in total?"),
    _Template("*", "{name} buys {a} pack{a_s} of {items}. Each pack has {b_items}. How many {items} does {name} buy?"),
    _Template("*", "Every day {name} collects {b_items}. How many {items} does {name} collect in {a} day{a_s}?"),
)


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _count(n: int, items: str) -> str:
    return f"{n} {_ITEMS[items] if n == 1 else items}"


def _problem(rng: random.Random, operations: Sequence[str], max_number: int) -> tuple[str, str]:
    """One random ``(question, answer)``; subtraction puts the larger number first, so never negative."""
    op = rng.choice(operations)
    template = rng.choice([t for t in _TEMPLATES if t.op == op])
    name, items = rng.choice(_NAMES), rng.choice(list(_ITEMS))
    a, b = rng.randint(1, max_number), rng.randint(1, max_number)
    if op == "-" and a < b:
        a, b = b, a
    question = template.text.format(
        name=name,
        a=a,
        b=b,
        items=items,
        a_items=_count(a, items),
        b_items=_count(b, items),
        a_s="" if a == 1 else "s",
        b_s="" if b == 1 else "s",
    )
    return question, str(_OPS[op](a, b))


def _capacity(operations: Sequence[str], max_number: int) -> int:
    """How many distinct questions the templates can produce (subtraction only has ordered pairs)."""
    pairs = {"+": max_number**2, "*": max_number**2, "-": max_number * (max_number + 1) // 2}
    per_template = len(_NAMES) * len(_ITEMS)
    return sum(pairs[op] * per_template * sum(t.op == op for t in _TEMPLATES) for op in set(operations))


def _arithmetic_split(cfg: ArithmeticData, split: str, size: int, taken: set[str]) -> list[Row]:
    rng = random.Random(f"arithmetic-{cfg.seed}-{split}")
    rows = []
    while len(rows) < size:
        question, answer = _problem(rng, cfg.operations, cfg.max_number)
        if question in taken:
            continue
        taken.add(question)
        rows.append(
            {"prompt": build_prompt(question, cfg.system_prompt, cfg.num_shots), "question": question, "answer": answer}
        )
    return rows


def _load_arithmetic(cfg: ArithmeticData) -> DataParts:
    sizes = {"train": cfg.train_size, "eval": cfg.eval_size, "test": cfg.test_size}
    if None in sizes.values():
        raise DataError(
            "`data=arithmetic` generates its problems, so it needs every size: set e.g. `data.train_size=1000 "
            "data.eval_size=200 data.test_size=200` (null means 'all', which has no meaning here)."
        )
    unknown = [op for op in cfg.operations if op not in _OPS]
    if unknown or not cfg.operations:
        got = ", ".join(map(repr, unknown)) if unknown else "an empty list"
        raise DataError(f"`data.operations` may hold {', '.join(map(repr, _OPS))}; got {got}.")
    if cfg.max_number < 1:
        raise DataError(f"`data.max_number` must be >= 1, got {cfg.max_number}.")
    # Shot questions are excluded too: a problem the prompt already solves would be a free answer.
    taken = {shot.question for shot in WORKED_EXAMPLES}
    capacity = _capacity(cfg.operations, cfg.max_number) - len(taken)
    if sum(sizes.values()) > capacity:
        raise DataError(
            f"`data=arithmetic` can make only about {capacity} distinct problems with max_number={cfg.max_number} "
            f"and operations {cfg.operations}, fewer than train_size + eval_size + test_size = "
            f"{sum(sizes.values())}. Raise `data.max_number` or lower the sizes."
        )
    # Each part from its own stream, validation first: the validation set depends only on seed and eval_size (the
    # same problems as before there was a test part), the test set on seed, eval_size and test_size, so runs that
    # vary train_size are scored on the same problems. Each part skips every question dealt before it.
    eval_ = _arithmetic_split(cfg, "eval", cfg.eval_size, taken)
    test = _arithmetic_split(cfg, "test", cfg.test_size, taken)
    train = _arithmetic_split(cfg, "train", cfg.train_size, taken)
    return parts(train, eval_, test, cfg)


def load(cfg: ArithmeticData | Gsm8kData | JsonlData) -> DataParts:
    """Build the train, validation and test prompt datasets described by ``cfg`` (see the module docstring)."""
    if isinstance(cfg, ArithmeticData):
        return _load_arithmetic(cfg)
    if isinstance(cfg, Gsm8kData):
        return _load_local(cfg, cfg.path) if cfg.path is not None else _load_hub(cfg)
    if isinstance(cfg, JsonlData):
        return _load_local(cfg, cfg.path)
    raise DataError(f"Unknown data config {type(cfg).__name__}: expected arithmetic, gsm8k or jsonl.")
