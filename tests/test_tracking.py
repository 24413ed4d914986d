"""W&B mode choice and what may reach W&B."""

from __future__ import annotations

import json
import re

import pytest

from grpo_lab import config
from grpo_lab.redact import redact
from grpo_lab.run.tracking import choose_mode
from wandb_files import find_runs

from conftest import FAST, compose, run_cli


@pytest.fixture
def logger_cfg():
    return config.load(compose(["experiment=smoke"])).logger


def test_mode_auto_is_offline_without_a_login(logger_cfg, monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert choose_mode(logger_cfg) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert choose_mode(logger_cfg) == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert choose_mode(logger_cfg) == "offline"


def test_explicit_modes_win(logger_cfg, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    assert choose_mode(logger_cfg.model_copy(update={"mode": "offline"})) == "offline"
    assert choose_mode(logger_cfg.model_copy(update={"backend": "none"})) == "disabled"


def test_storage_passwords_never_reach_wandb():
    cfg = {"trial": {"storage": "postgresql+psycopg2://me:s3cret@db.example:5432/optuna"}, "lr": 1e-5}
    assert redact(cfg) == {"trial": {"storage": "postgresql+psycopg2://me:***@db.example:5432/optuna"}, "lr": 1e-5}


def test_online_with_an_unreachable_host_falls_back_to_offline(tmp_path, model_cache):
    """Logged in, W&B host down (a closed port on loopback): the run is recorded offline, trains to the end and
    says how to upload it, after W&B's init timeout plus its own 10 s grace (the timeout cut from our 15 s
    to 3 s with W&B's own WANDB_INIT_TIMEOUT, which grpo_lab leaves to the user when set: 12 s less to wait)."""
    proc = run_cli(
        FAST,
        tmp_path,
        model_cache,
        WANDB_MODE="online",
        WANDB_BASE_URL="http://127.0.0.1:9",  # nothing listens there: connection refused
        WANDB_API_KEY="f" * 40,  # a well-formed, fake key: "logged in"
        WANDB_INIT_TIMEOUT="3",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    waited = re.search(r"W&B could not reach http://127\.0\.0\.1:9 within (\d+) s", proc.stderr)
    assert waited, proc.stderr[-4000:]
    assert int(waited[1]) <= 20
    assert "Traceback" not in proc.stderr
    (run_path,) = find_runs(tmp_path / "outputs")  # the failed online attempt leaves no second run folder
    assert run_path.name.startswith("offline-run-")
    assert f"wandb sync {run_path}" in proc.stdout
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "finished" and metrics["wandb"]["mode"] == "offline"
    assert metrics["wandb"]["run_id"] in run_path.name
    assert metrics["metrics"]["train/steps"] == 2
