"""Shared test helpers: compose configs like the CLI does, and run the CLI like a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def compose(overrides: list[str]):
    """The composed DictConfig for these overrides, exactly as `python -m grpo_lab` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_lab.cli import prepare_overrides
    from grpo_lab.paths import CONF_DIR

    rewritten, _ = prepare_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=rewritten)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache folder for the whole session: the tiny model is built once."""
    return tmp_path_factory.mktemp("grpo_lab_cache")


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "GRPO_LAB_"))}
    # Not logged in: grpo_lab picks W&B offline by itself. HF offline: nothing may touch the Hub.
    env.update({"GRPO_LAB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, cache: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`python -m grpo_lab ARGS` in `cwd` (so outputs/ lands there)."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_lab", *args],
        cwd=cwd,
        env=cli_env(cache, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
