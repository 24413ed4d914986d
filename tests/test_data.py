"""grpo_lab.data against real `datasets`: generated problems, the shared GSM8K files and temporary JSONL."""

from __future__ import annotations

import json
import logging
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_lab import config as config_mod
from grpo_lab.config import ArithmeticData, CodeJsonlData, Gsm8kData, HumanEvalData, JsonlData
from grpo_lab.data import MIN_GRADED_ITEMS, WORKED_EXAMPLES, DataParts, build_prompt, check_graded_sizes, load_datasets
from grpo_lab.errors import DataError
from grpo_lab.models.hub import hub_endpoint, hub_offline, hub_reachable

from conftest import compose, one_line_naming

GSM8K_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").is_file(), reason=f"no GSM8K files in {GSM8K_DIR}")
SYSTEM = "Answer in <reasoning> and <answer> tags."
TARGET = re.compile(r"<reasoning>\n.+\n</reasoning>\n<answer>\n(-?\d+)\n</answer>", re.DOTALL)


def arithmetic(**overrides: Any) -> ArithmeticData:
    base = ArithmeticData(
        system_prompt=SYSTEM,
        num_shots=2,
        train_size=200,
        eval_size=50,
        test_size=40,
        seed=0,
        kind="arithmetic",
        max_number=50,
        operations=["+", "-"],
    )
    return base.model_copy(update=overrides)


def gsm8k(**overrides: Any) -> Gsm8kData:
    base = Gsm8kData(
        system_prompt=SYSTEM,
        num_shots=1,
        train_size=None,
        eval_size=None,
        seed=0,
        kind="gsm8k",
        hub_id="openai/gsm8k",
        hub_config="main",
        path=str(GSM8K_DIR / "train.jsonl"),
        eval_path=None,
        eval_fraction=0.2,
        test_path=str(GSM8K_DIR / "test.jsonl"),
        test_fraction=0.2,
        test_size=None,
    )
    return base.model_copy(update=overrides)


def jsonl(path: Path, **overrides: Any) -> JsonlData:
    base = JsonlData(
        system_prompt=SYSTEM,
        num_shots=1,
        train_size=None,
        eval_size=None,
        seed=0,
        kind="jsonl",
        path=str(path),
        eval_path=None,
        eval_fraction=0.2,
        test_path=None,
        test_fraction=0.2,
        test_size=None,
    )
    return base.model_copy(update=overrides)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def rows(pair: DataParts, split: str = "train") -> list[dict[str, Any]]:
    return list(getattr(pair, split))


PART_NAMES = ("train", "eval", "test")


def norm(question: str) -> str:
    """A question as the parts are deduplicated by: whitespace aside."""
    return " ".join(question.split())


def questions(parts: DataParts) -> dict[str, list[str]]:
    return {name: list(getattr(parts, name)["question"]) for name in PART_NAMES}


def assert_disjoint(parts: DataParts) -> None:
    """No question (whitespace aside) in two parts."""
    sets = {name: {norm(q) for q in qs} for name, qs in questions(parts).items()}
    for a, b in (("train", "eval"), ("train", "test"), ("eval", "test")):
        assert not sets[a] & sets[b], f"{a} and {b} share {sorted(sets[a] & sets[b])[:3]}"


def humaneval(**overrides: Any) -> HumanEvalData:
    base = HumanEvalData(
        kind="humaneval",
        system_prompt=SYSTEM,
        num_shots=0,
        train_size=None,
        eval_size=None,
        test_size=None,
        seed=0,
        eval_fraction=0.2,
        test_fraction=0.2,
    )
    return base.model_copy(update=overrides)


def check_prompt(prompt: list[dict[str, str]], question: str, num_shots: int) -> None:
    """System first, then `num_shots` user/assistant pairs in the target format, the question last."""
    assert prompt[0] == {"role": "system", "content": SYSTEM}
    turns = prompt[1:]
    assert len(turns) == 2 * num_shots + 1
    assert [m["role"] for m in turns] == ["user", "assistant"] * num_shots + ["user"]
    assert turns[-1]["content"] == question
    for shot, (user, assistant) in zip(WORKED_EXAMPLES, zip(turns[:-1:2], turns[1::2], strict=True), strict=False):
        assert user["content"] == shot.question
        match = TARGET.fullmatch(assistant["content"])
        assert match and match.group(1) == shot.answer


