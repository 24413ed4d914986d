"""The sweep's storage: which errors are a race between workers (retried) and which are the user's (fail at once),
on real errors; claiming trials up to a target and failing (and retrying) the trials of a dead worker."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

import optuna
import pytest
import sqlalchemy

from grpo_lab.errors import ConfigError
from grpo_lab.run import study as study_mod
from grpo_lab.sweep import proxy
from grpo_lab.sweep import storage as st

from conftest import fresh_postgres_database, postgres_url


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:
        return e
    raise AssertionError("expected an error")


def test_a_duplicate_row_a_table_created_meanwhile_and_a_locked_sqlite_file_are_races(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}", connect_args={"timeout": 0})
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE t (k INTEGER PRIMARY KEY)"))
        conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))

    def duplicate():
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))

    assert st.is_race(_raised(duplicate))

    def create_again():  # a second worker creating Optuna's schema after the first
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE t (k INTEGER PRIMARY KEY)"))

    assert st.is_race(_raised(create_again))

    holder = sqlite3.connect(tmp_path / "db.sqlite", timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert st.is_race(_raised(duplicate))  # "database is locked": another worker holds the file
    finally:
        holder.rollback()
        holder.close()


def test_a_missing_table_and_an_unreachable_server_are_not_races(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")

    def missing():
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("SELECT * FROM nosuch"))

    assert not st.is_race(_raised(missing))
    unreachable = sqlalchemy.create_engine("postgresql+psycopg2://u:pw@127.0.0.1:1/db")
    assert not st.is_race(_raised(unreachable.connect))


def test_a_wrong_password_fails_once_and_is_not_retried(monkeypatch):
    url = postgres_url()
    wrong = sqlalchemy.engine.make_url(url).set(password="not-the-password").render_as_string(hide_password=False)
    engine = sqlalchemy.create_engine(wrong)
    assert not st.is_race(_raised(engine.connect))
    sleeps = []
    monkeypatch.setattr(st.time, "sleep", sleeps.append)  # a retry would sleep before its next attempt
    with pytest.raises(ConfigError, match="password authentication failed"):
        st.SweepStorage.open(wrong, heartbeat_interval=10, grace_period=30, max_retry=None)
    assert sleeps == []


@pytest.mark.parametrize("kind", ["sqlite", "journal", "grpc"])
def test_claims_stop_at_the_target_and_a_dead_workers_trials_are_failed_and_retried(tmp_path, kind):
    url = f"sqlite:///{tmp_path / 'optuna.db'}" if kind != "journal" else f"journal:{tmp_path / 'optuna.log'}"
    with contextlib.ExitStack() as stack:
        if kind == "grpc":  # the same database behind Optuna's gRPC proxy: heartbeats and the lock go through it
            url = stack.enter_context(proxy.running(url))
        _claims_and_stale_trials(url)


def _claims_and_stale_trials(url: str) -> None:
    storage = st.SweepStorage.open(url, heartbeat_interval=1, grace_period=1, max_retry=1)
    study = storage.create_or_load_study("s", directions=["maximize"], sampler=None, pruner=None)
    x = {"x": optuna.distributions.FloatDistribution(0, 1)}
    claimed = storage.claim(study, target=3, batch=2, distributions=x)
    assert [t.number for t in claimed] == [0, 1]
    study.tell(claimed[0], 0.5)
    assert len(storage.claim(study, target=3, batch=2, distributions=x)) == 1  # 1 finished + 2 running = 3
    assert storage.claim(study, target=3, batch=2, distributions=x) == []
    time.sleep(2.5)  # no heartbeats: the worker of trials 1 and 2 looks dead
    assert storage.fail_stale(study) == [1, 2]
    states = [t.state.name for t in study.get_trials()]
    assert states == ["COMPLETE", "FAIL", "FAIL", "WAITING", "WAITING"]  # each retried once (max_retry=1)
    again = storage.claim(study, target=3, batch=2, distributions=x)
    assert [t.number for t in again] == [3, 4]
    with storage.heartbeats([storage.trial_id("s", 3), storage.trial_id("s", 4)]):
        time.sleep(2.5)
        assert storage.fail_stale(study) == []  # beating: alive


# ------------------------------------------------------------------------------------- Optuna's gRPC proxy
@pytest.mark.parametrize(
    ("url", "named"),
    [("grpc://127.0.0.1:13000", None), ("grpc://[::1]:13000/", None), ("grpc://host", "grpc://HOST:PORT")],
)
def test_grpc_storage_urls(url, named):
    if named is None:
        assert study_mod.grpc_address(url) in (("127.0.0.1", 13000), ("::1", 13000))
    else:
        with pytest.raises(ConfigError) as error:
            study_mod.grpc_address(url)
        assert named in str(error.value)
    assert study_mod.grpc_address("sqlite:///x.db") is None


def test_no_proxy_at_the_address_fails_in_one_line_naming_the_command(monkeypatch):
    from grpo_lab.net import free_port

    monkeypatch.setattr(study_mod, "_PROXY_WAIT_S", 1.0)
    error = _raised(lambda: study_mod.open_storage(f"grpc://127.0.0.1:{free_port()}"))
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert "No Optuna storage proxy answers" in str(error) and "python -m grpo_lab.sweep.proxy" in str(error)


def test_the_proxy_refuses_a_journal_a_taken_port_and_a_wrong_database(tmp_path):
    from grpo_lab.sweep.proxy import main

    assert main([f"journal:{tmp_path / 'j.log'}"]) == 1
    with proxy.running(f"sqlite:///{tmp_path / 'a.db'}") as address:
        port = address.rsplit(":", 1)[1]
        assert main([f"sqlite:///{tmp_path / 'b.db'}", "--port", port]) == 1  # would share the port silently
    assert main([f"sqlite:///{tmp_path / 'no' / 'such' / 'folder.db'}"]) == 1


@pytest.mark.parametrize("kind", ["grpc", "postgresql"])
def test_the_storage_lock_lets_one_holder_in_at_a_time_and_frees_a_dead_holders_lock(tmp_path, monkeypatch, kind):
    """StorageLock: a lock made of Optuna's atomic WAITING -> RUNNING update (the claim lock behind the proxy).
    PostgreSQL makes the update atomic itself; behind grpo_lab's proxy, SQLite's is made so by the proxy."""
    with contextlib.ExitStack() as stack:
        if kind == "grpc":
            storage = study_mod.open_storage(stack.enter_context(proxy.running(f"sqlite:///{tmp_path / 'lock.db'}")))
        else:
            storage = optuna.storages.RDBStorage(fresh_postgres_database(postgres_url(), "lock"))
        _one_holder_at_a_time(storage, monkeypatch)


def _one_holder_at_a_time(storage, monkeypatch) -> None:
    inside, overlaps, entries = [0], [], []

    def worker() -> None:
        for _ in range(5):
            with st.StorageLock(storage, "s"):
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.01)
                inside[0] -= 1
                entries.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(entries) == 20 and max(overlaps) == 1
    # A holder that died (never left): the lock is freed once it has been held for the lease.
    monkeypatch.setattr(st, "_LOCK_LEASE_S", 0.5)
    st.StorageLock(storage, "s").__enter__()
    started = time.monotonic()
    with st.StorageLock(storage, "s"):
        assert 0.5 <= time.monotonic() - started < 10
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["grpo_lab:claim-lock:s"]
    assert st.is_lock_study("grpo_lab:claim-lock:s") and not st.is_lock_study("s")


@pytest.mark.heavy
def test_eight_workers_through_the_grpc_proxy_run_exactly_n_trials(tmp_path):
    """Many workers, one study, no database connection of their own: the sweep's claim lock goes through the
    proxy (StorageLock). The trials are the sweeper_scaling benchmark's no-op jobs, so that the workers contend
    on claims all the time; the stress check with training and kill -9 is tests/test_stress.py (slow set)."""
    import subprocess
    import sys
    from collections import Counter

    from conftest import REPO

    database = fresh_postgres_database(postgres_url(), "grpc")
    app = REPO / "benchmarks" / "baselines" / "noop_sweep_app.py"
    with proxy.running(database) as address:
        args = [
            "-m", "hydra/sweeper=grpo_optuna", "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=none",
            "hydra.sweeper.n_trials=40", f"hydra.sweeper.storage={address}", "hydra.sweeper.study_name=many",
            "hydra.sweeper.keep_models=none", "lr=tag(log, interval(1e-6, 1e-4))",
        ]  # fmt: skip
        procs = [
            subprocess.Popen(
                [sys.executable, str(app), *args, f"hydra.sweep.dir={tmp_path / f'w{i}'}"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(8)
        ]
        errors = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 8, [e[-2000:] for e in errors]
        through_proxy = optuna.load_study(study_name="many", storage=study_mod.open_storage(address)).trials
    trials = optuna.load_study(study_name="many", storage=database).trials
    assert len(through_proxy) == len(trials) == 40  # exactly n_trials: none extra, none lost
    assert Counter(t.state.name for t in trials) == {"COMPLETE": 40}
    assert len({t.number for t in trials}) == 40 and len({t.params["lr"] for t in trials}) == 40
    assert st.study_sizes(database) == {"many": 40}  # the lock's own study is left out of listings
