"""The run folder: what a job leaves behind for people and for `compare`.

config.yaml       the resolved config (as composed, interpolations resolved)
overrides.yaml    the command-line overrides of this job
environment.json  package versions, python, platform, git commit of the project
history.jsonl     one line per logged trainer step (written live, survives a crash)
metrics.json      status, objective, before/after evaluation, final training metrics
eval_*.jsonl      the held-out completions, graded
model/            the final model or LoRA adapter (unless output.save_model=false)
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from grpo_lab.paths import PROJECT_ROOT

_PACKAGES = (
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


def _yaml(data: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(data))


def git_commit(root: Path = PROJECT_ROOT) -> dict[str, Any] | None:
    """The project's commit and whether the tree had uncommitted changes; None outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def environment() -> dict[str, Any]:
    versions = {}
    for name in _PACKAGES:
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


def write_start(run_dir: Path, resolved_config: dict[str, Any], overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in resolved_config.items() if k != "hydra"}
    (run_dir / "config.yaml").write_text(_yaml(config), encoding="utf-8")
    (run_dir / "overrides.yaml").write_text(_yaml(list(overrides)), encoding="utf-8")
    write_json(run_dir / "environment.json", environment())


def _jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: store them as strings so the file stays readable everywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item())
    return value


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a reader never sees half a file


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(_jsonable(row)) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