# ------------------------------------------------------------------------------------------ prompts
def test_build_prompt_and_worked_examples() -> None:
    prompt = build_prompt("What is 2 + 2?", SYSTEM, 3)
    check_prompt(prompt, "What is 2 + 2?", 3)
    assert prompt[2]["content"] == (
        "<reasoning>\nSam starts with 7 apples and buys 5 more, so 7 + 5 = 12.\n</reasoning>\n<answer>\n12\n</answer>"
    )
    assert build_prompt("Q?", SYSTEM, 0) == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Q?"}]
    assert build_prompt("Q?", "", 0) == [{"role": "user", "content": "Q?"}]  # no blank system message
    too_many = len(WORKED_EXAMPLES) + 1
    with pytest.raises(DataError) as error:
        build_prompt("Q?", SYSTEM, too_many)
    one_line_naming(error.value, "data.num_shots", str(too_many), str(len(WORKED_EXAMPLES)))


def test_worked_example_reasoning_is_correct() -> None:
    """Every `x op y = z` in a shot's reasoning holds, and the last result is its answer."""
    for shot in WORKED_EXAMPLES:
        steps = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", shot.reasoning)
        assert steps, shot.question
        for a, op, b, result in steps:
            assert eval(f"{a} {op} {b}") == int(result), shot.reasoning
        assert steps[-1][3] == shot.answer


def test_importing_data_does_not_import_datasets_or_torch() -> None:
    code = "import sys, grpo_lab.data; print('torch' in sys.modules, 'datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --------------------------------------------------------------------------------------- arithmetic
def test_arithmetic_sizes_columns_and_prompts() -> None:
    pair = load_datasets(arithmetic())
    assert (len(pair.train), len(pair.eval), len(pair.test)) == (200, 50, 40)
    for part in (pair.train, pair.eval, pair.test):
        assert part.column_names == ["prompt", "question", "answer"]
    for row in rows(pair)[:20] + rows(pair, "eval")[:5] + rows(pair, "test")[:5]:
        check_prompt(row["prompt"], row["question"], 2)


def test_arithmetic_is_deterministic_per_seed() -> None:
    first, again, other = (load_datasets(arithmetic(seed=s)) for s in (0, 0, 1))
    for part in ("train", "eval", "test"):
        assert rows(first, part) == rows(again, part)
        assert [r["question"] for r in rows(first, part)] != [r["question"] for r in rows(other, part)]
    # The validation and test sets do not depend on train_size, so runs varying it score the same problems.
    shorter = load_datasets(arithmetic(train_size=30))
    assert rows(shorter, "eval") == rows(first, "eval") and rows(shorter, "test") == rows(first, "test")


def test_arithmetic_splits_do_not_overlap_and_skip_shots() -> None:
    pair = load_datasets(arithmetic(max_number=5, train_size=600, eval_size=300, test_size=200))
    train, eval_, test = ({r["question"] for r in rows(pair, s)} for s in ("train", "eval", "test"))
    assert (len(train), len(eval_), len(test)) == (600, 300, 200)  # no duplicates within a split either
    assert not train & eval_ and not train & test and not eval_ & test
    assert not (train | eval_ | test) & {shot.question for shot in WORKED_EXAMPLES}


@pytest.mark.parametrize(
    ("op", "expected"), [("+", lambda a, b: a + b), ("-", lambda a, b: abs(a - b)), ("*", lambda a, b: a * b)]
)
def test_arithmetic_answers_are_correct(op: str, expected: Any) -> None:
    pair = load_datasets(arithmetic(operations=[op], max_number=30, train_size=100, eval_size=20))
    for row in rows(pair) + rows(pair, "eval"):
        a, b = map(int, re.findall(r"\d+", row["question"]))
        assert 1 <= a <= 30 and 1 <= b <= 30
        assert row["answer"] == str(expected(a, b)), row["question"]
        assert row["answer"].isdigit()  # never negative


