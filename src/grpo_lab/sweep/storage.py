"""Optuna storage for sweeps: SQLite by default, any RDB URL, a journal file, or Optuna's gRPC storage proxy
(`grpc://host:port`, started with `python -m grpo_lab.sweep.proxy`); safe for several workers.

- Several workers may start at once on a study that does not exist yet: creating the schema and the
  study races on PostgreSQL, so creation is retried until one wins and the others load it.
- Trials are claimed under a lock (a file lock beside SQLite/journal files, an advisory lock on
  PostgreSQL, and elsewhere, e.g. behind the gRPC proxy, a lock made of Optuna's own atomic
  WAITING -> RUNNING update), so that workers together run exactly `n_trials` and never more.
- Running trials send heartbeats (Optuna's on RDB storages, grpo_lab's own in a system attribute on
  journal files and the gRPC proxy); a trial whose worker died goes stale and is marked FAIL (and re-run
  with `retry_failed`) by the next claim.

:class:`SweepStorage` is what the sweeper holds; a storage to read or report to is grpo_lab.run.study's (a trial's
job reports to its study through it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import random
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, one_line
from grpo_lab.redact import redact
from grpo_lab.run.study import (
    JOURNAL_PREFIX,
    check_driver,
    check_url,
    engine_kwargs,
    grpc_address,
    grpc_proxy,
    open_storage,
    sqlite_path,
)

log = logging.getLogger("grpo_lab")


def lock_path(url: str) -> Path | None:
    """The file to lock for file-backed storages (None for server databases)."""
    # Not `<file>.lock`: Optuna's journal backend takes that name for its own (symlink) lock.
    if url.startswith(JOURNAL_PREFIX):
        return Path(url.removeprefix(JOURNAL_PREFIX) + ".grpo_lab-claim")
    sqlite = sqlite_path(url)
    return Path(str(sqlite) + ".grpo_lab-claim") if sqlite is not None else None


def storage_file(url: str) -> Path | None:
    """The file behind a SQLite or journal storage (None for server databases)."""
    if url.startswith(JOURNAL_PREFIX):
        return Path(url.removeprefix(JOURNAL_PREFIX))
    return sqlite_path(url)


def study_sizes(url: str, timeout: int = 5) -> dict[str, int]:
    """Each study's number of trials; read-only (a database without Optuna's tables is left without them)."""
    import optuna

    if not url.startswith(JOURNAL_PREFIX) and grpc_address(url) is None:
        import sqlalchemy

        kwargs = engine_kwargs(url)
        if url.startswith("postgresql"):
            kwargs["connect_args"] = {"connect_timeout": timeout}
        engine = sqlalchemy.create_engine(url, **kwargs)
        try:
            with engine.connect() as conn:
                if not sqlalchemy.inspect(conn).has_table("studies"):
                    return {}
        finally:
            engine.dispose()
    summaries = optuna.get_all_study_summaries(open_storage(url), include_best_trial=False)
    return {s.study_name: s.n_trials for s in summaries if not is_lock_study(s.study_name)}


def quiet_deliberate_warnings() -> None:
    """Optuna warns, on every call, about APIs grpo_lab uses on purpose: heartbeats outside Study.optimize (the
    sweeper asks and tells trials itself), `fail_stale_trials`, `set_metric_names` and `heartbeat_interval`
    (experimental). A user would read them, after every trial, as something wrong; docs/sweeps.md says once what
    they mean. Only those messages are silenced: the user's own samplers and pruners still warn."""
    from optuna.exceptions import ExperimentalWarning

    for name in ("fail_stale_trials", "set_metric_names", "heartbeat_interval"):
        warnings.filterwarnings("ignore", message=f".*{name}", category=ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def _optuna_storage(url: str, *, heartbeat_interval: int, grace_period: int, max_retry: int | None) -> Any:
    """The Optuna storage for `url`, with Optuna's heartbeats (and retries of stale trials) on RDB storages."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    check_url(url)
    if url.startswith(JOURNAL_PREFIX):
        Path(url.removeprefix(JOURNAL_PREFIX)).parent.mkdir(parents=True, exist_ok=True)
        return open_storage(url)  # Optuna keeps no heartbeats here: SweepStorage does
    if grpc_address(url) is not None:
        return grpc_proxy(url)  # nor through the proxy (the server holds the database's heartbeat table)
    sqlite = sqlite_path(url)
    if sqlite is not None:
        sqlite.parent.mkdir(parents=True, exist_ok=True)
    check_driver(url)
    callback = RetryHeartbeatStaleTrialCallback(max_retry=max_retry) if max_retry else None
    # Workers racing on an empty database collide creating the schema; the loser retries and finds it.
    for attempt in range(8):
        try:
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=callback,
                engine_kwargs=engine_kwargs(url),
            )
        except Exception as e:
            if attempt == 7 or not is_race(e):
                raise ConfigError(
                    f"Cannot open the Optuna storage {redact(url)!r}: {type(e).__name__}: {one_line(e)}"
                ) from e
            time.sleep(0.2 + random.random() * 0.5)
    raise AssertionError("unreachable")


# PostgreSQL SQLSTATEs of workers racing to create one schema or study: unique_violation, duplicate_table,
# duplicate_object, deadlock_detected, serialization_failure. A wrong password or an unreachable host has
# none (its error comes from the connection), so it fails at once instead of being retried.
_RACE_SQLSTATES = {"23505", "42P07", "42710", "40P01", "40001"}
_SQLITE_ERROR, _SQLITE_BUSY, _SQLITE_LOCKED = 1, 5, 6


def is_race(error: BaseException) -> bool:
    """Did another worker get there first (retry), rather than the storage being wrong (fail now)?"""
    import optuna
    from sqlalchemy import exc

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, exc.IntegrityError | optuna.exceptions.DuplicatedStudyError):
            return True
        orig = getattr(current, "orig", None)
        if getattr(orig, "pgcode", None) in _RACE_SQLSTATES:
            return True
        if getattr(orig, "sqlite_errorcode", None) in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return True
        # SQLite gives a schema created meanwhile no code of its own (SQLITE_ERROR): its message is all there is.
        if getattr(orig, "sqlite_errorcode", None) == _SQLITE_ERROR and "already exists" in str(orig):
            return True
        current = current.__cause__ or current.__context__
    return False


# Journal files and the gRPC proxy keep no heartbeats in Optuna: grpo_lab keeps its own in a system attribute
# (wall clock).
_HEARTBEAT_ATTR = "grpo_lab:heartbeat"


@dataclass(frozen=True)
class SweepStorage:
    """A sweep's storage: its URL, the Optuna storage, the cross-worker claim lock, heartbeats and stale trials."""

    url: str
    optuna: Any  # the Optuna storage object
    heartbeat_interval: int
    grace_period: int
    max_retry: int | None  # re-runs of a stale trial (RetryHeartbeatStaleTrialCallback); None or 0: none

    @classmethod
    def open(cls, url: str, *, heartbeat_interval: int, grace_period: int, max_retry: int | None) -> SweepStorage:
        kwargs = {"heartbeat_interval": heartbeat_interval, "grace_period": grace_period, "max_retry": max_retry}
        return cls(url, _optuna_storage(url, **kwargs), **kwargs)

    @property
    def is_rdb(self) -> bool:
        import optuna

        return isinstance(self.optuna, optuna.storages.RDBStorage)

    @contextlib.contextmanager
    def lock(self, study_name: str) -> Iterator[None]:
        """Serialise "how many trials are left? -> ask" across workers."""
        path = lock_path(self.url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        if self.url.startswith("postgresql"):
            from sqlalchemy import text

            key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:7], "big")
            with self.optuna.engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            return
        with StorageLock(self.optuna, study_name):  # the gRPC proxy, MySQL...: through Optuna's storage API
            yield

    def create_or_load_study(self, name: str, *, directions: list[str], sampler: Any, pruner: Any) -> Any:
        """The study `name`, created by whichever worker gets there first; its directions must be these."""
        import optuna

        for attempt in range(8):
            try:
                study = optuna.create_study(
                    study_name=name,
                    storage=self.optuna,
                    directions=directions,
                    sampler=sampler,
                    pruner=pruner,
                    load_if_exists=True,
                )
                break
            except Exception as e:
                if attempt == 7 or not is_race(e):
                    raise
                time.sleep(0.2 + random.random() * 0.5)
        existing = [d.name.lower() for d in study.directions]
        if existing != [d.lower() for d in directions]:
            raise ConfigError(
                f"Study {name!r} already exists with direction(s) {existing}, not {directions}: "
                "use another `hydra.sweeper.study_name` or the same objectives."
            )
        return study

    def claim(self, study: Any, *, target: int, batch: int, distributions: dict) -> list[Any]:
        """Ask up to `batch` new trials, never more than the study needs to reach `target` finished trials.

        The count and the ask happen under one cross-worker lock and the count comes from ONE snapshot of
        the study: with two reads, a trial that another worker finished between them would be counted in
        neither and the study would overshoot `n_trials`. Only asks create trials and every ask happens
        here, so trials taken can only grow while the lock is held. Stale trials are failed under the same
        lock, so that two workers never both replace one.
        """
        from optuna.trial import TrialState

        with self.lock(study.study_name):
            self.fail_stale(study)
            states = [t.state for t in study.get_trials(deepcopy=False)]
            taken = sum(s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING) for s in states)
            trials = [study.ask(distributions) for _ in range(max(0, min(batch, target - taken)))]
            for trial in trials:  # alive from the start: a worker killed before its first beat still goes stale
                self.beat(self.trial_id(study.study_name, trial.number))
        return trials

    def trial_id(self, study_name: str, number: int) -> int:
        """A trial's storage id (what heartbeats and state updates take), through the storage's public API:
        Optuna's Trial and FrozenTrial keep it only as a private attribute."""
        study_id = self.optuna.get_study_id_from_name(study_name)
        return self.optuna.get_trial_id_from_study_id_trial_number(study_id, number)

    def beat(self, trial_id: int) -> None:
        """Record that a trial's worker is alive (RDB: Optuna's heartbeat table; journal, gRPC: our system attr)."""
        if self.is_rdb:
            if self.optuna.heartbeat_interval is not None:
                self.optuna.record_heartbeat(trial_id)
        else:
            self.optuna.set_trial_system_attr(trial_id, _HEARTBEAT_ATTR, time.time())

    def heartbeats(self, trial_ids: list[int]) -> Heartbeats:
        """A context in which a thread beats for these trials every heartbeat_interval seconds."""
        return Heartbeats(self, trial_ids)

    def fail_stale(self, study: Any) -> list[int]:
        """Mark trials of dead workers (no heartbeat within the grace period) FAIL, and retry them up to
        max_retry times; returns their numbers. RDB storages use Optuna's heartbeats, the others ours."""
        stale = self._fail_stale_rdb(study) if self.is_rdb else self._fail_stale_by_attr(study)
        for number in stale:
            log.warning("Trial %d was left running by a worker that stopped; marked FAIL.", number)
        return stale

    @staticmethod
    def _fail_stale_rdb(study: Any) -> list[int]:
        import optuna
        from optuna.trial import TrialState

        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        optuna.storages.fail_stale_trials(study)  # with the retry callback the storage was opened with
        # Only those now FAIL: a trial that another worker finished meanwhile is not stale.
        failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        return sorted(before & failed)

    def _fail_stale_by_attr(self, study: Any) -> list[int]:
        import optuna
        from optuna.trial import TrialState

        if not self.grace_period:
            return []
        now, stale = time.time(), []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(_HEARTBEAT_ATTR)
            if beat is None or now - float(beat) <= self.grace_period:
                continue
            trial_id = self.trial_id(study.study_name, trial.number)
            try:
                self.optuna.set_trial_state_values(trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # finished or failed by another worker meanwhile
            stale.append(trial.number)
            if self.max_retry:
                optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=self.max_retry)(
                    study, self.optuna.get_trial(trial_id)
                )
        return stale


