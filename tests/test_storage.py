"""The sweep's storage: which errors are a race between workers (retried) and which are the user's (fail at once),
on real errors; claiming trials up to a target and failing (and retrying) the trials of a dead worker."""

from __future__ import annotations

import sqlite3
import time

import optuna
import pytest
import sqlalchemy

from grpo_lab.errors import ConfigError
from grpo_lab.sweep import storage as st

from conftest import postgres_url


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


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_claims_stop_at_the_target_and_a_dead_workers_trials_are_failed_and_retried(tmp_path, kind):
    url = f"sqlite:///{tmp_path / 'optuna.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'optuna.log'}"
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
