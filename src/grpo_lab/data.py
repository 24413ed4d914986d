"""Prompt datasets for GRPO: synthetic arithmetic, GSM8K (local files or the Hub) and any JSONL file.

``load_datasets(cfg)`` returns a :class:`DatasetPair` whose rows all have the same three columns:

* ``prompt``: a conversation (list of ``{"role", "content"}`` messages): the system prompt, then
  ``num_shots`` worked examples as earlier user/assistant turns, then the user question;
* ``question``: the raw question text (for logging);
* ``answer``: the reference answer as a string (``"42"``), or None when unknown.

TRL's GRPOTrainer passes every column but ``prompt`` to the reward functions as keyword arguments, so a
reward sees ``answer=[...]`` aligned with its completions.

``datasets`` is imported inside functions: it costs about a second to import, and config-only commands
(`--cfg job`, `--help`, validation) should not pay for it.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab.config import ArithmeticData, CodeJsonlData, DataConfig, Gsm8kData, HumanEvalData, JsonlData
from grpo_lab.errors import DataError
from grpo_lab.hub import hub_endpoint, hub_offline, hub_reachable
from grpo_lab.rewards.parsing import normalize_reference, parse_number

if TYPE_CHECKING:
    from datasets import Dataset, Features

log = logging.getLogger(__name__)

Message = dict[str, str]
Row = dict[str, Any]  # prompt, question, answer

_OFFLINE_HINT = (
    "Use local data instead: `data=gsm8k data.path=/path/train.jsonl data.eval_path=/path/test.jsonl`, "
    "or the synthetic `data=arithmetic`."
)


@dataclass(frozen=True)
class DatasetPair:
    """The train and held-out eval splits, each with ``prompt``, ``question`` and ``answer`` columns."""

    train: Dataset
    eval: Dataset


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


# ---------------------------------------------------------------------------------------------- prompts
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


def _features() -> Features:
    """Fixed column types, so an all-None ``answer`` column is still a string column."""
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"prompt": List(message), "question": Value("string"), "answer": Value("string")})


def _to_dataset(rows: list[Row], features: Features | None = None) -> Dataset:
    from datasets import Dataset

    features = features or _features()
    columns = {name: [row[name] for row in rows] for name in features}
    return Dataset.from_dict(columns, features=features)


def _cap(rows: list[Row], size: int | None, seed: int, split: str) -> list[Row]:
    """At most ``size`` rows, drawn after a seeded shuffle; None keeps every row in file order."""
    if size is None:
        return rows
    if size > len(rows):
        log.warning("data.%s_size=%d but only %d %s rows exist; using all of them.", split, size, len(rows), split)
        return rows
    shuffled = list(rows)
    random.Random(f"{split}-subset-{seed}").shuffle(shuffled)
    return shuffled[:size]


def _split(rows: list[Row], eval_fraction: float, seed: int, source: str) -> tuple[list[Row], list[Row]]:
    """A seeded train/eval split holding out ``eval_fraction`` of the rows (at least one in each part)."""
    n = len(rows)
    if n < 2:
        raise DataError(
            f"{source} has {n} row(s): splitting off an eval set needs at least 2. "
            "Add rows or give a separate held-out file with `data.eval_path=...`."
        )
    n_eval = min(max(1, round(n * eval_fraction)), n - 1)
    # Own RNG, independent of the one behind train_size/eval_size, so changing a size keeps the split.
    order = list(range(n))
    random.Random(f"split-{seed}").shuffle(order)
    held_out = set(order[:n_eval])
    # File order is kept inside each part.
    return [r for i, r in enumerate(rows) if i not in held_out], [r for i, r in enumerate(rows) if i in held_out]


def _pair(train: list[Row], eval_: list[Row], cfg: DataConfig, features: Features | None = None) -> DatasetPair:
    """Apply the size caps and build the two datasets (rows stay plain Python until here: it is faster)."""
    return DatasetPair(
        _to_dataset(_cap(train, cfg.train_size, cfg.seed, "train"), features),
        _to_dataset(_cap(eval_, cfg.eval_size, cfg.seed, "eval"), features),
    )


# ----------------------------------------------------------------------------------------------- files
def _resolve(path: str, key: str) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        what = "is a directory, not a file" if resolved.is_dir() else "does not exist"
        raise DataError(
            f"`{key}={path}` {what}. Relative paths are resolved against the current directory "
            f"({Path.cwd()}), giving {resolved.absolute()}; pass an absolute path, e.g. `{key}=/abs/path/file.jsonl`."
        )
    return resolved


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; malformed lines name their number."""
    found = False
    lineno = 0
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno}).") from e
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{lineno}: each line must be a JSON object, got {type(obj).__name__}.")
                found = True
                yield lineno, obj
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason} at byte {e.start}).") from e
    except OSError as e:  # gone, unreadable or on a failing disk since it was checked
        raise DataError(f"Cannot read {path}: {e.strerror or e}.") from e
    if not found:
        raise DataError(f"{path} is empty: it has no JSON lines.")