def test_arithmetic_wordings_vary_and_read_right() -> None:
    questions = [r["question"] for r in rows(load_datasets(arithmetic(operations=["+", "-", "*"], max_number=3)))]
    openings = {" ".join(q.split()[1:3]) for q in questions}
    assert len(openings) >= 6
    assert any("apple" in q for q in questions) and any("marble" in q for q in questions)
    assert not re.search(r"\b1 (apples|books|marbles|coins|bags|packs|days)\b", " ".join(questions))


def test_arithmetic_config_errors() -> None:
    with pytest.raises(DataError) as error:
        load_datasets(arithmetic(operations=["+", "/"]))
    one_line_naming(error.value, "data.operations", "'/'", "'+'", "'-'", "'*'")  # the offender and the valid ones
    for missing in ("train_size", "eval_size", "test_size"):
        with pytest.raises(DataError) as error:
            load_datasets(arithmetic(**{missing: None}))
        one_line_naming(error.value, f"data.{missing}")
    with pytest.raises(DataError) as error:
        load_datasets(arithmetic(max_number=1, operations=["-"], train_size=10_000))
    # 10090: train_size + eval_size + test_size (10000 + 50 + 40).
    one_line_naming(error.value, "data.max_number", "max_number=1", "train_size + eval_size + test_size", "10090")


def test_arithmetic_capacity_counts_the_test_part() -> None:
    """One subtraction template space (max_number=1) holds 472 problems beside the shots: train and validation
    alone fit with train_size=400, the test part's 40 more do not; a sum of exactly 472 loads, every question once."""
    small = {"max_number": 1, "operations": ["-"]}
    with pytest.raises(DataError) as error:
        load_datasets(arithmetic(**small, train_size=400))  # 400 + 50 <= 472 < 400 + 50 + 40
    one_line_naming(error.value, "about 472", "train_size + eval_size + test_size = 490")
    full = load_datasets(arithmetic(**small, train_size=382))  # 382 + 50 + 40 = 472
    questions = [r["question"] for part in ("train", "eval", "test") for r in rows(full, part)]
    assert (len(full.train), len(full.eval), len(full.test)) == (382, 50, 40)
    assert len(set(questions)) == 472


# -------------------------------------------------------------------------------------------- gsm8k
@needs_gsm8k
def test_gsm8k_local_files() -> None:
    full = load_datasets(gsm8k())  # data.path=train.jsonl data.test_path=test.jsonl: validation split off train
    # Test: all 1319 rows of test.jsonl; validation: round(7473 * 0.2) = 1495 rows of train.jsonl; train: the rest.
    assert (len(full.train), len(full.eval), len(full.test)) == (5978, 1495, 1319)
    train_file, test_file = (
        [json.loads(line) for line in (GSM8K_DIR / f).open()] for f in ("train.jsonl", "test.jsonl")
    )
    assert list(full.test["question"]) == [r["question"].strip() for r in test_file]  # in file order, all of it
    assert sorted([*full.train["question"], *full.eval["question"]]) == sorted(
        r["question"].strip() for r in train_file
    )
    assert not set(full.train["question"]) & set(full.eval["question"])
    first = full.train[0]  # file order is kept when no size is set (the file's first row is not in validation)
    assert first["question"].startswith("Natalia sold clips to 48 of her friends")
    assert first["answer"] == "72"
    check_prompt(first["prompt"], first["question"], 1)
    answers = list(full.train["answer"]) + list(full.eval["answer"]) + list(full.test["answer"])
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", a) for a in answers)  # no commas, no ####, no units
    assert any(a == "1600" for a in answers)  # GSM8K writes some of these as "1,600"


@needs_gsm8k
def test_gsm8k_sizes_are_seeded_subsets() -> None:
    small = load_datasets(gsm8k(train_size=16, eval_size=8, num_shots=0))
    assert (len(small.train), len(small.eval)) == (16, 8)
    assert rows(small) == rows(load_datasets(gsm8k(train_size=16, eval_size=8, num_shots=0)))
    assert rows(small) != rows(load_datasets(gsm8k(train_size=16, eval_size=8, num_shots=0, seed=1)))
    assert [m["role"] for m in small.train[0]["prompt"]] == ["system", "user"]