class Heartbeats:
    """Tells the storage that these trials are alive while their jobs run (stale ones are failed on resume)."""

    def __init__(self, storage: SweepStorage, trial_ids: list[int]) -> None:
        self._storage, self._ids = storage, trial_ids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-lab-heartbeat", daemon=True)

    def _run(self) -> None:
        while True:
            for trial_id in self._ids:
                try:
                    self._storage.beat(trial_id)
                except Exception as e:  # one missed beat is harmless; a run of them makes the trial look stale
                    log.warning("Heartbeat of trial id %d failed: %s", trial_id, e)
            if self._stop.wait(self._storage.heartbeat_interval):
                return

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ------------------------------------------------------------------------------------------ storage lock
_LOCK_STUDY = "grpo_lab:claim-lock:"
# A holder keeps the lock for one claim (a few storage calls); one seen held this long has lost its worker.
_LOCK_LEASE_S = 120.0


def is_lock_study(name: str) -> bool:
    """A study that only holds a StorageLock (listings leave it out)."""
    return name.startswith(_LOCK_STUDY)


def lock_study(study_name: str) -> str:
    """The name of the study that holds `study_name`'s StorageLock (delete it with the study)."""
    return _LOCK_STUDY + study_name


class StorageLock:
    """A cross-worker lock made of Optuna's storage API only, for storages grpo_lab has no other lock on
    (behind the gRPC proxy a worker has no database connection, and no shared file).

    The lock is trial 0 of a study of its own: WAITING is free, RUNNING is held. Optuna makes
    WAITING -> RUNNING atomic (RDBStorage updates the row under SELECT ... FOR UPDATE and returns False when
    the trial was not WAITING; the proxy passes that answer on): it is the same step that lets two workers
    never pop one enqueued trial. Releasing sets WAITING again. A worker killed while holding it leaves it
    RUNNING: a waiter that sees the same holding (the same start time) for _LOCK_LEASE_S of its own clock
    frees it, so no clocks are compared across machines.
    """

    def __init__(self, storage: Any, study_name: str) -> None:
        self._storage, self._name = storage, lock_study(study_name)

    def _lock_trial(self) -> int:
        import optuna
        from optuna.trial import TrialState

        try:
            study_id = self._storage.get_study_id_from_name(self._name)
        except KeyError:
            try:
                study_id = self._storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], self._name)
            except optuna.exceptions.DuplicatedStudyError:
                study_id = self._storage.get_study_id_from_name(self._name)
        try:
            return self._storage.get_trial_id_from_study_id_trial_number(study_id, 0)
        except KeyError:  # two workers may both create one: trial 0 is the lock, the others are never used
            template = optuna.trial.create_trial(state=TrialState.WAITING)
            self._storage.create_new_trial(study_id, template_trial=template)
            return self._storage.get_trial_id_from_study_id_trial_number(study_id, 0)

    def __enter__(self) -> StorageLock:
        from optuna.trial import TrialState

        self._trial_id = self._lock_trial()
        seen, since = None, time.monotonic()
        while not self._storage.set_trial_state_values(self._trial_id, TrialState.RUNNING):
            held = self._storage.get_trial(self._trial_id).datetime_start
            if held != seen:
                seen, since = held, time.monotonic()
            elif time.monotonic() - since > _LOCK_LEASE_S:
                log.warning("The sweep's claim lock was held for %.0f s: its worker is gone; freed.", _LOCK_LEASE_S)
                self._storage.set_trial_state_values(self._trial_id, TrialState.WAITING)
            time.sleep(0.02 + random.random() * 0.08)
        return self

    def __exit__(self, *exc: object) -> None:
        from optuna.trial import TrialState

        self._storage.set_trial_state_values(self._trial_id, TrialState.WAITING)
