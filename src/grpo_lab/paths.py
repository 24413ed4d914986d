"""Where grpo_lab's files live: the shipped configs, and the cache for converted/built models."""

from __future__ import annotations

import os
from pathlib import Path

# The project checkout (grpo_lab is installed editable from it: `pip install -e .`).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"
SWEEPS_DIR = PROJECT_ROOT / "sweeps"


def config_groups() -> set[str]:
    """Config group names: the folders of conf/, plus `sweep` (sweeps/ is registered as that group)."""
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()} | {"sweep"}


def cache_dir() -> Path:
    """`$GRPO_LAB_CACHE`, else `$XDG_CACHE_HOME/grpo_lab`, else `~/.cache/grpo_lab`."""
    if explicit := os.environ.get("GRPO_LAB_CACHE"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "grpo_lab"