@needs_gsm8k
def test_gsm8k_split_without_eval_path() -> None:
    pair = load_datasets(gsm8k(eval_path=None))
    assert (len(pair.train), len(pair.eval)) == (5978, 1495)  # 80/20 of 7473
    train, eval_ = (set(getattr(pair, s)["question"]) for s in ("train", "eval"))
    assert not train & eval_
    again = load_datasets(gsm8k(eval_path=None, eval_fraction=0.2, train_size=10, eval_size=10))
    assert set(again.eval["question"]) <= eval_  # the caps draw from the same split


@needs_gsm8k
def test_every_gsm8k_reference_is_graded_right_when_a_completion_writes_its_number() -> None:
    """One answer rule for data and rewards: each reference, written back the ways a model writes numbers (as
    GSM8K wrote it, with thousands separators, a dollar sign, a trailing period), scores 1; one more scores 0."""
    from grpo_lab.rewards.math import correctness

    raw = [json.loads(line)["answer"] for line in (GSM8K_DIR / "test.jsonl").open()]
    pair = load_datasets(gsm8k(test_size=None))  # the test part is test.jsonl, in file order
    references = list(pair.test["answer"])
    assert len(references) == len(raw) == 1319
    written = [r.rpartition("####")[2].strip() for r in raw]  # e.g. "1,600" as GSM8K's solution ends
    for forms in (
        written,
        [f"{float(r):,.0f}" if float(r).is_integer() else r for r in references],
        [f"${r}" for r in references],
        [f"{r}." for r in references],
    ):
        completions = [f"<answer>\n{f}\n</answer>" for f in forms]
        assert correctness(completions, answer=references) == [1.0] * len(references)
    off_by_one = [f"<answer>{float(r) + 1:g}</answer>" for r in references]
    assert correctness(off_by_one, answer=references) == [0.0] * len(references)


def test_gsm8k_answer_parsing_and_errors(tmp_path: Path) -> None:
    good = write_jsonl(
        tmp_path / "g.jsonl",
        [
            {"question": "Q1?", "answer": "So 1,000 + 234 = 1234.\n#### 1,234"},
            {"question": "Q2?", "answer": 7},
            {"question": "Q3?", "answer": "#### -3 "},
        ],
    )
    # Held-out files of their own, so that every row of `good` is trained on, in file order.
    held = write_jsonl(tmp_path / "held.jsonl", [{"question": "H1?", "answer": "Twice 1,000.\n#### 2,000"}])
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "T1?", "answer": 5.0}])
    pair = load_datasets(gsm8k(path=str(good), eval_path=str(held), test_path=str(test)))
    assert list(pair.train["answer"]) == ["1234", "7", "-3"]
    assert list(pair.eval["answer"]) == ["2000"] and list(pair.test["answer"]) == ["5"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Q?", "answer": "no final line"}])
    for key in ("path", "eval_path", "test_path"):  # the same rules for every part's file
        files = {"path": str(good), "eval_path": str(held), "test_path": str(test)} | {key: str(bad)}
        with pytest.raises(DataError) as error:
            load_datasets(gsm8k(**files))
        one_line_naming(error.value, "bad.jsonl:1", "####", "'no final line'")
    cols = write_jsonl(tmp_path / "cols.jsonl", [{"prompt": "Q?", "answer": "1"}])
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=str(cols), eval_path=str(held), test_path=str(test)))
    one_line_naming(error.value, "cols.jsonl:1", "question", "answer", "prompt")  # the needed and the found columns


def test_gsm8k_hub_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=None, eval_path=None, test_path=None))
    assert time.monotonic() - start < 5
    # What it tried (the endpoint, the dataset) and the local ways out.
    one_line_naming(error.value, hub_endpoint(), "openai/gsm8k", "data.path=", "data.test_path=", "data=arithmetic")


def test_gsm8k_hub_needs_path_for_a_held_out_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the Hub the held-out parts are the Hub's (test: its test split; validation: split off its train split):
    a validation or test file without `data.path` is refused, naming the key given, before any download."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # refused for the keys, not for the network
    for key in ("eval_path", "test_path"):
        files = {"path": None, "eval_path": None, "test_path": None, key: str(GSM8K_DIR / "test.jsonl")}
        with pytest.raises(DataError) as error:
            load_datasets(gsm8k(**files))
        one_line_naming(error.value, f"data.{key}", "data.path")


