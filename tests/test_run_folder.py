"""The run folder's files: each writer's output read back by its reader; missing and damaged files."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_lab import interrupts
from grpo_lab.files import RunFolderError, append_jsonl
from grpo_lab.run.folder import RunFolder, RunResult
from grpo_lab.run.summary import HEADLINES
from grpo_lab.run.tracking import Tracker, TrackerInfo

from conftest import one_line_naming

SECRET = "postgresql://user:hunter2@db:5432/optuna"


def _result(run_dir: Path, **changes) -> RunResult:
    fields = {
        "status": "finished",
        "objective": 0.5,
        "objective_metric": "eval_after/accuracy",
        "metrics": {"eval_after/accuracy": 0.5, "train/kl": float("nan"), "train/reward": 1.0},
        "run_dir": run_dir,
        "run_name": "smoke",
        "tracker": TrackerInfo(mode="offline", run_id="abc123", run_path="/tmp/wandb/offline-run-1-abc123"),
        "durations": {"total": 2.5},
    }
    return RunResult(**(fields | changes))


def test_start_files_round_trip_with_secrets_masked(tmp_path):
    config = {"name": "smoke", "objective": {"metric": "train/kl", "direction": "minimize"}, "storage": SECRET}
    RunFolder(tmp_path).write_start(config | {"hydra": {"run": {}}}, ["lr=1e-5", f"hydra.sweeper.storage={SECRET}"])
    read = RunFolder(tmp_path).read_config()
    assert read["objective"] == config["objective"] and "hydra" not in read
    assert "hunter2" not in read["storage"]
    overrides = RunFolder(tmp_path).read_overrides()
    assert overrides[0] == "lr=1e-5" and "hunter2" not in overrides[1]
    environment = RunFolder(tmp_path).read_environment()
    assert environment["python"] and "trl" in environment["packages"]


def test_metrics_round_trip_keeps_nan(tmp_path):
    RunFolder(tmp_path).write_metrics(_result(tmp_path), error=None, eval_periodic=[{"step": 2, "accuracy": 0.25}])
    data = RunFolder(tmp_path).read_metrics()
    assert data["metrics"]["train/kl"] == "nan"  # JSON has no NaN: stored as a string
    assert data["eval_periodic"] == [{"step": 2, "accuracy": 0.25}]
    result = RunFolder(tmp_path).read_result()
    assert math.isnan(result.metrics["train/kl"])
    assert (result.status, result.objective, result.run_name, result.durations) == (
        "finished",
        0.5,
        "smoke",
        {"total": 2.5},
    )
    assert result.tracker == _result(tmp_path).tracker


def test_a_run_that_left_no_files_reads_as_none_or_empty(tmp_path):
    assert RunFolder(tmp_path).read_metrics() is None
    assert RunFolder(tmp_path).read_result() is None
    assert RunFolder(tmp_path).read_config() is None
    assert RunFolder(tmp_path).read_environment() is None
    assert RunFolder(tmp_path).read_overrides() == []
    assert RunFolder(tmp_path).read_history() == []
    assert RunFolder(tmp_path).read_eval("eval_after") == []
    assert RunFolder(tmp_path).last_checkpoint() is None
    assert RunFolder(tmp_path).wandb_run_id() is None


def test_a_damaged_metrics_file_names_itself(tmp_path):
    RunFolder(tmp_path).write_metrics(_result(tmp_path))
    path = RunFolder(tmp_path).metrics_file
    path.write_text(path.read_text()[:40])
    for read in (RunFolder(tmp_path).read_metrics, RunFolder(tmp_path).read_result):
        with pytest.raises(RunFolderError) as error:
            read()
        one_line_naming(error.value, str(path))
    path.write_text("[1, 2]")
    with pytest.raises(RunFolderError) as error:
        RunFolder(tmp_path).read_metrics()
    one_line_naming(error.value, str(path))


def test_a_damaged_config_or_overrides_file_names_itself(tmp_path):
    (RunFolder(tmp_path).config_file).write_text("objective: [unclosed\n")
    with pytest.raises(RunFolderError) as error:
        RunFolder(tmp_path).read_config()
    one_line_naming(
        error.value, str(RunFolder(tmp_path).config_file), "line 1"
    )  # the file, and where in it (YAML's words)
    (RunFolder(tmp_path).overrides_file).write_text("lr: 1\n")
    with pytest.raises(RunFolderError) as error:
        RunFolder(tmp_path).read_overrides()
    one_line_naming(error.value, str(RunFolder(tmp_path).overrides_file))


def test_overrides_fall_back_to_hydras_copy(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- ++lr=0.001\n- seed=3\n")
    assert RunFolder(tmp_path).read_overrides() == ["++lr=0.001", "seed=3"]


def test_history_skips_a_line_cut_by_a_crash_and_restarts_up_to_a_step(tmp_path):
    path = RunFolder(tmp_path).history_file
    for step in (1, 2, 3):
        append_jsonl(path, {"step": step, "reward": step / 10, "loss": float("inf")})
    with path.open("a") as f:
        f.write('{"step": 4, "rew')
    rows = RunFolder(tmp_path).read_history()
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["loss"] == "inf"
    assert [r["step"] for r in RunFolder(tmp_path).restart_logs(upto=2)[0]] == [1, 2]
    assert [r["step"] for r in RunFolder(tmp_path).read_history()] == [1, 2]
    assert RunFolder(tmp_path).restart_logs(upto=None)[0] == [] and not path.exists()


def test_eval_samples_replace_an_older_file(tmp_path):
    RunFolder(tmp_path).write_eval("eval_after", [{"question": "1+1", "correct": 0.0}] * 3)
    RunFolder(tmp_path).write_eval("eval_after", [{"question": "1+1", "correct": 1.0}])
    assert RunFolder(tmp_path).read_eval("eval_after") == [{"question": "1+1", "correct": 1.0}]


def test_last_complete_checkpoint_and_the_wandb_id(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):  # checkpoint-6: cut before trainer_state.json
        folder = RunFolder(tmp_path).trainer_dir / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    assert RunFolder(tmp_path).last_checkpoint() == (4, tmp_path / "trainer" / "checkpoint-4")
    (tmp_path / "wandb" / "offline-run-20260101_000000-k1ll3d").mkdir(parents=True)
    assert RunFolder(tmp_path).wandb_run_id() == "k1ll3d"  # no metrics.json (SIGKILL): the folder's name
    RunFolder(tmp_path).write_metrics(_result(tmp_path))
    assert RunFolder(tmp_path).wandb_run_id() == "abc123"


def test_headlines_name_the_metrics_json_keys():
    assert [h.metric for h in HEADLINES] == [
        "train/reward",
        "train/reward_std",
        "train/kl",
        "train/completions/mean_length",
    ]


# ------------------------------------------------------------------------------------------- recorder
@pytest.fixture
def recorder(tmp_path):
    from grpo_lab import config as config_mod
    from grpo_lab.run.train import Recorder

    from conftest import compose

    spec = config_mod.build_job(
        compose(["experiment=smoke", "logger=none", "max_steps=4"]),
        run_dir=tmp_path,
        output_dir=tmp_path / "trainer",
        run_name="smoke",
        group=None,
        overrides=(),
        resolved_config={"name": "smoke"},
        cache_dir=tmp_path / "cache",
    )
    tracker = Tracker(spec.run.logger, run_dir=tmp_path, name="smoke", group=None, tags=[])
    job = SimpleNamespace(spec=spec, cfg=spec.run, ctx=spec, resume=None, tracker=tracker, main=True, schedule=None)
    rec = Recorder(job, started=0.0)
    rec.start()
    rec.restart_logs()
    return rec


def test_the_recorder_writes_periodic_evals_and_closes_a_failed_run(recorder, tmp_path):
    recorder.log_step({"step": 1, "reward": 0.5})
    recorder.log_eval(2, {"accuracy": 0.25, "format": 1.0, "mean_length": 12.0})
    error = ValueError("boom")
    assert recorder.close_on(error) is error
    data = RunFolder(tmp_path).read_metrics()
    assert data["status"] == "failed" and data["error"] == "ValueError: boom"
    assert data["eval_periodic"] == [{"step": 2, "accuracy": 0.25, "format": 1.0, "mean_length": 12.0}]
    assert data["metrics"]["train/reward"] == 0.5 and "total" in data["durations_s"]
    assert RunFolder(tmp_path).read_eval("eval_periodic") == data["eval_periodic"]
    assert RunFolder(tmp_path).read_config() == {"name": "smoke"}
    assert recorder.close_on(error) is error  # closed once: a second error is not recorded again
    assert RunFolder(tmp_path).read_metrics()["status"] == "failed"


def test_the_recorder_closes_an_interrupted_run_with_its_step(recorder, tmp_path):
    recorder.log_step({"step": 3, "reward": 0.5})
    error = interrupts.Interrupted(signal.SIGTERM)
    assert recorder.close_on(error) is error
    data = json.loads((RunFolder(tmp_path).metrics_file).read_text())
    assert data["status"] == "interrupted" and data["interrupted"] == {"signal": "SIGTERM", "step": 3}


def test_the_recorder_finishes_with_the_objective(recorder, tmp_path):
    recorder.metrics |= {"eval_after/accuracy": 0.75}
    result = recorder.finished()
    assert (result.status, result.objective) == ("finished", 0.75)
    assert RunFolder(tmp_path).read_result().objective == 0.75
