"""`python -m grpo_lab.sweep.proxy STORAGE_URL [--host H] [--port P]`: Optuna's gRPC storage proxy in front of
one database, for many sweep workers (`hydra.sweeper.storage=grpc://H:P`).

Each worker then talks gRPC to this one process instead of holding a database connection pool of its own;
the proxy holds one (with Optuna's in-process cache of finished trials). It runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo_lab.errors import ConfigError, one_line
from grpo_lab.redact import redact

log = logging.getLogger("grpo_lab")


def serve(url: str, *, host: str, port: int, threads: int) -> None:
    import optuna

    from grpo_lab.run.study import JOURNAL_PREFIX, check_driver, engine_kwargs, grpc_address

    if url.startswith(JOURNAL_PREFIX) or grpc_address(url) is not None:
        raise ConfigError(
            f"{redact(url)!r}: the gRPC proxy serves a database (PostgreSQL, MySQL, SQLite), not a journal file "
            "or another proxy (Optuna's proxy does not support journal storage)."
        )
    check_driver(url)
    try:  # get_storage adds Optuna's cache of finished trials, which its docs ask for in front of an RDBStorage
        storage = optuna.storages.get_storage(optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url)))
    except Exception as e:
        raise ConfigError(f"Cannot open {redact(url)!r}: {type(e).__name__}: {redact(one_line(e))}") from e
    _serialise_state_updates(storage)
    _check_free(host, port)
    log.info(
        "Optuna storage proxy for %s at grpc://%s:%d (%d threads); Ctrl-C stops it.", redact(url), host, port, threads
    )
    with warnings.catch_warnings():  # experimental since Optuna 4.2 (the README says so)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.run_grpc_proxy_server(
            storage, host=host, port=port, thread_pool=ThreadPoolExecutor(max_workers=threads)
        )


def _serialise_state_updates(storage: Any) -> None:
    """Make a trial's state update atomic whatever the database: the sweep's claim lock (storage.StorageLock)
    is a WAITING -> RUNNING update that must succeed for one worker only. PostgreSQL and MySQL guarantee it
    (the row is read FOR UPDATE); SQLite does not (two connections both read WAITING, then both write). Every
    worker's update passes through this one process, so one lock here serialises them all."""
    lock = threading.Lock()
    update = storage.set_trial_state_values

    def set_trial_state_values(trial_id: int, state: Any, values: Any = None) -> bool:
        with lock:
            return update(trial_id, state, values)

    storage.set_trial_state_values = set_trial_state_values


def _check_free(host: str, port: int) -> None:
    """gRPC binds with SO_REUSEPORT: a second proxy on a taken port would start and share it silently."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ConfigError(
                f"Cannot listen on {host}:{port} ({e.strerror}): is a proxy already there? use --port."
            ) from e


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.sweep.proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the database, e.g. postgresql+psycopg2://USER:PASSWORD@HOST:5432/optuna")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=13000)
    parser.add_argument("--threads", type=int, default=16, help="requests served at once (about one per worker)")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a service manager's stop: exit cleanly
    try:
        serve(opts.url, host=opts.host, port=opts.port, threads=opts.threads)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


@contextlib.contextmanager
def running(url: str, *, port: int | None = None, ready_s: float = 60.0) -> Iterator[str]:
    """A proxy for `url` in a child process while the block runs; yields its `grpc://127.0.0.1:PORT`
    (what the benchmarks and tests run their workers through)."""
    from grpo_lab.net import LOOPBACK, free_port
    from grpo_lab.run.study import grpc_proxy

    port = port or free_port()
    address = f"grpc://{LOOPBACK}:{port}"
    # Its log goes to a file: a pipe nobody reads while the proxy serves would fill and block it.
    with tempfile.TemporaryFile(mode="w+") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_lab.sweep.proxy", url, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            text=True,
        )
        try:
            deadline = time.monotonic() + ready_s
            while True:
                if proc.poll() is not None:
                    log_file.seek(0)
                    raise ConfigError(f"The storage proxy exited ({proc.returncode}): {log_file.read()[-2000:]}")
                try:
                    grpc_proxy(address).close()
                    break
                except ConfigError:
                    if time.monotonic() > deadline:
                        raise
            yield address
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