# -------------------------------------------------------------------------------------- hub probe
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_reachable_probes_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        endpoint = f"https://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        assert hub_reachable(timeout=2.0)
        # Reachable, but the user said offline: the datasets path must not try.
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        assert hub_offline("HF_DATASETS_OFFLINE")
        with pytest.raises(DataError) as error:
            load_datasets(gsm8k(path=None, eval_path=None, test_path=None))
        one_line_naming(error.value, endpoint, "openai/gsm8k")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    endpoint = f"https://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    start = time.monotonic()
    assert not hub_reachable(timeout=2.0)
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=None, eval_path=None, test_path=None))
    assert time.monotonic() - start < 5
    one_line_naming(error.value, endpoint, "openai/gsm8k")  # the endpoint it probed, not a download attempt's error


# -------------------------------------------------------------------------------------------- jsonl
def test_jsonl_string_prompts_and_answers(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": f"Question {i}?", "answer": a} for i, a in enumerate([3, 2.0, " 1.5 ", None, "x"])],
    )
    # Held-out files of their own, so that every row of `path` is trained on, in file order.
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "Held out?", "answer": 4.0}])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "Tested?", "answer": " 6 "}])
    pair = load_datasets(jsonl(path, eval_path=str(held), test_path=str(test)))
    assert list(pair.train["answer"]) == ["3", "2", "1.5", None, "x"]
    assert list(pair.eval["answer"]) == ["4"] and list(pair.test["answer"]) == ["6"]
    row = pair.train[0]
    assert row["question"] == "Question 0?"
    check_prompt(row["prompt"], "Question 0?", 1)


def test_jsonl_message_prompts(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    chat += [{"role": "user", "content": "2 + 2?"}]
    own_system = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "1 + 1?"}]
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": chat, "answer": "4"}, {"prompt": own_system, "answer": "2"}])
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": [{"role": "user", "content": "3 + 3?"}], "answer": "6"}])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": [{"role": "user", "content": "4 + 4?"}], "answer": "8"}])
    pair = load_datasets(jsonl(path, eval_path=str(held), test_path=str(test), num_shots=3))
    first, second = pair.train
    assert first["prompt"] == [{"role": "system", "content": SYSTEM}, *chat]  # system added, no shots
    assert first["question"] == "2 + 2?"
    assert second["prompt"] == own_system  # its own system message is kept alone
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": [{"role": "user"}]}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(bad, eval_path=str(held), test_path=str(test)))
    one_line_naming(error.value, "bad.jsonl:1", "prompt[0]", "{'role': 'user'}")


def test_jsonl_without_answer_column_and_split(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Write poem {i}."} for i in range(10)])
    pair = load_datasets(jsonl(path, eval_fraction=0.3))  # and test_fraction=0.2: both fractions of all 10 rows
    assert (len(pair.train), len(pair.eval), len(pair.test)) == (5, 3, 2)
    assert set(list(pair.train["answer"]) + list(pair.eval["answer"]) + list(pair.test["answer"])) == {None}
    train, eval_, test = (set(getattr(pair, s)["question"]) for s in ("train", "eval", "test"))
    assert not train & eval_ and not train & test and not eval_ & test
    assert train | eval_ | test == {f"Write poem {i}." for i in range(10)}
    again = load_datasets(jsonl(path, eval_fraction=0.3))
    assert all(rows(pair, s) == rows(again, s) for s in ("train", "eval", "test"))


def test_jsonl_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(Path("missing.jsonl")))
    # The key as typed, and where a relative path was looked for.
    one_line_naming(error.value, "data.path=missing.jsonl", str(tmp_path / "missing.jsonl"))
    cols = write_jsonl(tmp_path / "cols.jsonl", [{"question": "Q?", "answer": "1", "level": 2}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(cols))
    # The needed and the found columns, and the loader that reads this shape.
    one_line_naming(error.value, "cols.jsonl:1", "prompt", "level", "data=gsm8k")
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(empty))
    one_line_naming(error.value, str(empty))
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"prompt": "ok"}, "", '{"prompt": "no end"'])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(broken))
    one_line_naming(error.value, "broken.jsonl:3")
    one = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "only"}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(one))
    # Too few rows to split: give the held-out files.
    one_line_naming(error.value, str(one), "data.eval_path", "data.test_path")
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(good, eval_path="nope.jsonl"))
    one_line_naming(error.value, "data.eval_path=nope.jsonl", str(tmp_path / "nope.jsonl"))


