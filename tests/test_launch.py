"""Several processes per job through `accelerate launch` (gloo ranks on this CPU-only machine)."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from grpo_lab.errors import ConfigError
from grpo_lab.launch.processes import alive, assign_gpus, descendants, visible_gpus
from wandb_files import find_runs, read_run

from conftest import DDP, REPO, cli_env, one_line_naming, run_cli, run_prune_sweep


@pytest.mark.parametrize(
    ("slot", "per_job", "visible", "expected"),
    [
        (0, 2, list("01234567"), ["0", "1"]),
        (3, 2, list("01234567"), ["6", "7"]),
        (4, 2, list("01234567"), ["0", "1"]),  # slot 0 is done by then: its block is free again
        (1, 4, list("01234567"), ["4", "5", "6", "7"]),
        (2, 3, list("01234567"), ["0", "1", "2"]),  # 8 // 3 = 2 blocks; GPUs 6, 7 stay idle
        (1, 1, ["3", "5"], ["5"]),  # CUDA_VISIBLE_DEVICES=3,5
    ],
)
def test_concurrent_jobs_get_disjoint_gpus(slot, per_job, visible, expected):
    assert assign_gpus(slot, per_job, visible) == expected


def test_four_two_gpu_trials_share_eight_gpus_without_overlap():
    blocks = [assign_gpus(slot, 2, visible_gpus(None, 8)) for slot in range(4)]
    assert sorted(g for b in blocks for g in b) == [str(i) for i in range(8)]


def test_more_gpus_than_exist_fails_clearly():
    with pytest.raises(ConfigError) as error:
        assign_gpus(0, 4, visible_gpus("0,1", 8))
    one_line_naming(error.value, "launcher.gpus_per_job=4", "2 GPU")  # what was asked, what there is
    with pytest.raises(ConfigError) as error:
        assign_gpus(0, 1, visible_gpus(None, 0))
    one_line_naming(error.value, "0 GPU")


def test_gpus_per_job_on_a_cpu_machine_fails_before_launching(tmp_path, model_cache):
    proc = run_cli([*DDP, "launcher.gpus_per_job=2"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1 and "launcher.gpus_per_job=2" in proc.stderr
    assert not (tmp_path / "outputs").exists() or not list(tmp_path.rglob("children.pid"))


def test_two_processes_train_one_job_with_one_wandb_run(tmp_path, model_cache):
    # A secret in the config reaches the children (they need it) through launch/job.json, which is private to this
    # user while they run and gone after: no file of the run holds it (`length` ignores the extra argument).
    secret = f"sk-{secrets.token_hex(8)}"
    proc = run_cli([*DDP, f"+reward.functions.length.api_key={secret}"], tmp_path, model_cache, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    (launch_dir,) = (tmp_path / "outputs").rglob("launch")
    assert (launch_dir / "children.log").is_file() and not (launch_dir / "job.json").exists()
    assert "finished ==" in proc.stdout  # the parent's summary, from the main child's result
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "finished" and metrics["metrics"]["train/steps"] == 2
    runs = [read_run(p) for p in find_runs(tmp_path / "outputs")]
    assert len(runs) == 1
    assert runs[0].config["world_size"] == 2 and runs[0].config["launcher"] == "accelerate"
    assert [r["train/global_step"] for r in runs[0].history if "train/reward" in r] == [1, 2]


def test_a_crashing_child_fails_the_job_with_its_error(tmp_path, model_cache):
    proc = run_cli(
        [*DDP, "+reward.functions.boom._target_=failing_rewards.explode", "+reward.weights.boom=1.0"],
        tmp_path,
        model_cache,
        timeout=300,
        PYTHONPATH=str(REPO / "tests"),
    )
    assert proc.returncode == 1
    assert "training processes failed" in proc.stderr and "this reward fails on purpose" in proc.stderr


@pytest.mark.heavy
def test_killing_the_parent_leaves_no_child(tmp_path, model_cache):
    """SIGKILL gives the parent no chance to forward anything: the ranks watch its pid and stop by themselves."""
    parent = subprocess.Popen(
        [sys.executable, "-m", "grpo_lab", *DDP, "max_steps=500"],
        cwd=tmp_path,
        env=cli_env(model_cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pids: set[psutil.Process] = set()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not list(tmp_path.rglob("history.jsonl")):
            time.sleep(0.5)  # training has started on both ranks
        pids = descendants(parent.pid)
        assert len(pids) >= 3, pids  # accelerate's launcher and two ranks
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.5)
        assert not [p for p in pids if alive(p)]
    finally:
        for p in descendants(parent.pid) | pids:
            if alive(p):
                p.kill()
    # Each rank's watchdog saw the parent go and stopped it as on SIGTERM: the main rank recorded the run.
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "interrupted" and metrics["interrupted"]["signal"] == "SIGTERM"


@pytest.mark.slow  # two-process trials in a sweep stay covered in CI by the pruning test
def test_a_sweep_with_two_processes_per_trial(tmp_path, model_cache):
    proc = run_cli(["-m", "sweep=lr_beta", *DDP, "hydra.sweeper.n_trials=2"], tmp_path, model_cache, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = optuna.load_study(study_name="lr_beta", storage=f"sqlite:///{tmp_path / 'outputs/sweeps/optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    for trial in study.trials:
        (run,) = [read_run(p) for p in find_runs(tmp_path / "outputs" / "sweeps" / "lr_beta" / f"trial_{trial.number}")]
        assert run.config["world_size"] == 2 and run.group == "lr_beta"


@pytest.mark.heavy
def test_pruning_a_two_process_trial_stops_every_rank_at_once(tmp_path, model_cache):
    trials = run_prune_sweep(tmp_path, model_cache, "launcher=ddp", "launcher.num_processes=2")
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert len(trials[0].intermediate_values) == 6  # reported once per step, by the main process only
    assert len(trials[1].intermediate_values) < 6
    log = (tmp_path / "outputs" / "sweeps" / "prune" / "trial_1" / "launch" / "children.log").read_text()
    assert "Traceback" not in log  # both ranks stopped cleanly at the same step
