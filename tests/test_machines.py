"""One job across machines: which machine this is (from the config, Slurm, or submitit's local tasks), and two
"machines" on loopback (two commands with machine ranks 0 and 1, gloo) that train one job, record it once, and
end together when either one crashes or is interrupted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo_lab.config import LauncherConfig
from grpo_lab.errors import ConfigError
from grpo_lab.launch.machines import DEFAULT_PORT, expand_nodelist, resolve
from grpo_lab.launch.processes import alive, descendants
from grpo_lab.net import free_port
from wandb_files import find_runs, read_run

from conftest import FAST, cli_env, one_line_naming

DDP_LAUNCHER = dict(
    kind="accelerate", num_processes=2, config_file="ddp.yaml", gpus_per_job=None, main_process_port=None,
    num_machines=None, machine_rank=None, main_process_ip=None, extra_args=[],
)  # fmt: skip
# What srun gives each task of a 2-node, 1-task-per-node step (what submitit_slurm runs the job in).
SLURM_STEP = {
    "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
}  # fmt: skip


def launcher(**overrides) -> LauncherConfig:
    return LauncherConfig(**{**DDP_LAUNCHER, **overrides})


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b3,c[08-10]", ["a1", "a2", "b3", "c08", "c09", "c10"]),
        ("node17", ["node17"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
    ],
)
def test_slurm_node_lists_expand_as_scontrol_does(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_one_machine_by_default_with_a_free_port_per_job():
    machines = resolve(launcher(), {})
    assert (machines.num_machines, machines.machine_rank, machines.main_process_port) == (1, 0, None)
    assert not machines.several and machines.is_main


def test_the_config_names_the_machines():
    machines = resolve(launcher(num_machines=2, machine_rank=1, main_process_ip="10.0.0.5"), {})
    assert (machines.num_machines, machines.machine_rank) == (2, 1) and not machines.is_main
    assert (machines.main_process_ip, machines.main_process_port, machines.source) == (
        "10.0.0.5",
        DEFAULT_PORT,
        "config",
    )


def test_inside_a_slurm_step_the_nulls_take_slurms_values():
    machines = resolve(launcher(), SLURM_STEP)
    assert (machines.num_machines, machines.machine_rank, machines.main_process_ip) == (2, 1, "gpu07")
    assert machines.source == "slurm" and machines.main_process_port == 20000 + 123456 % 10000
    # What the user set wins over Slurm's value.
    assert (
        resolve(launcher(main_process_port=31000, main_process_ip="ib-gpu07"), SLURM_STEP).main_process_ip == "ib-gpu07"
    )
    # An sbatch script (no step) runs on one node: one machine there, whatever the allocation.
    assert resolve(launcher(), {k: v for k, v in SLURM_STEP.items() if "STEP" not in k}).num_machines == 1


def test_submitit_local_tasks_stand_in_for_machines_on_this_host():
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
           "SUBMITIT_LOCAL_JOB_ID": "4401"}  # fmt: skip
    machines = resolve(launcher(), env)
    assert (machines.num_machines, machines.machine_rank, machines.main_process_ip) == (2, 1, "127.0.0.1")
    assert machines.main_process_port == 24401 and machines.source == "submitit_local"


@pytest.mark.parametrize(
    ("overrides", "env", "named"),
    [
        ({"num_machines": 2, "machine_rank": 0}, {}, ["launcher.main_process_ip"]),
        ({"num_machines": 2, "machine_rank": 2, "main_process_ip": "h"}, {}, ["launcher.machine_rank=2", "0 to 1"]),
        ({"num_machines": 3, "machine_rank": 0, "main_process_ip": "h"}, {}, ["launcher.num_processes=2", "of 3"]),
        ({"kind": "local", "num_processes": 1, "config_file": None, "num_machines": 2}, {}, ["launcher=ddp"]),
        ({"machine_rank": 1}, {}, ["launcher.machine_rank=1", "one machine"]),
        ({}, {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "16"}, ["16 tasks on 2 node", "tasks_per_node=1"]),
    ],
)
def test_a_wrong_topology_fails_in_one_line_naming_the_fix(overrides, env, named):
    with pytest.raises(ConfigError) as error:
        resolve(launcher(**overrides), env)
    one_line_naming(error.value, *named)


# ------------------------------------------------------------------------------------ two machines, loopback
MACHINE_ARGS = [
    "launcher=ddp",
    "launcher.num_processes=2",
    "launcher.num_machines=2",
    "launcher.main_process_ip=127.0.0.1",
]


def start_machines(
    tmp_path: Path, cache: Path, *extra: str, only: dict[int, list[str]] | None = None
) -> list[subprocess.Popen]:
    """The same command on two "machines" (folders of their own, as on hosts without a shared disk); `only`: more
    overrides for one machine's command."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        cwd = tmp_path / f"machine{rank}"
        cwd.mkdir()
        args = [*FAST, *MACHINE_ARGS, f"launcher.main_process_port={port}", f"launcher.machine_rank={rank}", *extra]
        args += (only or {}).get(rank, [])
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "grpo_lab", *args],
                cwd=cwd,
                env=cli_env(cache),
                stdout=(cwd / "stdout").open("w"),
                stderr=(cwd / "stderr").open("w"),
                start_new_session=True,
            )
        )
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[float]:
    """Seconds until each process exited, from now."""
    start, ended = time.monotonic(), [float("nan")] * len(procs)
    while time.monotonic() - start < timeout and any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            if p.poll() is not None and ended[i] != ended[i]:
                ended[i] = time.monotonic() - start
        time.sleep(0.1)
    for i, p in enumerate(procs):
        if p.poll() is not None and ended[i] != ended[i]:
            ended[i] = time.monotonic() - start
    return ended


