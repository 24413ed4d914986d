"""Which storage errors are a race between workers (retried) and which are the user's (fail at once): real errors."""

from __future__ import annotations

import sqlite3

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
        st.make_storage(wrong, heartbeat_interval=10, grace_period=30, max_retry=None)
    assert sleeps == []
