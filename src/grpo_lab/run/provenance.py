"""Where a run came from: package versions, Python, platform and the user's git commit (environment.json)."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = (
    "grpo-lab",
    "torch",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "peft",
    "wandb",
    "hydra-core",
    "omegaconf",
    "optuna",
)


def git_commit(root: Path | None = None) -> dict[str, Any] | None:
    """The commit of the user's repository (the one around the current directory, or `root`: where their
    presets and rewards live; grpo_lab's own version is in `packages`) and whether its tree had uncommitted
    changes; None outside a git repository."""
    root = root or Path.cwd()
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
    ).stdout.strip()


def environment() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "git": git_commit(),
    }
