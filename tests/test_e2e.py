"""End to end, as subprocesses like a user types them: real TRL training on the tiny model, real W&B files."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from wandb_files import find_runs, read_run

from conftest import REPO, one_line_naming, run_cli

# One worker runs this module: its module-scoped run is made once, not once per pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("e2e")

EVALS = ("eval_before.jsonl", "eval_after.jsonl")
STEP_KEYS = ("train/reward", "train/reward_std", "train/kl", "train/completions/mean_length")


def _job_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("metrics.json"))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, model_cache):
    cwd = tmp_path_factory.mktemp("smoke")
    proc = run_cli(["experiment=smoke"], cwd, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (job,) = _job_dirs(cwd / "outputs")
    return proc, job


def test_smoke_run_writes_the_run_folder(smoke_run):
    _, job = smoke_run
    for name in (
        "config.yaml",
        "overrides.yaml",
        "environment.json",
        "history.jsonl",
        "metrics.json",
        "eval_before.jsonl",
        "eval_after.jsonl",
        "model/config.json",
    ):
        assert (job / name).exists(), name
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["status"] == "finished"
    assert metrics["objective"]["metric"] == "eval_after/accuracy"
    assert 0.0 <= metrics["objective"]["value"] <= 1.0
    assert metrics["metrics"]["train/steps"] == 4
    for key in ("eval_before/accuracy", "eval_before/format", "eval_after/format", "train/reward", "train/kl"):
        assert key in metrics["metrics"], key
    env = json.loads((job / "environment.json").read_text())
    assert (env["packages"]["trl"] and env["git"] is None) or "commit" in env["git"]
    config = yaml.safe_load((job / "config.yaml").read_text())
    assert config["model"]["name_or_path"] == "builtin:tiny-llama" and "hydra" not in config
    history = [json.loads(line) for line in (job / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history] == [1, 2, 3, 4]
    # Every proportion with its 95% interval, the change over the same items with its own, item by item.
    m = metrics["metrics"]
    for prefix in ("eval_before", "eval_after"):
        for name in ("accuracy", "format"):
            assert m[f"{prefix}/{name}_ci_low"] <= m[f"{prefix}/{name}"] <= m[f"{prefix}/{name}_ci_high"]
            assert m[f"{prefix}/{name}_ci_high"] - m[f"{prefix}/{name}_ci_low"] > 0.1  # 20 items decide little
    change = m["eval_change/accuracy"]
    assert change == pytest.approx(m["eval_after/accuracy"] - m["eval_before/accuracy"])
    assert m["eval_change/accuracy_ci_low"] <= change <= m["eval_change/accuracy_ci_high"]
    assert 0 < m["eval_change/accuracy_p_value"] <= 1
    before, after = ([json.loads(line) for line in (job / f).read_text().splitlines()] for f in EVALS)
    assert [r["item"] for r in before] == [r["item"] for r in after] == list(range(20))
    assert [r["question"] for r in before] == [r["question"] for r in after]


def test_a_single_run_reports_the_test_part_beside_validation(smoke_run):
    """The test part is graded before and after, on other items than validation, with its intervals and paired
    change, in metrics.json, the W&B summary and the printed summary; the objective still reads validation."""
    proc, job = smoke_run
    metrics = json.loads((job / "metrics.json").read_text())
    m = metrics["metrics"]
    assert metrics["objective"]["metric"] == "eval_after/accuracy"
    for prefix in ("test_before", "test_after"):
        assert m[f"{prefix}/num_samples"] == 20
        for name in ("accuracy", "format"):
            assert m[f"{prefix}/{name}_ci_low"] <= m[f"{prefix}/{name}"] <= m[f"{prefix}/{name}_ci_high"]
    assert m["test_change/accuracy"] == pytest.approx(m["test_after/accuracy"] - m["test_before/accuracy"])
    assert 0 < m["test_change/accuracy_p_value"] <= 1
    graded = {
        f: [json.loads(line) for line in (job / f"{f}.jsonl").read_text().splitlines()]
        for f in ("eval_before", "test_before", "test_after")
    }
    assert [r["question"] for r in graded["test_before"]] == [r["question"] for r in graded["test_after"]]
    assert not {r["question"] for r in graded["test_before"]} & {r["question"] for r in graded["eval_before"]}
    (wandb_run,) = find_runs(job)
    summary = read_run(wandb_run).summary
    assert summary["test_after/accuracy"] == m["test_after/accuracy"] and "test_change/accuracy_p_value" in summary
    assert re.search(r"on test +\S+ \[.*\] -> \S+ \[.*\] \(test, 20 items: .*no choice read it\)", proc.stdout)


def test_the_run_folder_keeps_the_job_spec_it_ran(smoke_run):
    """job.json: the settings as the job checked and ran them, read back typed; the same as config.yaml says."""
    from grpo_lab.config import JobSpec

    _, job = smoke_run
    spec = JobSpec.from_json(json.loads((job / "job.json").read_text()))
    config = yaml.safe_load((job / "config.yaml").read_text())
    assert spec.run_dir == job and spec.output_dir == job / "trainer" and spec.overrides == ("experiment=smoke",)
    assert (spec.run.lr, spec.run.max_steps, spec.run.model.name_or_path) == (
        config["lr"],
        config["max_steps"],
        config["model"]["name_or_path"],
    )
    assert spec.grpo_config().learning_rate == config["lr"]  # TRL's GRPOConfig, built again from the record


def test_smoke_run_prints_a_summary(smoke_run):
    proc, job = smoke_run
    assert "== grpo_lab run `smoke`: finished ==" in proc.stdout
    assert "accuracy" in proc.stdout and "reward" in proc.stdout
    assert re.search(r"accuracy +\d+\.\d% \[\d+%, \d+%\] -> \d+\.\d% \[\d+%, \d+%\]", proc.stdout), proc.stdout
    assert re.search(r"change [+-]\d+\.\d pts \[[+-]\d+, [+-]\d+\], McNemar p = ", proc.stdout), proc.stdout
    assert f"run folder   {job}" in proc.stdout or str(job.relative_to(job.parents[3])) in proc.stdout
    assert "wandb sync " in proc.stdout
    printed = proc.stdout[proc.stdout.index("== grpo_lab run") :]
    assert (job / "summary.txt").read_text().strip() == printed.strip()  # kept in the run folder too
    assert "Run history" not in proc.stderr and "Run summary" not in proc.stderr  # W&B's quiet setting


def test_smoke_run_is_one_offline_wandb_run_with_trl_metrics(smoke_run):
    _, job = smoke_run
    (run_path,) = find_runs(job)
    run = read_run(run_path)
    assert run.state == "finished"
    steps = [row for row in run.history if "train/reward" in row]
    assert [row["train/global_step"] for row in steps] == [1, 2, 3, 4]
    for row in steps:
        for key in STEP_KEYS:
            assert key in row, (key, row)
    assert any(key.startswith("train/rewards/correctness/") for key in steps[0])
    # The whole resolved Hydra config, nested, beside TRL's flat arguments.
    assert run.config["model"]["name_or_path"] == "builtin:tiny-llama"
    assert run.config["reward"]["weights"]["correctness"] == 2.0
    assert "eval_after/accuracy_ci_high" in run.summary and "eval_change/accuracy_p_value" in run.summary
    assert run.config["learning_rate"] == 1e-4 and run.config["world_size"] == 1
    assert "eval_after/accuracy" in run.summary and "objective" in run.summary


def test_grid_gives_one_run_per_job_in_one_group(tmp_path, model_cache):
    proc = run_cli(
        ["-m", "experiment=smoke", "lr=1e-5,2e-5", "max_steps=2", "output.save_model=false", "eval.before=false"],
        tmp_path,
        model_cache,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = _job_dirs(tmp_path / "outputs" / "multirun")
    assert len(jobs) == 2 and jobs[0].parent == jobs[1].parent
    runs = [read_run(path) for job in jobs for path in find_runs(job)]
    assert len(runs) == 2
    assert {r.name for r in runs} == {"lr=1e-05", "lr=2e-05"}
    assert len({r.group for r in runs}) == 1 and runs[0].group.startswith("smoke-multirun-")
    assert sorted(r.config["lr"] for r in runs) == [1e-5, 2e-5]
    assert sorted(r.config["learning_rate"] for r in runs) == [1e-5, 2e-5]
    assert all(r.state == "finished" for r in runs)
    # The grid ends with its answer: the leaderboard of both jobs; no winner on one seed a config, but the best job
    # on its seed and the grid again with seeds; the compare and upload commands, and the leaderboard files.
    folder = jobs[0].parent
    end = proc.stdout[proc.stdout.index(f"== {folder.relative_to(tmp_path)}: 2 runs") :]
    table = _table_rows(end)
    assert [(row[1], row[2]) for row in table] == [("lr=1e-05", "finished"), ("lr=2e-05", "finished")]
    # the models' paired comparison on the same held-out items, which cannot tell their configs apart
    assert [" ".join(row[6:9]) for row in table] == ["best, 1 seed", "+0 pts (p=1),"]
    lines = end.splitlines()
    (again,) = [line.strip() for line in lines if line.startswith("  python -m grpo_lab -m ")]
    one_line_naming(lines[lines.index("  " + again) - 1], "one seed", "lr=1e-05", "eval_after/accuracy")
    grid = shlex.split(again)[4:]  # the grid's own overrides, then the seeds
    assert grid[-1] == "seed=1,2,3" and "lr=1e-5,2e-5" in grid and "experiment=smoke" in grid
    assert f"python -m grpo_lab.compare {folder.relative_to(tmp_path)}" in end
    assert f"wandb sync {folder.relative_to(tmp_path)}/*/wandb/offline-run-*" in end
    board = (folder / "leaderboard.md").read_text()
    assert "lr=1e-05" in board and "lr=2e-05" in board
    assert (folder / "leaderboard.csv").read_text().count("finished") == 2


def test_a_failing_job_keeps_the_other_and_closes_its_wandb_run(tmp_path, model_cache):
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "max_steps=2",
            "output.save_model=false",
            "eval.before=false",
            "+reward.functions.extra._target_=grpo_lab.rewards.math.int_answer,failing_rewards.explode",
            "+reward.weights.extra=1.0",
        ],
        tmp_path,
        model_cache,
        PYTHONPATH=str(REPO / "tests"),
    )
    assert proc.returncode != 0
    assert "this reward fails on purpose" in proc.stderr
    by_status = {}
    for job in _job_dirs(tmp_path / "outputs" / "multirun"):
        metrics = json.loads((job / "metrics.json").read_text())
        (run_path,) = find_runs(job)
        by_status[metrics["status"]] = (metrics, read_run(run_path))
    assert set(by_status) == {"finished", "failed"}
    assert by_status["finished"][1].state == "finished"
    assert "eval_after/accuracy" in by_status["finished"][0]["metrics"]
    assert by_status["failed"][1].state == "failed"
    assert "this reward fails on purpose" in by_status["failed"][0]["error"]
    # Hydra skips on_multirun_end after a failed job: the table still lists both, the failure with its reason.
    end = proc.stdout[proc.stdout.index(": 2 runs, by eval_after/accuracy") :]
    assert [row[2] for row in _table_rows(end)] == ["finished", "failed"]
    # The failure on one line: which job, the error's kind, the reward that raised, and its own exception.
    (failure,) = [line for line in end.splitlines() if "failing_rewards.explode" in line and "RewardError" in line]
    failed_job = "+reward.functions.extra._target_=failing_rewards.explode"
    one_line_naming(failure, failed_job, "RewardError", "extra", "RuntimeError", "this reward fails on purpose")
    # The finished job leads, and the command to re-run is its own.
    winner = "+reward.functions.extra._target_=grpo_lab.rewards.math.int_answer"
    assert _table_rows(end)[0][1] == winner
    (rerun,) = [line.strip() for line in end.splitlines() if line.strip().startswith("python -m grpo_lab ")]
    assert winner in rerun and "failing_rewards" not in rerun, rerun
    (folder,) = {job.parent for job in _job_dirs(tmp_path / "outputs" / "multirun")}
    assert (folder / "leaderboard.csv").read_text().count("failed") == 1


def _table_rows(text: str) -> list[list[str]]:
    """The rows of the first text table in `text` (after its header and dashes line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("----")) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return [line.split() for line in lines[start:end]]


