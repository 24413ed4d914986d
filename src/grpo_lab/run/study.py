"""The Optuna study a trial's job reports to, and anything else reads: its storage URL opened.

SQLite by default, any RDB URL, a journal file (`journal:<path>`) or Optuna's gRPC storage proxy (`grpc://host:port`,
started with `python -m grpo_lab.sweep.proxy`). Only opening lives here, so that a run (grpo_lab.run.trial) needs
nothing of the sweeper; claiming trials, locks and heartbeats are the sweeper's (grpo_lab.sweep.storage).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.redact import redact

JOURNAL_PREFIX = "journal:"
GRPC_PREFIX = "grpc://"
# Seconds to wait for a gRPC storage proxy to answer before saying it is not there.
_PROXY_WAIT_S = 10.0


def check_url(url: str) -> None:
    """Refuse, in one line, a storage that is not a URL Optuna opens, or a database private to one process."""
    if url.startswith((JOURNAL_PREFIX, GRPC_PREFIX)):
        return
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(
            f"hydra.sweeper.storage={redact(url)}: not a storage URL. A SQLite file is `sqlite:///{redact(url)}`, a "
            f"journal file `journal:{redact(url)}`, a database `postgresql+psycopg2://USER:PASSWORD@HOST/DB`."
        )
    if scheme.split("+")[0] == "sqlite" and rest.strip("/") in ("", ":memory:"):
        raise ConfigError(
            f"hydra.sweeper.storage={redact(url)}: an in-memory SQLite database lives in one process, and each "
            "trial's job opens the study again: give a file, e.g. sqlite:///outputs/optuna.db."
        )


def grpc_address(url: str) -> tuple[str, int] | None:
    """(host, port) of a `grpc://host:port` storage URL; None for any other URL."""
    if not url.startswith(GRPC_PREFIX):
        return None
    host, sep, port = url.removeprefix(GRPC_PREFIX).rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"Storage {url!r}: a gRPC storage proxy is `grpc://HOST:PORT`, e.g. grpc://127.0.0.1:13000.")
    return host.strip("[]"), int(port)


def grpc_proxy(url: str) -> Any:
    """A client of the gRPC storage proxy at `url`, once it answers (else a one-line error naming the command)."""
    import optuna

    host, port = grpc_address(url)  # type: ignore[misc]
    with warnings.catch_warnings():  # experimental since Optuna 4.2: said once in the docs, not on every worker
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        proxy = optuna.storages.GrpcStorageProxy(host=host, port=port)
    try:
        proxy.wait_server_ready(timeout=_PROXY_WAIT_S)
    except Exception as e:
        proxy.close()
        raise ConfigError(
            f"No Optuna storage proxy answers at {url} within {_PROXY_WAIT_S:.0f} s ({type(e).__name__}): start it "
            f"first, e.g. `python -m grpo_lab.sweep.proxy postgresql+psycopg2://USER:PASSWORD@HOST/DB --port {port}`."
        ) from e
    return proxy


def sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def engine_kwargs(url: str) -> dict[str, Any]:
    # SQLite lets one writer in at a time; Python's 5 s busy timeout is too short when several workers
    # and their heartbeats share a file on a loaded machine ("database is locked" would fail a trial).
    connect_args = {"timeout": 120} if sqlite_path(url) is not None else {}
    return {"pool_pre_ping": True, "connect_args": connect_args}


def open_storage(url: str) -> Any:
    """A storage to read or report to (no heartbeats): what optuna.load_study takes."""
    import optuna

    if url.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix(JOURNAL_PREFIX)))
    if sqlite_path(url) is not None:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
    if grpc_address(url) is not None:
        return grpc_proxy(url)
    return url


def check_driver(url: str) -> None:
    """Refuse, in one line, a database URL whose SQLAlchemy driver is not installed."""
    if url.startswith("postgresql://"):
        raise ConfigError(
            f"Storage {redact(url)!r}: use `postgresql+psycopg2://...` (plain postgresql:// means psycopg 3 under "
            "SQLAlchemy 2, which is not installed)."
        )