def metrics_files(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.rglob("metrics.json"))


@pytest.mark.heavy
def test_two_machines_on_loopback_train_one_job_recorded_once(tmp_path, model_cache):
    procs = start_machines(tmp_path, model_cache)
    try:
        wait_all(procs, timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = [(tmp_path / f"machine{r}" / "stdout").read_text() for r in (0, 1)]
    assert [p.returncode for p in procs] == [0, 0], (tmp_path / "machine1" / "stderr").read_text()[-3000:]
    assert "finished ==" in out[0] and "machine 0 records the run" in out[1]
    (metrics_file,) = metrics_files(tmp_path)  # machine 0's; machine 1 records nothing of its own
    assert metrics_file.is_relative_to(tmp_path / "machine0")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "finished" and metrics["metrics"]["train/steps"] == 2
    (run,) = [read_run(p) for p in find_runs(tmp_path)]  # one W&B run, for the whole world
    assert run.config["world_size"] == 2
    assert [r["train/global_step"] for r in run.history if "train/reward" in r] == [1, 2]
    # Each machine launched its own share: one process each, told the job's size and its rank.
    for rank in (0, 1):
        log = (tmp_path / f"machine{rank}" / "stderr").read_text()
        assert f"This is machine {rank} of 2, main process at 127.0.0.1:" in log
        assert f"--num_processes 2 --num_machines 2 --machine_rank {rank} --main_process_ip 127.0.0.1" in log


@pytest.mark.heavy
def test_machines_started_with_different_settings_stop_before_training_naming_the_key(tmp_path, model_cache):
    procs = start_machines(tmp_path, model_cache, only={1: ["lr=3e-5"]})
    try:
        wait_all(procs, timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [1, 1]
    for rank in (0, 1):
        logs = (tmp_path / f"machine{rank}" / "stderr").read_text()
        logs += "".join(p.read_text() for p in (tmp_path / f"machine{rank}").rglob("children.log"))
        assert "`lr` is 3e-05 in process 1 and 0.0001 in process 0" in logs, logs[-3000:]
    assert not [f for f in metrics_files(tmp_path) if json.loads(f.read_text())["status"] == "finished"]


# How long a process of the job may outlive both machines' commands (the bound test_launch's parent-kill test uses).
LEFTOVER_S = 30.0


def _alive_after(processes: set[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of `processes` still running `seconds` from now (returns as soon as none is)."""
    deadline = time.monotonic() + seconds
    while (running := [p for p in processes if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running


def _rank_process(parent: psutil.Process) -> psutil.Process:
    """A machine's training process (not accelerate's launcher, whose command line names the module too)."""
    (rank,) = [
        p for p in parent.children(recursive=True)
        if "grpo_lab.launch.child" in (line := " ".join(p.cmdline())) and "accelerate" not in line
    ]  # fmt: skip
    return rank


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("where", "how"),
    [
        (1, "crash"),  # machine 1's training process dies (kill -9): machine 0's rank sees its peer gone
        (0, "crash"),  # the main process dies: its parent records the run
        pytest.param(1, "ctrl-c", marks=pytest.mark.slow),  # in CI: machine 0's Ctrl-C, and the crashes
        (0, "ctrl-c"),
    ],
)
def test_a_crash_or_ctrl_c_on_either_machine_ends_both_recorded_once(tmp_path, model_cache, where, how):
    procs = start_machines(tmp_path, model_cache, "max_steps=500")
    below: set[psutil.Process] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not list(tmp_path.rglob("history.jsonl")):
            assert all(p.poll() is None for p in procs), "a machine ended before training"
            time.sleep(0.3)
        time.sleep(1.0)  # a few steps in, on both machines
        below = descendants(procs[0].pid) | descendants(procs[1].pid)
        if how == "crash":
            _rank_process(psutil.Process(procs[where].pid)).kill()
        else:
            procs[where].send_signal(signal.SIGINT)
        ended = wait_all(procs, timeout=60)
        # Read before the clean-up below kills what is left. A killed rank's W&B service (wandb-core and its
        # system monitor) is not ours to stop: it sees its client gone and exits by itself, within seconds.
        left = _alive_after(below, LEFTOVER_S)
    finally:
        for p in [*procs, *below]:
            if (p.poll() is None) if isinstance(p, subprocess.Popen) else alive(p):
                p.kill()
    # Both machines ended soon (gloo notices a closed peer connection at once; ddp_timeout is for a peer
    # that hangs), with no process left, and the run is recorded once, by machine 0.
    assert max(ended) < 30, ended
    assert not left, left
    codes = [p.returncode for p in procs]
    assert codes[where] == (130 if how == "ctrl-c" else 1) and codes[1 - where] != 0, codes
    (metrics_file,) = metrics_files(tmp_path)
    metrics = json.loads(metrics_file.read_text())
    if (where, how) == (0, "ctrl-c"):
        assert metrics["status"] == "interrupted" and metrics["interrupted"]["signal"] == "SIGINT"
    elif where == 0:  # killed: its parent wrote the record, with the signal torchrun saw
        assert metrics["status"] == "failed" and "SIGKILL" in metrics["error"] and metrics["failed"]["step"] >= 1
    else:  # the main process was fine: it says a peer ended first
        assert metrics["status"] == "failed" and metrics["error"].startswith("another process of the job ended")


@pytest.mark.heavy
def test_a_sweep_trial_across_two_submitit_tasks_gives_one_objective(tmp_path, model_cache):
    """What `hydra/launcher=submitit_slurm hydra.launcher.nodes=2` does on a cluster, on this host: submitit runs
    the whole job in each task (here submitit_local's two tasks, each one "machine"), the tasks share the trial's
    run folder, and the sweeper gets task 0's result."""
    import optuna

    args = [
        "-m", "sweep=lr_beta", *FAST, "launcher=ddp", "launcher.num_processes=2", "hydra.sweeper.n_trials=1",
        "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "hydra.launcher.tasks_per_node=2",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_lab", *args],
        cwd=tmp_path, env=cli_env(model_cache), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = optuna.load_study(study_name="lr_beta", storage=f"sqlite:///{tmp_path / 'outputs/sweeps/optuna.db'}")
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None
    run_dir = tmp_path / "outputs" / "sweeps" / "lr_beta" / "trial_0"
    assert sorted(p.name for p in (run_dir / "launch").iterdir()) == ["machine0", "machine1"]
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "finished"
    (run,) = [read_run(p) for p in find_runs(run_dir)]
    assert run.config["world_size"] == 2
    logs = "".join(p.read_text() for p in (run_dir.parent / ".submitit").rglob("*_log.*"))
    for rank in (0, 1):
        assert f"This is machine {rank} of 2 (submitit_local), main process at 127.0.0.1:" in logs