def test_a_wandb_failure_does_not_lose_the_run(tmp_path, model_cache):
    # Online without an API key: wandb.init fails at once; training must go on and be recorded.
    proc = run_cli(
        ["experiment=smoke", "logger.mode=online", "max_steps=2", "output.save_model=false"], tmp_path, model_cache
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # A warning names W&B and why it failed (wandb's own error); the summary gives no upload command.
    (warning,) = [line for line in proc.stderr.splitlines() if "W&B" in line]
    one_line_naming(warning, "UsageError")
    assert len(_summary_lines(proc.stdout, "W&B")) == 1 and "wandb sync" not in proc.stdout
    (job,) = _job_dirs(tmp_path / "outputs")
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["wandb"]["mode"] == "failed"
    assert len((job / "history.jsonl").read_text().splitlines()) == 2


def test_logger_none_trains_without_wandb(tmp_path, model_cache):
    proc = run_cli(["experiment=smoke", "logger=none", "max_steps=2", "output.save_model=false"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not list(tmp_path.rglob("*.wandb"))
    (line,) = _summary_lines(proc.stdout, "W&B")
    one_line_naming(line, "logger=none")  # the setting that turned it off
    assert "wandb sync" not in proc.stdout


def _summary_lines(stdout: str, label: str) -> list[str]:
    """The lines of the run summary (after its `== grpo_lab run` header) that start with `label`."""
    summary = stdout[stdout.index("== grpo_lab run") :]
    return [line for line in summary.splitlines() if line.strip().startswith(label)]
