"""One job on several processes: the Hydra job (the parent) starts `accelerate launch` children.

The parent has composed and validated the config already; it writes the resolved config into the job
folder, the children (`python -m grpo_lab.launch.child`) run exactly that (they never compose again
nor start a sweep), the main child writes the result, and the parent returns it to Hydra.

No child outlives its job. Children run in their own session, so a terminal's Ctrl-C reaches only the
parent, which forwards SIGINT/SIGTERM to the `accelerate launch` process group (torchrun's agent passes
it on to the ranks, which record the run as interrupted), waits up to `STOP_GRACE_S`, then kills every
descendant still there, and re-raises the interrupt (the CLI exits 130/143). If the parent dies
outright (SIGKILL), each rank notices through a watchdog on the parent's pid (grpo_lab.interrupts)
and stops by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from grpo_lab import interrupts
from grpo_lab.config import JobSpec, LauncherConfig, RunConfig
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.launch.machines import Machines
from grpo_lab.net import free_port

log = logging.getLogger("grpo_lab")

ACCELERATE_CONFIGS = Path(__file__).parent / "accelerate"
_TAIL_LINES = 40
# After forwarding an interrupt: how long the children get to record the run and exit, before SIGKILL.
STOP_GRACE_S = 8.0


class LaunchError(GrpoLabError):
    """The children of a multi-process job failed."""


def accelerate_config(name: str) -> Path:
    path = Path(name)
    if not path.is_absolute() and not path.exists():
        path = ACCELERATE_CONFIGS / name
    if not path.exists():
        shipped = ", ".join(sorted(p.name for p in ACCELERATE_CONFIGS.glob("*.yaml")))
        raise ConfigError(f"accelerate config file {name!r} not found (shipped: {shipped}).")
    return path


def visible_gpus(cuda_visible_devices: str | None, device_count: int) -> list[str]:
    """The GPU ids this job may hand out: CUDA_VISIBLE_DEVICES when set, else all the devices."""
    if cuda_visible_devices is not None:
        return [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
    return [str(i) for i in range(device_count)]


def assign_gpus(slot: int, gpus_per_job: int, visible: list[str]) -> list[str]:
    """The GPUs of concurrent job number `slot`: disjoint blocks of `gpus_per_job`, e.g. 8 GPUs and 2 per job
    give slots 0..3 the blocks 0-1, 2-3, 4-5, 6-7 (slot 4 reuses 0-1: by then slot 0 has finished)."""
    if gpus_per_job > len(visible):
        raise ConfigError(
            f"`launcher.gpus_per_job={gpus_per_job}` but this machine has {len(visible)} GPU(s) visible "
            f"({','.join(visible) or 'none'}): lower it, or set it to null on a CPU-only machine."
        )
    slots = len(visible) // gpus_per_job
    start = (slot % slots) * gpus_per_job
    return visible[start : start + gpus_per_job]


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def command(launcher: LauncherConfig, machines: Machines, job_file: Path, port: int) -> list[str]:
    """This machine's `accelerate launch`: --num_processes counts every machine's processes."""
    several = [
        "--num_machines", str(machines.num_machines),
        "--machine_rank", str(machines.machine_rank),
        "--main_process_ip", str(machines.main_process_ip),
    ] if machines.several else []  # fmt: skip
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config(launcher.config_file or "ddp.yaml")),
        "--num_processes", str(launcher.num_processes),
        *several,
        "--main_process_port", str(port),
        *launcher.extra_args,
        "-m", "grpo_lab.launch.child", str(job_file),
    ]  # fmt: skip


def descendants(pid: int) -> set[psutil.Process]:
    """Every live process below `pid`."""
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return set()


def alive(process: psutil.Process) -> bool:
    """Whether `process` still runs: a zombie has ended (an orphan's may wait to be reaped)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(process: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        process.send_signal(sig)  # psutil checks the pid was not reused


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_children(proc: subprocess.Popen, signum: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> None:
    """Forward `signum` to the launcher's process group and give every process below it `grace_s` to exit
    (the ranks record the run, W&B flushes), then SIGKILL what is left: the group and each process below
    (torchrun starts every rank in a session of its own)."""
    if proc.poll() is not None:
        return
    below = descendants(proc.pid)
    _signal_group(proc.pid, signum)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is None:
            below |= descendants(proc.pid)  # kept: a process whose parent exits is reparented out of this tree
        elif not any(alive(p) for p in below):
            return
        time.sleep(0.1)
    left = sorted((p for p in below if alive(p)), key=lambda p: p.pid)
    pids = [p.pid for p in left]
    log.warning("Children still running %.0f s after %s: killing %s.", grace_s, interrupts.signal_name(signum), pids)
    _signal_group(proc.pid, signal.SIGKILL)
    for process in left:
        _signal(process, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("The launcher process %d did not exit after SIGKILL.", proc.pid)


def run_children(spec: JobSpec, machines: Machines, *, slot: int, env: dict[str, str]) -> Any:
    """Run this machine's share of the job's `launcher.num_processes` processes; returns the main child's
    RunResult, or None on a machine other than 0 when its processes finished (machine 0 records the run).
    SIGINT/SIGTERM meanwhile: the children are stopped, then `interrupts.Interrupted` is raised."""
    with interrupts.handling():
        return _run_children(spec, machines, slot=slot, env=env)


def _run_children(spec: JobSpec, machines: Machines, *, slot: int, env: dict[str, str]) -> Any:
    from grpo_lab import models
    from grpo_lab.run.folder import RunFolder

    cfg, folder = spec.run, RunFolder(spec.run_dir)
    # Machines that share a file system (Slurm's nodes) may share the run folder: one launch folder each.
    launch_dir = spec.run_dir / "launch" / (f"machine{machines.machine_rank}" if machines.several else "")
    launch_dir.mkdir(parents=True, exist_ok=True)
    models.prepare(cfg.model, spec.cache_dir)  # convert/build once here, not once per process
    # The main child records the run in metrics.json, as a single-process run does: that is the result.
    # A resumed run's old metrics.json stays until then (the children read its W&B id); only a fresh one counts.
    stale = folder.metrics_file.read_bytes() if folder.metrics_file.exists() else None
    job_file = _write_job(spec, launch_dir)
    argv = command(cfg.launcher, machines, job_file, machines.main_process_port or free_port())
    if machines.several:
        log.info("This is %s.", machines.describe())
    log.info("Launching %d process(es): %s", cfg.launcher.num_processes // machines.num_machines, " ".join(argv))
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    try:
        try:
            code = _wait_for_children(argv, launch_dir, _child_env(cfg, env, slot), tail)
        finally:
            job_file.unlink(missing_ok=True)  # its secrets stay on disk only while the children run
    except BaseException as e:
        untouched = spec.run.resume is not None and stale is not None  # a resume that restored the run's record
        if (signum := interrupts.signal_of(e)) is not None and machines.is_main and not folder.recorded_since(stale):
            if untouched:
                raise
            # The main child records an interrupted run itself; if it could not (it was killed, or stopped before
            # training began), the parent writes the record, with the last step in history.jsonl.
            folder.record_lost_run(spec, status="interrupted", signum=signum)
        raise
    if not machines.is_main:
        if code == 0:
            return None
        raise LaunchError(
            f"The training processes of machine {machines.machine_rank} failed (exit code {code}); machine 0 "
            f"records the run. Last lines of {launch_dir / 'children.log'}:\n" + "\n".join(tail)
        )
    fresh = folder.recorded_since(stale)
    if not fresh and code != 0 and spec.run.resume is None:  # died without a word (killed, out of memory)
        signalled = [line.strip() for line in tail if "Signal " in line and "received by PID" in line]
        cause = f" ({signalled[0].removeprefix('traceback : ')})" if signalled else ""
        error = f"the training processes ended with exit code {code}{cause}"
        folder.record_lost_run(spec, status="failed", error=error)
    return _result(cfg, folder.read_result() if fresh else None, code, launch_dir / "children.log", tail)


def _wait_for_children(argv: list[str], launch_dir: Path, env: dict[str, str], tail: deque[str]) -> int:
    """Start the launcher, pump its output to the console and children.log, and wait: its exit code. Interrupted,
    it stops the children (with the signal it got) before raising."""
    with (launch_dir / "children.log").open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only: it forwards it
        )
        (launch_dir / "children.pid").write_text(str(proc.pid))
        pump = threading.Thread(target=_pump, args=(proc, log_file, tail), daemon=True)
        pump.start()
        try:
            return proc.wait()
        except BaseException as e:
            stop_children(proc, interrupts.signal_of(e) or signal.SIGTERM)
            pump.join(timeout=5)
            raise
        finally:
            pump.join(timeout=10)


def _child_env(cfg: RunConfig, env: dict[str, str], slot: int) -> dict[str, str]:
    """The children's environment: the parent's, with this job slot's GPUs when `launcher.gpus_per_job` is set."""
    child_env = dict(env)
    if cfg.launcher.gpus_per_job is not None:
        gpus = assign_gpus(
            slot, cfg.launcher.gpus_per_job, visible_gpus(env.get("CUDA_VISIBLE_DEVICES"), _cuda_count())
        )
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        log.info("Job slot %d: GPUs %s", slot, child_env["CUDA_VISIBLE_DEVICES"])
    return child_env


def _write_job(spec: JobSpec, launch_dir: Path) -> Path:
    """launch/job.json: what every child runs, the job spec as the parent built it (the children never compose or
    check again). It holds the config's secrets, which the children need: readable by this user only, and removed
    when the children have ended; the run folder's job.json is the record, with its secrets masked."""
    from grpo_lab import files

    job = {"spec": spec.as_json(), "parent_pid": os.getpid()}  # the children stop if this process dies
    job_file = launch_dir / "job.json"
    files.write_private_json(job_file, job)
    return job_file


def _result(cfg: RunConfig, result: Any, code: int, log_path: Path, tail: deque[str]) -> Any:
    """The main child's RunResult when the job finished; TrialPruned or a LaunchError with the log's tail."""
    if result is not None and result.status == "pruned":
        import optuna

        raise optuna.TrialPruned(result.error or "pruned")
    if result is not None and code == 0 and result.status == "finished":
        return result
    reason = f": {result.error}" if result is not None and result.error else ""
    message = "\n".join(tail)
    raise LaunchError(
        f"The {cfg.launcher.num_processes} training processes failed (exit code {code}){reason}; "
        f"last lines of {log_path}:\n{message}"
    )


def _pump(proc: subprocess.Popen, log_file: Any, tail: deque[str]) -> None:
    """Children's output to the job's stderr (progress bars live) and to children.log."""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        log_file.write(line)
        tail.append(line.rstrip())
    log_file.flush()
