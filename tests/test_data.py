"""grpo_lab.data against real `datasets`: generated problems, the shared GSM8K files and temporary JSONL."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from grpo_lab.config import ArithmeticData, Gsm8kData, JsonlData
from grpo_lab.data import WORKED_EXAMPLES, DatasetPair, build_prompt, load_datasets
from grpo_lab.errors import DataError
from grpo_lab.models.hub import hub_endpoint, hub_offline, hub_reachable

from conftest import one_line_naming

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
        eval_path=str(GSM8K_DIR / "test.jsonl"),
        eval_fraction=0.2,
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
    )
    return base.model_copy(update=overrides)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def rows(pair: DatasetPair, split: str = "train") -> list[dict[str, Any]]:
    return list(getattr(pair, split))


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
    assert (len(pair.train), len(pair.eval)) == (200, 50)
    assert pair.train.column_names == ["prompt", "question", "answer"]
    for row in rows(pair)[:20] + rows(pair, "eval")[:5]:
        check_prompt(row["prompt"], row["question"], 2)


def test_arithmetic_is_deterministic_per_seed() -> None:
    first, again, other = (load_datasets(arithmetic(seed=s)) for s in (0, 0, 1))
    assert rows(first) == rows(again) and rows(first, "eval") == rows(again, "eval")
    assert [r["question"] for r in rows(first)] != [r["question"] for r in rows(other)]
    # The eval set depends on seed and eval_size only, so runs varying train_size score the same problems.
    assert rows(load_datasets(arithmetic(train_size=30)), "eval") == rows(first, "eval")


def test_arithmetic_splits_do_not_overlap_and_skip_shots() -> None:
    pair = load_datasets(arithmetic(max_number=5, train_size=600, eval_size=300))
    train, eval_ = ({r["question"] for r in rows(pair, s)} for s in ("train", "eval"))
    assert len(train) == 600 and len(eval_) == 300  # no duplicates within a split either
    assert not train & eval_
    assert not (train | eval_) & {shot.question for shot in WORKED_EXAMPLES}


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
    for missing in ("train_size", "eval_size"):
        with pytest.raises(DataError) as error:
            load_datasets(arithmetic(**{missing: None}))
        one_line_naming(error.value, f"data.{missing}")
    with pytest.raises(DataError) as error:
        load_datasets(arithmetic(max_number=1, operations=["-"], train_size=10_000))
    one_line_naming(error.value, "data.max_number", "max_number=1", "10050")  # 10050: train_size + eval_size


# -------------------------------------------------------------------------------------------- gsm8k
@needs_gsm8k
def test_gsm8k_local_files() -> None:
    full = load_datasets(gsm8k())
    assert (len(full.train), len(full.eval)) == (7473, 1319)
    first = full.train[0]  # file order is kept when no size is set
    assert first["question"].startswith("Natalia sold clips to 48 of her friends")
    assert first["answer"] == "72"
    check_prompt(first["prompt"], first["question"], 1)
    answers = list(full.train["answer"]) + list(full.eval["answer"])
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
    pair = load_datasets(gsm8k(eval_size=None))
    references = list(pair.eval["answer"])
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
    pair = load_datasets(gsm8k(path=str(good), eval_path=str(good)))
    assert list(pair.train["answer"]) == ["1234", "7", "-3"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Q?", "answer": "no final line"}])
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=str(bad), eval_path=str(good)))
    one_line_naming(error.value, "bad.jsonl:1", "####", "'no final line'")
    cols = write_jsonl(tmp_path / "cols.jsonl", [{"prompt": "Q?", "answer": "1"}])
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=str(cols), eval_path=str(good)))
    one_line_naming(error.value, "cols.jsonl:1", "question", "answer", "prompt")  # the needed and the found columns


def test_gsm8k_hub_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=None, eval_path=None))
    assert time.monotonic() - start < 5
    # What it tried (the endpoint, the dataset) and the local ways out.
    one_line_naming(error.value, hub_endpoint(), "openai/gsm8k", "data.path=", "data.eval_path=", "data=arithmetic")


def test_gsm8k_hub_needs_path_for_eval_path() -> None:
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=None))
    one_line_naming(error.value, "data.eval_path", "data.path")


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
            load_datasets(gsm8k(path=None, eval_path=None))
        one_line_naming(error.value, endpoint, "openai/gsm8k")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    endpoint = f"https://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    start = time.monotonic()
    assert not hub_reachable(timeout=2.0)
    with pytest.raises(DataError) as error:
        load_datasets(gsm8k(path=None, eval_path=None))
    assert time.monotonic() - start < 5
    one_line_naming(error.value, endpoint, "openai/gsm8k")  # the endpoint it probed, not a download attempt's error


# -------------------------------------------------------------------------------------------- jsonl
def test_jsonl_string_prompts_and_answers(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": f"Question {i}?", "answer": a} for i, a in enumerate([3, 2.0, " 1.5 ", None, "x"])],
    )
    pair = load_datasets(jsonl(path, eval_path=str(path)))
    assert list(pair.train["answer"]) == ["3", "2", "1.5", None, "x"]
    row = pair.train[0]
    assert row["question"] == "Question 0?"
    check_prompt(row["prompt"], "Question 0?", 1)


def test_jsonl_message_prompts(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    chat += [{"role": "user", "content": "2 + 2?"}]
    own_system = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "1 + 1?"}]
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": chat, "answer": "4"}, {"prompt": own_system, "answer": "2"}])
    pair = load_datasets(jsonl(path, eval_path=str(path), num_shots=3))
    first, second = pair.train
    assert first["prompt"] == [{"role": "system", "content": SYSTEM}, *chat]  # system added, no shots
    assert first["question"] == "2 + 2?"
    assert second["prompt"] == own_system  # its own system message is kept alone
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": [{"role": "user"}]}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(bad, eval_path=str(path)))
    one_line_naming(error.value, "bad.jsonl:1", "prompt[0]", "{'role': 'user'}")


def test_jsonl_without_answer_column_and_split(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Write poem {i}."} for i in range(10)])
    pair = load_datasets(jsonl(path, eval_fraction=0.3))
    assert (len(pair.train), len(pair.eval)) == (7, 3)
    assert set(list(pair.train["answer"]) + list(pair.eval["answer"])) == {None}
    assert not set(pair.train["question"]) & set(pair.eval["question"])
    assert rows(pair) == rows(load_datasets(jsonl(path, eval_fraction=0.3)))


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
    one_line_naming(error.value, str(one), "data.eval_path")  # too few rows to split: give a held-out file
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(DataError) as error:
        load_datasets(jsonl(good, eval_path="nope.jsonl"))
    one_line_naming(error.value, "data.eval_path=nope.jsonl", str(tmp_path / "nope.jsonl"))