def _require(obj: dict[str, Any], needed: Sequence[str], where: str, extra: str = "") -> None:
    missing = [c for c in needed if c not in obj]
    if missing:
        found = ", ".join(sorted(obj)) or "none"
        raise DataError(
            f"{where}: missing column(s) {', '.join(missing)}; found: {found}; needed: {', '.join(needed)}.{extra}"
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
    _require(obj, ("question", "answer"), where)
    question = obj["question"]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: `question` must be a non-empty string, got {question!r}.")
    return {"question": question.strip(), "answer": gsm8k_final_answer(obj["answer"], where)}


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


def _jsonl_row(obj: dict[str, Any], where: str, cfg: JsonlData) -> dict[str, Any]:
    hint = " (A GSM8K-style file with `question`/`answer` loads with `data=gsm8k data.path=...`.)"
    _require(obj, ("prompt",), where, hint if "question" in obj else "")
    prompt = obj["prompt"]
    answer = _answer_text(obj.get("answer"), where)
    if isinstance(prompt, str):
        return {"prompt": build_prompt(prompt, cfg.system_prompt, cfg.num_shots), "question": prompt, "answer": answer}
    if isinstance(prompt, list):
        messages, question = conversation(prompt, cfg.system_prompt, where)
        return {"prompt": messages, "question": question, "answer": answer}
    raise DataError(f"{where}: `prompt` must be a string or a list of messages, got {type(prompt).__name__}.")


def _load_file(path: str, key: str, cfg: Gsm8kData | JsonlData) -> list[Row]:
    resolved = _resolve(path, key)
    rows = []
    for lineno, obj in _read_jsonl(resolved):
        where = f"{resolved}:{lineno}"
        if isinstance(cfg, JsonlData):
            rows.append(_jsonl_row(obj, where, cfg))
        else:
            row = _gsm8k_row(obj, where)
            rows.append({**row, "prompt": build_prompt(row["question"], cfg.system_prompt, cfg.num_shots)})
    return rows


def _load_local(cfg: Gsm8kData | JsonlData, path: str) -> DatasetPair:
    """``path`` (+ ``eval_path``, or a seeded split by ``eval_fraction``), then the size caps."""
    train = _load_file(path, "data.path", cfg)
    if cfg.eval_path is not None:
        eval_ = _load_file(cfg.eval_path, "data.eval_path", cfg)
    else:
        train, eval_ = _split(train, cfg.eval_fraction, cfg.seed, path)
    return _pair(train, eval_, cfg)


# ------------------------------------------------------------------------------------------------- hub
def _load_hub(cfg: Gsm8kData) -> DatasetPair:
    if cfg.eval_path is not None:
        raise DataError("`data.eval_path` needs `data.path` (the local train file); set both or neither.")
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
    pair = []
    for split in ("train", "test"):
        rows = []
        for i, obj in enumerate(splits[split]):
            row = _gsm8k_row(obj, f"{cfg.hub_id}[{split}][{i}]")
            rows.append({**row, "prompt": build_prompt(row["question"], cfg.system_prompt, cfg.num_shots)})
        pair.append(rows)
    return _pair(pair[0], pair[1], cfg)


# ------------------------------------------------------------------------------------------ arithmetic
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


def _load_arithmetic(cfg: ArithmeticData) -> DatasetPair:
    if cfg.train_size is None or cfg.eval_size is None:
        raise DataError(
            "`data=arithmetic` generates its problems, so it needs both sizes: "
            "set e.g. `data.train_size=1000 data.eval_size=200` (null means 'all', which has no meaning here)."
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
    if cfg.train_size + cfg.eval_size > capacity:
        raise DataError(
            f"`data=arithmetic` can make only about {capacity} distinct problems with max_number={cfg.max_number} "
            f"and operations {cfg.operations}, fewer than train_size + eval_size = "
            f"{cfg.train_size + cfg.eval_size}. Raise `data.max_number` or lower the sizes."
        )
    # Eval first, from its own stream: the eval set depends only on seed and eval_size, so runs that vary
    # train_size are scored on the same problems. Train then skips every eval question.
    eval_ = _arithmetic_split(cfg, "eval", cfg.eval_size, taken)
    train = _arithmetic_split(cfg, "train", cfg.train_size, taken)
    return _pair(train, eval_, cfg)


# -------------------------------------------------------------------------------------------- dispatch
def load_datasets(cfg: DataConfig) -> DatasetPair:
    """Build the train and eval prompt datasets described by ``cfg`` (see the module docstring)."""
    if isinstance(cfg, ArithmeticData):
        return _load_arithmetic(cfg)
    if isinstance(cfg, Gsm8kData):
        return _load_local(cfg, cfg.path) if cfg.path is not None else _load_hub(cfg)
    if isinstance(cfg, JsonlData):
        return _load_local(cfg, cfg.path)
    if isinstance(cfg, HumanEvalData | CodeJsonlData):
        from grpo_lab import code_data

        return code_data.load(cfg)
    raise DataError(
        f"Unknown data config {type(cfg).__name__}: expected arithmetic, gsm8k, jsonl, humaneval or code_jsonl."
    )
