"""One job on several processes: the Hydra job (the parent) starts `accelerate launch` children.

The parent has composed and validated the config already; it writes the resolved config into the job
folder, the children (`python -m grpo_lab.launch_child`) run exactly that (they never compose again
nor start a sweep), the main child writes the result, and the parent returns it to Hydra. Children run
in their own process group, which the parent ends if it is interrupted, and which the kernel signals
if the parent dies (PR_SET_PDEATHSIG), so no child outlives its job.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpo_lab.config import LauncherConfig, RunConfig
from grpo_lab.errors import ConfigError, GrpoLabError

log = logging.getLogger("grpo_lab")

ACCELERATE_CONFIGS = Path(__file__).parent / "accelerate"
_TAIL_LINES = 40


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


def command(launcher: LauncherConfig, job_file: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_config(launcher.config_file or "ddp.yaml")),
        "--num_processes", str(launcher.num_processes),
        "--main_process_port", str(port),
        *launcher.extra_args,
        "-m", "grpo_lab.launch_child", str(job_file),
    ]  # fmt: skip


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when the parent dies, even by SIGKILL."""
    with contextlib.suppress(OSError):  # not Linux: the process group is still ended on interrupts
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_children(cfg: RunConfig, ctx: Any, *, slot: int, env: dict[str, str]) -> Any:
    """Run the job on `launcher.num_processes` processes; returns the main child's RunResult."""
    from grpo_lab import models, records
    from grpo_lab.train import result_from_metrics

    launch_dir = ctx.run_dir / "launch"
    launch_dir.mkdir(parents=True, exist_ok=True)
    models.prepare(cfg.model, ctx.cache_dir)  # convert/build once here, not once per process
    child_env = dict(env)
    if cfg.launcher.gpus_per_job is not None:
        gpus = assign_gpus(
            slot, cfg.launcher.gpus_per_job, visible_gpus(env.get("CUDA_VISIBLE_DEVICES"), _cuda_count())
        )
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        log.info("Job slot %d: GPUs %s", slot, child_env["CUDA_VISIBLE_DEVICES"])
    port = cfg.launcher.main_process_port or free_port()
    job_file = launch_dir / "job.json"
    # The main child records the run in metrics.json, as a single-process run does: that is the result.
    metrics_file = ctx.run_dir / "metrics.json"
    metrics_file.unlink(missing_ok=True)
    job = {
        "config": ctx.resolved_config,  # the composed config, as the parent validated it
        "context": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(ctx).items()},
    }
    records.write_json(job_file, job)
    argv = command(cfg.launcher, job_file, port)
    log.info("Launching %d processes: %s", cfg.launcher.num_processes, " ".join(argv))
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    with (launch_dir / "children.log").open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            argv,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        (launch_dir / "children.pid").write_text(str(proc.pid))
        pump = threading.Thread(target=_pump, args=(proc, log_file, tail), daemon=True)
        pump.start()
        previous = signal.getsignal(signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)
            pump.join(timeout=10)
    result = result_from_metrics(json.loads(metrics_file.read_text()), ctx.run_dir) if metrics_file.exists() else None
    if result is not None and result.status == "pruned":
        import optuna

        raise optuna.TrialPruned(result.error or "pruned")
    if result is not None and code == 0 and result.status == "finished":
        return result
    reason = f": {result.error}" if result is not None and result.error else ""
    message = "\n".join(tail)
    raise LaunchError(
        f"The {cfg.launcher.num_processes} training processes failed (exit code {code}){reason}; "
        f"last lines of {launch_dir / 'children.log'}:\n{message}"
    )


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _pump(proc: subprocess.Popen, log_file: Any, tail: deque[str]) -> None:
    """Children's output to the job's stderr (progress bars live) and to children.log."""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        log_file.write(line)
        tail.append(line.rstrip())
    log_file.flush()