# ------------------------------------------------------------------------------ the three parts, every source
def _prompts(path: Path, prefix: str, n: int) -> Path:
    return write_jsonl(path, [{"prompt": f"{prefix} {i}?", "answer": str(i)} for i in range(n)])


def _source_overrides(source: str, tmp_path: Path) -> list[str]:
    """`python -m grpo_lab` overrides of each source (experiment=smoke caps the parts at 16, 20 and 20)."""
    if source == "arithmetic":
        return []
    if source == "gsm8k local":
        return ["data=gsm8k", f"data.path={GSM8K_DIR / 'train.jsonl'}", f"data.test_path={GSM8K_DIR / 'test.jsonl'}"]
    if source == "jsonl split":
        return ["data=jsonl", f"data.path={_prompts(tmp_path / 'all.jsonl', 'Question', 200)}"]
    if source == "jsonl files":
        files = {
            key: _prompts(tmp_path / f"{key}.jsonl", key, n)
            for key, n in (("path", 60), ("eval_path", 30), ("test_path", 30))
        }
        return ["data=jsonl", *(f"data.{key}={file}" for key, file in files.items())]
    assert source == "humaneval"
    return ["data=humaneval"]


SOURCES = ["arithmetic", pytest.param("gsm8k local", marks=needs_gsm8k), "jsonl split", "jsonl files", "humaneval"]


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_deals_three_disjoint_parts_that_only_the_data_config_decides(source: str, tmp_path: Path) -> None:
    """For every source: train, validation and test share no question; the same `data.seed` gives the same parts
    whatever the training `seed` (and the global RNG state it sets); another `data.seed` deals other ones."""
    overrides = ["experiment=smoke", *_source_overrides(source, tmp_path)]

    def load(*extra: str, training_seed: int) -> tuple[Any, DataParts]:
        run = config_mod.load(compose([*overrides, *extra, f"seed={training_seed}"]))
        assert run.seed == training_seed
        random.seed(training_seed)  # what a run's training seed seeds (transformers.set_seed): not the data's
        np.random.seed(training_seed)
        return run.data, load_datasets(run.data)

    cfg, first = load(training_seed=1)
    again_cfg, again = load(training_seed=2)
    assert cfg == again_cfg and cfg.seed == 1234  # the data config does not hold the training seed
    assert (len(first.train), len(first.eval), len(first.test)) == (16, 20, 20)
    assert_disjoint(first)
    for name in PART_NAMES:
        assert rows(first, name) == rows(again, name), name
    _, other = load("data.seed=7", training_seed=1)
    assert_disjoint(other)
    assert questions(other) != questions(first)
    if source == "jsonl files":  # given files: each part draws from its own file, whatever the seed
        for parts in (first, other):
            for name, prefix in zip(PART_NAMES, ("path", "eval_path", "test_path"), strict=True):
                assert all(q.startswith(f"{prefix} ") for q in questions(parts)[name])
    else:  # seeded sources: the validation part itself moves with data.seed
        assert set(questions(other)["eval"]) != set(questions(first)["eval"])


def test_validation_is_dealt_first_so_the_test_part_never_moves_it(tmp_path: Path) -> None:
    """Validation is the same whether the test part is split off the same file or given as its own, and whatever
    the test part's size or fraction: it is dealt first (arithmetic: generated first)."""
    path = _prompts(tmp_path / "all.jsonl", "Question", 50)
    own_test = _prompts(tmp_path / "test.jsonl", "Tested", 7)
    split_off = load_datasets(jsonl(path))  # validation round(50 * 0.2) = 10, then test 10, train 30
    given = load_datasets(jsonl(path, test_path=str(own_test)))
    assert (len(split_off.train), len(split_off.eval), len(split_off.test)) == (30, 10, 10)
    assert (len(given.train), len(given.eval), len(given.test)) == (40, 10, 7)
    assert rows(given, "eval") == rows(split_off, "eval")
    # What was split off as test is trained on once test has its own file; file order is kept.
    kept = {*questions(split_off)["train"], *questions(split_off)["test"]}
    assert questions(given)["train"] == [f"Question {i}?" for i in range(50) if f"Question {i}?" in kept]
    for fraction in (0.1, 0.3, 0.5):
        assert rows(load_datasets(jsonl(path, test_fraction=fraction)), "eval") == rows(split_off, "eval")
    base = load_datasets(humaneval())
    for fraction in (0.1, 0.3, 0.6):
        assert rows(load_datasets(humaneval(test_fraction=fraction)), "eval") == rows(base, "eval")
    base = load_datasets(arithmetic())
    for size in (1, 20, 300):
        assert rows(load_datasets(arithmetic(test_size=size)), "eval") == rows(base, "eval")


