"""Ctrl-C (SIGINT) and SIGTERM during a run, a grid, a sweep and a multi-process job; resuming a run.

Every test drives the real CLI in a subprocess of its own session and syncs on real state (a line in
history.jsonl, a RUNNING trial in the study), never on sleeps. A terminal's Ctrl-C goes to the whole
foreground process group: `os.killpg(proc.pid, SIGINT)`; `kill`, Slurm and systemd send SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_lab import interrupts
from grpo_lab.launch.processes import alive, descendants
from wandb_files import find_runs, read_run

from conftest import DDP, FAST, cli_env, compose, load_study, run_cli, trials_if_ready

CLI = [sys.executable, "-m", "grpo_lab"]
LONG = [*FAST, "max_steps=500"]  # long enough that the signal always lands mid-training


def _start(args: list[str], cwd: Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, *args],
        cwd=cwd,
        env=cli_env(cache),
        stdout=(cwd / "cli.out").open("w"),
        stderr=(cwd / "cli.err").open("w"),
        start_new_session=True,
    )


def _output(cwd: Path) -> str:
    return (cwd / "cli.err").read_text()[-4000:]


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen, cwd: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"exited {proc.returncode} too early:\n{_output(cwd)}"
        assert time.monotonic() < deadline, f"timed out:\n{_output(cwd)}"
        time.sleep(0.1)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _training(folder_glob: str, cwd: Path) -> Callable[[], bool]:
    """True once a run folder matching the glob has logged a training step (history.jsonl has a line)."""
    return lambda: any(_lines(p) for p in cwd.glob(f"{folder_glob}/history.jsonl"))


def _finish(proc: subprocess.Popen, cwd: Path, timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = _what_is_left(proc.pid)  # before the kill: where each process waits
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"still running {timeout} s after the signal:\n{_output(cwd)}\n{left}")


def _what_is_left(pid: int) -> str:
    """The command's process tree (pid, parent, state, command line) and, where py-spy is installed, each Python
    process's stacks: what a command that does not end after a signal is waiting for."""
    import psutil

    spy = Path(sys.executable).with_name("py-spy")  # a dev dependency
    root = psutil.Process(pid)
    lines = ["processes left:"]
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            lines.append(f"  {process.pid} <- {process.ppid()} {process.status()}: {' '.join(process.cmdline())[:160]}")
            if spy.exists() and "python" in process.name():
                dump = subprocess.run([str(spy), "dump", "--pid", str(process.pid)], capture_output=True, text=True)
                lines.append(dump.stdout[-3000:])
    return "\n".join(lines)


def _wandb_exit(run_dir: Path) -> tuple[str, str, int | None]:
    """(run id, state, exit code) of the run folder's one offline W&B run."""
    (path,) = find_runs(run_dir)
    wandb = Path(sys.executable).parent / "wandb"
    out = subprocess.run(
        [str(wandb), "leet", "inspect", "--summary", "--json", str(path)], capture_output=True, text=True, timeout=120
    )
    summary = json.loads(out.stdout)
    return summary["run_id"], summary["state"], summary.get("exit_code")


def _assert_interrupted(run_dir: Path, signame: str) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "interrupted", metrics.get("error")
    assert metrics["interrupted"]["signal"] == signame
    logged = [r["step"] for r in _lines(run_dir / "history.jsonl")]
    assert logged and metrics["interrupted"]["step"] >= logged[-1] >= 1
    return metrics


