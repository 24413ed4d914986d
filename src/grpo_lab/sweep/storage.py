"""Optuna storage for sweeps: SQLite by default, any RDB URL, or a journal file; safe for several workers.

- Several workers may start at once on a study that does not exist yet: creating the schema and the
  study races on PostgreSQL, so creation is retried until one wins and the others load it.
- Trials are claimed under a lock (a file lock beside SQLite/journal files, an advisory lock on
  PostgreSQL), so that workers together run exactly `n_trials` and never more.
- Running trials send heartbeats; a trial whose worker died goes stale and is marked FAIL on resume.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError

log = logging.getLogger("grpo_lab")

JOURNAL_PREFIX = "journal:"


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def lock_path(url: str) -> Path | None:
    """The file to lock for file-backed storages (None for server databases)."""
    # Not `<file>.lock`: Optuna's journal backend takes that name for its own (symlink) lock.
    if url.startswith(JOURNAL_PREFIX):
        return Path(url.removeprefix(JOURNAL_PREFIX) + ".grpo_lab-claim")
    sqlite = _sqlite_path(url)
    return Path(str(sqlite) + ".grpo_lab-claim") if sqlite is not None else None


def _engine_kwargs(url: str) -> dict[str, Any]:
    # SQLite lets one writer in at a time; Python's 5 s busy timeout is too short when several workers
    # and their heartbeats share a file on a loaded machine ("database is locked" would fail a trial).
    connect_args = {"timeout": 120} if _sqlite_path(url) is not None else {}
    return {"pool_pre_ping": True, "connect_args": connect_args}


def open_storage(url: str) -> Any:
    """A storage to read or report to (no heartbeats): what optuna.load_study takes."""
    import optuna

    if url.startswith(JOURNAL_PREFIX):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix(JOURNAL_PREFIX)))
    if _sqlite_path(url) is not None:
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    return url


def make_storage(url: str, *, heartbeat_interval: int, grace_period: int, max_retry: int | None) -> Any:
    """An Optuna storage for `url` with heartbeats (and retries of stale trials when `max_retry` is set)."""
    import optuna
    from optuna.storages import RetryFailedTrialCallback

    callback = RetryFailedTrialCallback(max_retry=max_retry) if max_retry else None
    if url.startswith(JOURNAL_PREFIX):
        Path(url.removeprefix(JOURNAL_PREFIX)).parent.mkdir(parents=True, exist_ok=True)
        return open_storage(url)  # journal files keep no heartbeats
    sqlite = _sqlite_path(url)
    if sqlite is not None:
        sqlite.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("postgresql://"):
        raise ConfigError(
            f"Storage {url!r}: use `postgresql+psycopg2://...` (plain postgresql:// means psycopg 3 under "
            "SQLAlchemy 2, which is not installed)."
        )
    # Workers racing on an empty database collide creating the schema; the loser retries and finds it.
    for attempt in range(8):
        try:
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                failed_trial_callback=callback,
                engine_kwargs=_engine_kwargs(url),
            )
        except Exception as e:
            if attempt == 7 or not _is_race(e):
                raise ConfigError(f"Cannot open the Optuna storage {url!r}: {type(e).__name__}: {e}") from e
            time.sleep(0.2 + random.random() * 0.5)
    raise AssertionError("unreachable")


def _is_race(error: Exception) -> bool:
    text = f"{type(error).__name__} {error}".lower()
    return any(word in text for word in ("integrity", "duplicate", "already exists", "locked", "unique", "operational"))


def create_or_load_study(name: str, storage: Any, *, directions: list[str], sampler: Any, pruner: Any) -> Any:
    import optuna

    for attempt in range(8):
        try:
            study = optuna.create_study(
                study_name=name,
                storage=storage,
                directions=directions,
                sampler=sampler,
                pruner=pruner,
                load_if_exists=True,
            )
            break
        except Exception as e:
            if attempt == 7 or not _is_race(e):
                raise
            time.sleep(0.2 + random.random() * 0.5)
    existing = [d.name.lower() for d in study.directions]
    if existing != [d.lower() for d in directions]:
        raise ConfigError(
            f"Study {name!r} already exists with direction(s) {existing}, not {directions}: "
            "use another `hydra.sweeper.study_name` or the same objectives."
        )
    return study


@contextlib.contextmanager
def claim_lock(url: str, storage: Any, study_name: str) -> Iterator[None]:
    """Serialise "how many trials are left? -> ask" across workers."""
    path = lock_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if url.startswith("postgresql"):
        from sqlalchemy import text

        key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:7], "big")
        with storage.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        return
    yield  # other databases: no cross-worker lock; n_trials may be overshot by concurrent workers


def fail_stale(study: Any, storage: Any) -> list[int]:
    """Mark trials of dead workers (no heartbeat within the grace period) FAIL; returns their numbers."""
    import optuna
    from optuna.trial import TrialState

    if not isinstance(storage, optuna.storages.RDBStorage):
        return []  # journal files keep no heartbeats
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    optuna.storages.fail_stale_trials(study)
    # Only those now FAIL: a trial that another worker finished meanwhile is not stale.
    failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    stale = sorted(before & failed)
    for number in stale:
        log.warning("Trial %d was left running by a worker that stopped; marked FAIL.", number)
    return stale
