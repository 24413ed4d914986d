"""W&B mode choice and what may reach W&B."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_lab import config
from grpo_lab.tracking import choose_mode, redact

from conftest import compose


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
    assert choose_mode(dataclasses.replace(logger_cfg, mode="offline")) == "offline"
    assert choose_mode(dataclasses.replace(logger_cfg, backend="none")) == "disabled"


def test_storage_passwords_never_reach_wandb():
    cfg = {"trial": {"storage": "postgresql+psycopg2://me:s3cret@db.example:5432/optuna"}, "lr": 1e-5}
    assert redact(cfg) == {"trial": {"storage": "postgresql+psycopg2://me:***@db.example:5432/optuna"}, "lr": 1e-5}