@needs_gsm8k
def test_gsm8k_validation_is_the_same_with_or_without_the_test_file() -> None:
    """GSM8K local: with test.jsonl as the test part, or with test split off train.jsonl too, validation is the same
    round(7473 * 0.2) = 1495 rows of train.jsonl."""
    with_file = load_datasets(gsm8k())
    split_off = load_datasets(gsm8k(test_path=None))
    assert (len(with_file.train), len(with_file.eval), len(with_file.test)) == (5978, 1495, 1319)
    assert (len(split_off.train), len(split_off.eval), len(split_off.test)) == (4483, 1495, 1495)
    assert rows(with_file, "eval") == rows(split_off, "eval")
    assert set(questions(with_file)["train"]) == {*questions(split_off)["train"], *questions(split_off)["test"]}
    assert_disjoint(split_off)


def test_overlapping_given_files_are_deduplicated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A question (whitespace aside) that a later part's file holds leaves the earlier part: validation loses what
    test holds, train what either holds; the test file keeps every row, and the removal is logged."""
    path = _prompts(tmp_path / "train.jsonl", "Question", 10)
    held = write_jsonl(
        tmp_path / "held.jsonl", [{"prompt": p} for p in ("Question 5?", "Held A?", "Tested  X?", "Held B?")]
    )
    test = write_jsonl(
        tmp_path / "test.jsonl", [{"prompt": p} for p in ("Question   3?", " Question 7? ", "Tested X?")]
    )
    with caplog.at_level(logging.WARNING, logger="grpo_lab.data.sets"):
        parts = load_datasets(jsonl(path, eval_path=str(held), test_path=str(test)))
    assert questions(parts)["test"] == ["Question   3?", " Question 7? ", "Tested X?"]  # all of it, as written
    assert questions(parts)["eval"] == ["Question 5?", "Held A?", "Held B?"]
    assert questions(parts)["train"] == [f"Question {i}?" for i in range(10) if i not in (3, 5, 7)]
    assert_disjoint(parts)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "1 from validation" in warning and "3 from train" in warning


@needs_gsm8k
def test_a_gsm8k_test_file_sharing_train_questions_takes_them_out_of_training(tmp_path: Path) -> None:
    """A test file made of train.jsonl's first 30 rows: they are tested, and neither trained on nor validated on."""
    shared = (GSM8K_DIR / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:30]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(shared), encoding="utf-8")
    parts = load_datasets(gsm8k(test_path=str(test)))
    assert len(parts.test) == 30 and len(parts.train) + len(parts.eval) == 7473 - 30
    assert_disjoint(parts)
    assert not parts.train[0]["question"].startswith("Natalia sold clips")  # the file's first row is tested now


def _file_config(kind: str, **files: str | None) -> Gsm8kData | JsonlData | CodeJsonlData:
    """A file-reading source's config for these files (its other settings as the helpers above)."""
    if kind == "jsonl":
        return jsonl(Path(files.pop("path")), **files)
    if kind == "gsm8k":
        return gsm8k(**files)
    sizes = {"train_size": None, "eval_size": None, "test_size": None}
    fractions = {"eval_fraction": 0.2, "test_fraction": 0.2}
    return CodeJsonlData(kind="code_jsonl", system_prompt=SYSTEM, num_shots=0, seed=0, **sizes, **fractions, **files)


def _problem(kind: str, name: str, i: int) -> dict[str, Any]:
    if kind == "code_jsonl":
        return {"text": f"Write f{name}{i}.", "test_list": ["assert f() == 1"]}
    return {"prompt": f"{name} {i}?", "question": f"{name} {i}?", "answer": "#### 1"}  # GSM8K's and JSONL's columns


