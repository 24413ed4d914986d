"""One job on several processes: the Hydra job (the parent) starts `accelerate launch` children.

The parent has composed and validated the config already; it writes the resolved config into the job
folder, the children (`python -m grpo_lab.launch_child`) run exactly that (they never compose again
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
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from grpo_lab import interrupts
from grpo_lab.config import LauncherConfig, RunConfig
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.machines import Machines

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        "-m", "grpo_lab.launch_child", str(job_file),
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


def run_children(cfg: RunConfig, ctx: Any, machines: Machines, *, slot: int, env: dict[str, str]) -> Any:
    """Run this machine's share of the job's `launcher.num_processes` processes; returns the main child's
    RunResult, or None on a machine other than 0 when its processes finished (machine 0 records the run).
    SIGINT/SIGTERM meanwhile: the children are stopped, then `interrupts.Interrupted` is raised."""
    with interrupts.handling():
        return _run_children(cfg, ctx, machines, slot=slot, env=env)


def _run_children(cfg: RunConfig, ctx: Any, machines: Machines, *, slot: int, env: dict[str, str]) -> Any:
    from grpo_lab import models
    from grpo_lab.run_folder import RunFolder
    from grpo_lab.train import resume_context

    ctx, _ = resume_context(cfg, ctx)  # resume=<folder>: fails here, before launching, if it has no checkpoint
    # Machines that share a file system (Slurm's nodes) may share the run folder: one launch folder each.
    launch_dir = ctx.run_dir / "launch" / (f"machine{machines.machine_rank}" if machines.several else "")
    launch_dir.mkdir(parents=True, exist_ok=True)
    models.prepare(cfg.model, ctx.cache_dir)  # convert/build once here, not once per process
    # The main child records the run in metrics.json, as a single-process run does: that is the result.
    # A resumed run's old metrics.json stays until then (the children read its W&B id); only a fresh one counts.
    metrics_file = RunFolder(ctx.run_dir).metrics_file
    stale = metrics_file.read_bytes() if metrics_file.exists() else None
    argv = command(cfg.launcher, machines, _write_job(ctx, launch_dir), machines.main_process_port or free_port())
    if machines.several:
        log.info("This is %s.", machines.describe())
    log.info("Launching %d process(es): %s", cfg.launcher.num_processes // machines.num_machines, " ".join(argv))
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    with (launch_dir / "children.log").open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            argv,
            env=_child_env(cfg, env, slot),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only: it forwards it
        )
        (launch_dir / "children.pid").write_text(str(proc.pid))
        pump = threading.Thread(target=_pump, args=(proc, log_file, tail), daemon=True)
        pump.start()
        try:
            code = proc.wait()
        except BaseException as e:
            signum = interrupts.signal_of(e)
            stop_children(proc, signum or signal.SIGTERM)
            pump.join(timeout=5)
            if signum is not None and machines.is_main:
                _check_interrupted_record(cfg, ctx, metrics_file, stale, signum)
            raise
        finally:
            pump.join(timeout=10)
    if not machines.is_main:
        if code == 0:
            return None
        raise LaunchError(
            f"The training processes of machine {machines.machine_rank} failed (exit code {code}); machine 0 "
            f"records the run. Last lines of {launch_dir / 'children.log'}:\n" + "\n".join(tail)
        )
    fresh = metrics_file.exists() and metrics_file.read_bytes() != stale
    if not fresh and code != 0:  # the main process died without a word (killed, out of memory)
        signalled = [line.strip() for line in tail if "Signal " in line and "received by PID" in line]
        cause = f" ({signalled[0].removeprefix('traceback : ')})" if signalled else ""
        _record_missing(cfg, ctx, status="failed", error=f"the training processes ended with exit code {code}{cause}")
    return _result(
        cfg, RunFolder(ctx.run_dir).read_result() if fresh else None, code, launch_dir / "children.log", tail
    )


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


def _write_job(ctx: Any, launch_dir: Path) -> Path:
    """launch/job.json: what every child runs (the config as the parent composed and validated it)."""
    from grpo_lab import files

    job = {
        "config": ctx.resolved_config,
        "context": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(ctx).items()},
        "parent_pid": os.getpid(),  # the children stop if this process dies
    }
    job_file = launch_dir / "job.json"
    files.write_json(job_file, job, redact_secrets=False)  # the children need the real values
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


def _check_interrupted_record(cfg: RunConfig, ctx: Any, metrics_file: Path, stale: bytes | None, signum: int) -> None:
    """The main child records an interrupted run itself; if it could not (it was killed, or stopped before
    training began), the parent writes the record, with the last step in history.jsonl."""
    if metrics_file.exists() and metrics_file.read_bytes() != stale:
        return
    _record_missing(cfg, ctx, status="interrupted", signum=signum)


def _record_missing(
    cfg: RunConfig, ctx: Any, *, status: str, signum: int | None = None, error: str | None = None
) -> None:
    """metrics.json for a run whose main process left none: how it ended and the last step in history.jsonl."""
    from grpo_lab.run_folder import RunFolder, RunResult
    from grpo_lab.tracking import TrackerInfo, choose_mode

    folder = RunFolder(ctx.run_dir)
    rows = folder.read_history()
    step = rows[-1].get("step", 0) if rows else 0
    how = interrupts.signal_name(signum) if signum is not None else error
    log.warning("The main process left no record: %s says %s (%s) at step %d.", folder.metrics_file, status, how, step)
    result = RunResult(
        status=status,
        objective=float("nan"),
        objective_metric=cfg.objective.metric,
        metrics={},
        run_dir=ctx.run_dir,
        run_name=ctx.run_name,
        # The children's W&B run (their environment is ours), left unclosed by the kill.
        tracker=TrackerInfo(mode=choose_mode(cfg.logger), run_id=folder.wandb_run_id()),
        error=error,
    )
    if signum is not None:
        folder.write_metrics(result, interrupted={"signal": how, "step": step})
    else:
        folder.write_metrics(result, error=error, failed={"step": step})


def _pump(proc: subprocess.Popen, log_file: Any, tail: deque[str]) -> None:
    """Children's output to the job's stderr (progress bars live) and to children.log."""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        log_file.write(line)
        tail.append(line.rstrip())
    log_file.flush()
