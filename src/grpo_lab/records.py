"""The run folder: what a job leaves behind for people and for `compare`.

config.yaml       the resolved config (as composed, interpolations resolved)
overrides.yaml    the command-line overrides of this job
environment.json  package versions, python, platform, git commit of the project
history.jsonl     one line per logged trainer step (written live, survives a crash)
metrics.json      status, objective, before/after evaluation, final training metrics
eval_*.jsonl      the held-out completions, graded
model/            the final model or LoRA adapter (unless output.save_model=false)

Every file written here passes through :func:`grpo_lab.redact.redact` (storage passwords, API keys and
tokens are masked), and so do Hydra's own copies of the config (`.hydra/*.yaml`, `multirun.yaml`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from grpo_lab.paths import PROJECT_ROOT
from grpo_lab.redact import redact

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
    _write_text(run_dir / "config.yaml", _yaml(redact(config)))
    _write_text(run_dir / "overrides.yaml", _yaml(redact(list(overrides))))
    write_json(run_dir / "environment.json", environment())


def redact_hydra_files(run_dir: Path, output_subdir: str | None, sweep_dir: Path | None = None) -> None:
    """Mask secrets in the copies of the config that Hydra writes before the job starts.

    Hydra saves `.hydra/config.yaml`, `hydra.yaml` (with the command line's `hydra.*` overrides, e.g. a
    sweep storage URL with its password) and `overrides.yaml` in the run folder, and `multirun.yaml` in
    the sweep folder; the job rewrites them masked as soon as it starts.
    """
    names = ("config.yaml", "hydra.yaml", "overrides.yaml") if output_subdir is not None else ()
    paths = [run_dir / str(output_subdir) / name for name in names]
    if sweep_dir is not None:
        paths.append(sweep_dir / "multirun.yaml")
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        masked = redact(text)
        if masked != text:
            _write_text(path, masked)


def _write_text(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a reader never sees half a file, a full disk leaves none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def write_json(path: Path, data: Any, *, redact_secrets: bool = True) -> None:
    """`data` as JSON, secrets masked; atomically (a reader never sees half a file).

    `redact_secrets=False` only for files that hand a job its own config (`launch/job.json`): the child
    process needs the real values.
    """
    data = _jsonable(data)
    _write_text(path, json.dumps(redact(data) if redact_secrets else data, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(redact(_jsonable(row))) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