@pytest.mark.parametrize("kind", ["jsonl", "gsm8k", "code_jsonl"])
@pytest.mark.parametrize("keys", [("path", "eval_path"), ("path", "test_path"), ("eval_path", "test_path")])
def test_the_same_file_for_two_parts_is_refused_naming_both_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, keys: tuple[str, str]
) -> None:
    """Two parts naming one file (here spelt once relative, once absolute) would share every item: one line naming
    both keys. The same config with another file for the second key loads."""
    monkeypatch.chdir(tmp_path)
    files = {
        name: write_jsonl(tmp_path / f"{name}.jsonl", [_problem(kind, name, i) for i in range(5)])
        for name in ("train", "held", "tested")
    }
    given = {"path": str(files["train"]), "eval_path": None, "test_path": None}
    given[keys[0]] = str(files["held"])
    given[keys[1]] = files["tested"].name  # relative, resolved against the current directory
    parts = load_datasets(_file_config(kind, **given))
    assert_disjoint(parts)
    given[keys[1]] = files["held"].name  # the first key's file, spelt otherwise
    with pytest.raises(DataError) as error:
        load_datasets(_file_config(kind, **given))
    one_line_naming(error.value, f"`data.{keys[0]}`", f"`data.{keys[1]}`", str(files["held"]))


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.7, 0.4), (0.9, 0.2)])
def test_held_out_fractions_of_one_or_more_are_refused_naming_both_keys(
    tmp_path: Path, fractions: tuple[float, float]
) -> None:
    """eval_fraction + test_fraction >= 1 leaves nothing to train on: refused naming both keys, for every source
    that splits a file (JSONL, HumanEval, GSM8K local where its files are). With a test file of its own only
    eval_fraction splits, so test_fraction does not count."""
    eval_fraction, test_fraction = fractions
    path = _prompts(tmp_path / "all.jsonl", "Question", 20)
    configs = [
        jsonl(path, eval_fraction=eval_fraction, test_fraction=test_fraction),
        humaneval(eval_fraction=eval_fraction, test_fraction=test_fraction),
    ]
    if (GSM8K_DIR / "train.jsonl").is_file():
        configs.append(gsm8k(test_path=None, eval_fraction=eval_fraction, test_fraction=test_fraction))
    for cfg in configs:
        with pytest.raises(DataError) as error:
            load_datasets(cfg)
        one_line_naming(error.value, f"data.eval_fraction={eval_fraction}", f"data.test_fraction={test_fraction}")
    own_test = _prompts(tmp_path / "test.jsonl", "Tested", 3)
    parts = load_datasets(
        jsonl(path, test_path=str(own_test), eval_fraction=eval_fraction, test_fraction=test_fraction)
    )
    assert (len(parts.eval), len(parts.test)) == (round(20 * eval_fraction), 3)


def test_a_graded_part_under_twenty_items_is_refused_naming_its_size_key(tmp_path: Path) -> None:
    """check_graded_sizes: validation and test each need MIN_GRADED_ITEMS (20); the error names the part's own keys."""
    assert MIN_GRADED_ITEMS == 20
    check_graded_sizes(load_datasets(arithmetic(eval_size=20, test_size=20)))
    for name, other in (("eval", "test"), ("test", "eval")):
        with pytest.raises(DataError) as error:
            check_graded_sizes(load_datasets(arithmetic(**{f"{name}_size": 19, f"{other}_size": 20})))
        text = one_line_naming(error.value, f"data.{name}_size", "19", "20")
        assert f"data.{other}_" not in text
    # Split off a file: 60 rows give 12 each (refused, validation first); 100 rows give 20 each.
    small = load_datasets(jsonl(_prompts(tmp_path / "small.jsonl", "Question", 60)))
    assert (len(small.eval), len(small.test)) == (12, 12)
    with pytest.raises(DataError) as error:
        check_graded_sizes(small)
    one_line_naming(error.value, "data.eval_size", "12", "data.eval_fraction")
    check_graded_sizes(load_datasets(jsonl(_prompts(tmp_path / "enough.jsonl", "Question", 100))))