# ------------------------------------------------------------------------------------- in-process
def test_sigterm_raises_interrupted_and_later_signals_only_log():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(interrupts.Interrupted) as caught, interrupts.handling():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here, at once
    assert caught.value.signum == signal.SIGTERM and interrupts.exit_code_for(caught.value) == 143
    assert isinstance(caught.value, KeyboardInterrupt)  # Hydra's job runner lets it through, as Ctrl-C
    assert interrupts.exit_code_for(KeyboardInterrupt()) == 130 and interrupts.exit_code_for(ValueError()) is None
    with interrupts.handling():
        with pytest.raises(interrupts.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal while stopping: logged, not raised
        time.sleep(0.1)
        assert interrupts.received() == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_signal_during_a_study_call_raises_once_the_call_is_over(tmp_path):
    """Raised in the middle of a database call, the signal could leave a SQLite read unfinished, holding its shared
    lock: every other process's write then waited on it (a sweep's parent hung in its commit). Inside deferred() the
    call ends first and the signal raises after it, once, at the outermost block's end."""
    import optuna

    url = f"sqlite:///{tmp_path}/study.db"
    trial = optuna.create_study(storage=url, study_name="s").ask()
    done = []
    with interrupts.handling(), pytest.raises(interrupts.Interrupted) as caught, interrupts.deferred():
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler has run meanwhile, and held the signal back
            trial.report(0.5, 1)
            done.append("inner")
        done.append("outer")  # an inner block's end does not raise either
    assert caught.value.signum == signal.SIGINT and done == ["inner", "outer"]
    with interrupts.handling(), interrupts.deferred():
        pass  # a new scope: the old signal is gone
    (found,) = optuna.load_study(study_name="s", storage=url).trials
    assert found.intermediate_values == {1: 0.5}


# ----------------------------------------------------------------------------------------- one run
def test_ctrl_c_records_the_step_and_exits_130(tmp_path, model_cache):
    proc = _start(LONG, tmp_path, model_cache)
    _wait_for(_training("outputs/runs/*/*", tmp_path), proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    assert _finish(proc, tmp_path) == 130, _output(tmp_path)
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    metrics = _assert_interrupted(run_dir, "SIGINT")
    run_id, state, exit_code = _wandb_exit(run_dir)
    assert (state, exit_code) == ("failed", 130) and metrics["wandb"]["run_id"] == run_id
    assert "Traceback" not in _output(tmp_path)


def test_sigterm_records_the_run_exits_143_and_it_resumes_from_the_last_checkpoint(tmp_path, model_cache):
    checkpoints = ["trainer.save_strategy=steps", "trainer.save_steps=1"]
    proc = _start([*LONG, *checkpoints], tmp_path, model_cache)
    _wait_for(
        lambda: bool(list(tmp_path.glob("outputs/runs/*/*/trainer/checkpoint-*/trainer_state.json"))), proc, tmp_path
    )
    proc.send_signal(signal.SIGTERM)  # `kill PID`
    assert _finish(proc, tmp_path) == 143, _output(tmp_path)
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    step = _assert_interrupted(run_dir, "SIGTERM")["interrupted"]["step"]
    assert _wandb_exit(run_dir)[1:] == ("failed", 143)
    assert f"resume={run_dir}" in _output(tmp_path)  # the log says how to continue
    last = max(int(p.name.split("-")[1]) for p in (run_dir / "trainer").glob("checkpoint-*"))
    assert last <= step

    proc = run_cli([*FAST, *checkpoints, f"resume={run_dir}", f"max_steps={last + 2}"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["resumed_from"]["step"] == last
    assert [r["step"] for r in _lines(run_dir / "history.jsonl")] == list(range(1, last + 3))


def test_resume_continues_the_history_and_the_wandb_run(tmp_path, model_cache):
    checkpoints = ["trainer.save_strategy=steps", "trainer.save_steps=2"]
    first = run_cli([*FAST, "max_steps=4", *checkpoints], tmp_path, model_cache)
    assert first.returncode == 0, first.stderr[-4000:]
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    old_id = json.loads((run_dir / "metrics.json").read_text())["wandb"]["run_id"]

    proc = run_cli([*FAST, "max_steps=6", *checkpoints, f"resume={run_dir}"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["metrics"]["train/steps"] == 6
    assert metrics["resumed_from"] == {"checkpoint": str(run_dir / "trainer" / "checkpoint-4"), "step": 4}
    assert [r["step"] for r in _lines(run_dir / "history.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "trainer" / "checkpoint-6").is_dir()
    # One W&B run id, in two offline sessions: the resumed one logs steps 5 and 6.
    runs = [read_run(p) for p in find_runs(run_dir)]
    assert [r.run_id for r in runs] == [old_id, old_id] and metrics["wandb"]["run_id"] == old_id
    assert runs[1].name == runs[0].name == metrics["run_name"]  # not renamed after `resume=...`
    assert [r["train/global_step"] for r in runs[1].history if "train/reward" in r] == [5, 6]


def test_resume_without_a_folder_or_a_checkpoint_fails_in_one_line(tmp_path, model_cache):
    proc = run_cli([*FAST, f"resume={tmp_path / 'nope'}"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1 and f"resume={tmp_path / 'nope'}: no such run folder." in proc.stderr
    (tmp_path / "run").mkdir()
    proc = run_cli([*FAST, f"resume={tmp_path / 'run'}"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1 and "not a run folder (it has neither job.json nor config.yaml)" in proc.stderr
    # A folder of an earlier release (config.yaml, no job.json) without checkpoints.
    OmegaConf.save(compose(["experiment=smoke"]), tmp_path / "run" / "config.yaml", resolve=True)
    proc = run_cli([*FAST, f"resume={tmp_path / 'run'}"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    expected = f"no checkpoint in {tmp_path / 'run' / 'trainer'} (a run keeps them with trainer.save_strategy=steps"
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml"]  # nothing written there


# ------------------------------------------------------------------------------ grid, sweep, processes
def test_ctrl_c_stops_a_grid_and_records_the_current_job(tmp_path, model_cache):
    proc = _start(["-m", *LONG, "lr=1e-5,2e-5"], tmp_path, model_cache)
    _wait_for(_training("outputs/multirun/*/*/0", tmp_path), proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    assert _finish(proc, tmp_path) == 130, _output(tmp_path)
    (sweep_dir,) = tmp_path.glob("outputs/multirun/*/*")
    _assert_interrupted(sweep_dir / "0", "SIGINT")
    assert not (sweep_dir / "1").exists()  # the grid stopped: the second job never started


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("launcher", "to_group"),
    [
        (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], False),
        (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], True),
        (["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"], False),
    ],
    ids=["joblib", "joblib-group", "submitit_local"],
)
def test_every_trial_in_a_worker_process_ends_recorded_after_ctrl_c(tmp_path, model_cache, launcher, to_group):
    """A launcher that runs the trials in worker processes: the command sends the signal on and waits for them,
    instead of unwinding at once (which ended the workers before they recorded their runs)."""
    from optuna.trial import TrialState

    args = ["-m", "sweep=lr_beta", *LONG, *launcher, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=2"]
    proc = _start(args, tmp_path, model_cache)
    _wait_for(lambda: all(_training(f"outputs/sweeps/lr_beta/trial_{n}", tmp_path)() for n in (0, 1)), proc, tmp_path)
    if to_group:  # a terminal's Ctrl-C reaches every process of the group
        os.killpg(proc.pid, signal.SIGINT)
    else:  # `kill -INT` of the command alone
        proc.send_signal(signal.SIGINT)
    assert _finish(proc, tmp_path) == 130, _output(tmp_path)
    assert "Traceback" not in (tmp_path / "cli.err").read_text().split("Stopped by")[-1]
    for number in (0, 1):
        run_dir = tmp_path / "outputs" / "sweeps" / "lr_beta" / f"trial_{number}"
        _assert_interrupted(run_dir, "SIGINT")
        assert _wandb_exit(run_dir)[1:] == ("failed", 130)  # its W&B run closed
    trials = load_study(tmp_path, "lr_beta").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all(t.user_attrs["error"].startswith("interrupted by SIGINT at step") for t in trials)


@pytest.mark.heavy
def test_every_job_of_a_joblib_grid_ends_recorded_after_ctrl_c(tmp_path, model_cache):
    args = ["-m", *LONG, "lr=1e-5,2e-5", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=grid"]
    proc = _start(args, tmp_path, model_cache)
    _wait_for(lambda: all(_training(f"grid/{n}", tmp_path)() for n in (0, 1)), proc, tmp_path)
    proc.send_signal(signal.SIGINT)
    assert _finish(proc, tmp_path) == 130, _output(tmp_path)
    for number in (0, 1):
        _assert_interrupted(tmp_path / "grid" / str(number), "SIGINT")
        assert _wandb_exit(tmp_path / "grid" / str(number))[1:] == ("failed", 130)


@pytest.mark.heavy
def test_ctrl_c_fails_the_running_trial_and_the_same_command_resumes_the_sweep(tmp_path, model_cache):
    from optuna.trial import TrialState

    # 30 steps: the signal lands mid-training; 1 trial: the resumed sweep stays short on a loaded machine.
    args = ["-m", "sweep=lr_beta", *FAST, "max_steps=30", "hydra.sweeper.n_trials=1", "hydra/sweeper/pruner=none"]
    db = tmp_path / "outputs" / "sweeps" / "optuna.db"
    running: list[int] = []

    def a_trial_trains() -> bool:
        if not db.exists():
            return False
        trials = trials_if_ready(lambda: load_study(tmp_path, "lr_beta"))
        if trials is None:  # the study is not created yet
            return False
        history = tmp_path / "outputs" / "sweeps" / "lr_beta" / "trial_{}" / "history.jsonl"
        running[:] = [
            t.number for t in trials if t.state == TrialState.RUNNING and _lines(Path(str(history).format(t.number)))
        ]
        return bool(running)

    proc = _start(args, tmp_path, model_cache)
    _wait_for(a_trial_trains, proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    assert _finish(proc, tmp_path) == 130, _output(tmp_path)
    trials = load_study(tmp_path, "lr_beta").trials
    interrupted = trials[running[0]]
    assert interrupted.state == TrialState.FAIL and "interrupted" in interrupted.user_attrs.get("error", "")
    assert not [t for t in trials if t.state == TrialState.RUNNING]

    again = run_cli(args, tmp_path, model_cache, timeout=600)  # the same command again
    assert again.returncode == 0, again.stderr[-4000:]
    trials = load_study(tmp_path, "lr_beta").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]  # the FAIL one is not counted


@pytest.mark.heavy
def test_sigterm_to_a_multi_process_job_ends_every_child_within_10_s(tmp_path, model_cache):
    proc = _start([*DDP, "max_steps=500"], tmp_path, model_cache)
    _wait_for(_training("outputs/runs/*/*", tmp_path), proc, tmp_path)
    children = descendants(proc.pid)
    assert len(children) >= 3, children  # accelerate's launcher and two ranks
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        while any(alive(p) for p in children) and time.monotonic() < signalled + 10:
            time.sleep(0.1)
        assert not [p for p in children if alive(p)], "children left 10 s after SIGTERM"
        assert _finish(proc, tmp_path) == 143, _output(tmp_path)
    finally:
        for p in descendants(proc.pid) | children:
            if alive(p):
                p.kill()
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    _assert_interrupted(run_dir, "SIGTERM")  # recorded by the main rank
    assert _wandb_exit(run_dir)[1:] == ("failed", 143)
