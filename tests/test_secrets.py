"""Secrets never appear in any output: the run folder, Hydra's files, W&B's files, the Optuna storage, compare's
files and the console. One owner masks them: `grpo_lab.redact`."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_lab import redact as redact_mod
from grpo_lab.redact import MASK, RedactingFilter, redact, reveal, share

from conftest import FAST, cli_env, run_cli


# ------------------------------------------------------------------------------------------- the owner
def test_urls_keys_and_environment_values_are_masked(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "svc-0123456789")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to mask as a literal: it would hide words
    text = "postgresql+psycopg2://me:s3cret@db:5432/optuna token=svc-0123456789 abc ok"
    assert redact(text) == f"postgresql+psycopg2://me:{MASK}@db:5432/optuna token={MASK} abc ok"
    assert redact("uses svc-0123456789 inside") == f"uses {MASK} inside"
    config = {
        "lr": 1e-5,
        "reward": {"judge": {"api_key": "sk-abcdef", "url": "https://judge.invalid/v1", "hub_token": None}},
        "storage": "mysql://root:hunter22@h/db",
        "tags": ["+x.api_key=sk-abcdef", "pad_token=<|pad|>", "max_new_tokens=16"],
        "from_env": "${oc.env:MY_SERVICE_TOKEN}",  # an interpolation holds no secret: kept
    }
    assert redact(config) == {
        "lr": 1e-5,
        "reward": {"judge": {"api_key": MASK, "url": "https://judge.invalid/v1", "hub_token": None}},
        "storage": f"mysql://root:{MASK}@h/db",
        "tags": [f"+x.api_key={MASK}", "pad_token=<|pad|>", "max_new_tokens=16"],
        "from_env": "${oc.env:MY_SERVICE_TOKEN}",
    }
    # A user name that looks like a secret's name is still a user name.
    assert redact("postgresql://grpo_secrets:pw1234567@h/db") == f"postgresql://grpo_secrets:{MASK}@h/db"
    # As Hydra escapes an override's value (the sweeper's `++trial={storage:...}`).
    escaped = r"++trial={study:s,storage:postgresql+psycopg2\://me\:s3cret@db\:5432/optuna,number:0}"
    assert redact(escaped) == escaped.replace("s3cret", MASK)
    assert redact(r"x.endpoint=https\://judge\:$\{oc.env\:DB_PASSWORD\}@judge.invalid") == (
        r"x.endpoint=https\://judge\:$\{oc.env\:DB_PASSWORD\}@judge.invalid"
    )
    # A secret met as a config value is masked in later texts too (an error message that quotes it).
    assert redact("the judge refused key sk-abcdef") == f"the judge refused key {MASK}"


def test_the_log_filter_masks_messages_arguments_and_tracebacks():
    try:
        raise ValueError("cannot connect to postgresql://u:pw123456@h/db")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "storage %s failed", ("sqlite://u:pw123456@h",), None
        )
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    formatted = logging.Formatter().format(record)
    assert "pw123456" not in formatted
    assert f"storage sqlite://u:{MASK}@h failed" in formatted and f"postgresql://u:{MASK}@h/db" in formatted


def test_a_shared_url_is_revealed_to_jobs_only(monkeypatch):
    monkeypatch.delenv(redact_mod.SHARED_URLS_ENV, raising=False)
    url = "postgresql+psycopg2://me:s3cret-pw@db/optuna"
    masked = share(url)
    assert masked == f"postgresql+psycopg2://me:{MASK}@db/optuna"
    assert reveal(masked) == url  # a job of this sweep (same process or a child) gets the real URL back
    assert reveal(f"postgresql+psycopg2://other:{MASK}@db/optuna") == f"postgresql+psycopg2://other:{MASK}@db/optuna"


# ----------------------------------------------------------------------------------------- end to end
def _token(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(8)}"


@pytest.fixture
def password_storage(tmp_path):
    """A sweep storage whose URL carries a password: a PostgreSQL role of its own (with GRPO_LAB_TEST_POSTGRES_URL,
    as in CI), else SQLite (no password; the other secrets are still checked)."""
    admin = os.environ.get("GRPO_LAB_TEST_POSTGRES_URL")
    if not admin:
        yield f"sqlite:///{tmp_path / 'outputs' / 'sweeps' / 'optuna.db'}", None
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    password = _token("pgpw")
    name = f"grpo_secrets_{secrets.token_hex(4)}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
        conn.execute(text(f"CREATE DATABASE {name} OWNER {name}"))
    url = make_url(admin).set(username=name, password=password, database=name)
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            conn.execute(text(f"DROP ROLE IF EXISTS {name}"))
        engine.dispose()


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.heavy
def test_no_secret_reaches_any_output(tmp_path, model_cache, password_storage):
    storage, storage_password = password_storage
    env_secrets = {
        "HF_TOKEN": _token("hf_"),
        "MY_SERVICE_TOKEN": _token("svc-"),
        "DB_PASSWORD": _token("dbpw-"),
        # A key that is not used: W&B stays offline because WANDB_MODE says so (a key alone means online).
        "WANDB_API_KEY": secrets.token_hex(20),
    }
    api_key = _token("sk-")
    unreachable_password = _token("pw-")
    env = {**env_secrets, "WANDB_MODE": "offline"}
    # Secrets in the config: a literal on the command line, one from the environment by interpolation
    # under a harmless-looking key, inside a URL. (`length` takes and ignores extra keyword arguments.)
    in_config = [
        f"+reward.functions.length.api_key={api_key}",
        "+reward.functions.length.header=${oc.env:HF_TOKEN}",
        "+reward.functions.length.endpoint=https://judge:${oc.env:DB_PASSWORD}@judge.invalid/v1",
    ]
    procs = {
        "run": run_cli([*FAST, *in_config], tmp_path, model_cache, **env),
        "failing storage": run_cli(
            [
                "-m",
                "sweep=lr_beta",
                *FAST,
                "hydra.sweeper.n_trials=1",
                f"hydra.sweeper.storage=postgresql+psycopg2://u:{unreachable_password}@127.0.0.1:1/db",
            ],
            tmp_path,
            model_cache,
            timeout=120,
            **env,
        ),
        "sweep": run_cli(
            ["-m", "sweep=lr_beta", *FAST, "hydra.sweeper.n_trials=1", f"hydra.sweeper.storage={storage}", *in_config],
            tmp_path,
            model_cache,
            timeout=600,
            **env,
        ),
    }
    assert procs["run"].returncode == 0, procs["run"].stderr[-4000:]
    assert procs["failing storage"].returncode != 0
    assert procs["sweep"].returncode == 0, procs["sweep"].stderr[-4000:]
    (best,) = (tmp_path / "outputs").rglob("best.yaml")
    compare_env = cli_env(model_cache, **env, **({"PGPASSWORD": storage_password} if storage_password else {}))
    procs["compare"] = subprocess.run(
        [sys.executable, "-m", "grpo_lab.compare", str(best.parent)],
        cwd=tmp_path,
        env=compare_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert procs["compare"].returncode == 0, procs["compare"].stderr[-4000:]

    # The secrets did reach the config, and were masked there (else this test would prove nothing).
    configs = [p for p in (tmp_path / "outputs").rglob("config.yaml") if p.parent.name != ".hydra"]
    assert configs and all(f"api_key: '{MASK}'" in p.read_text() for p in configs)
    assert list(tmp_path.rglob("*.wandb")), "no W&B run was recorded"
    assert (best.parent / "leaderboard.md").exists()

    wanted = {**env_secrets, "api_key": api_key, "unreachable storage's password": unreachable_password}
    if storage_password:
        wanted["storage password"] = storage_password
    leaks = []
    for what, value in wanted.items():
        needle = value.encode()
        for path in _files(tmp_path):  # outputs/ (runs, sweeps, Optuna's SQLite file, W&B files), and all else
            if needle in path.read_bytes():
                leaks.append(f"{what} in {path.relative_to(tmp_path)}")
        for name, proc in procs.items():
            if value in proc.stdout or value in proc.stderr:
                leaks.append(f"{what} in the console of {name}")
    import optuna  # the study's trial attributes (overrides, command, error) live in the storage

    study = optuna.load_study(study_name="lr_beta", storage=storage)
    attrs = repr([study.user_attrs, *(t.user_attrs for t in study.trials)])
    leaks += [f"{what} in the study's user attributes" for what, value in wanted.items() if value in attrs]
    assert not leaks, "\n".join(leaks)


def test_a_long_error_is_masked_before_it_is_cut():
    from grpo_lab.errors import one_line

    # The 500-character cut lands inside the password: masking after the cut would print half of it.
    line = one_line(ValueError("x" * 460 + " postgresql+psycopg2://u:verysecretpassword@host/db"))
    assert "verysecret" not in line and "postgresql+psycopg2://u:***@host/db" in line
