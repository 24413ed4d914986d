"""Read an offline W&B run from its files, with no network.

Offline runs keep everything in `run-<id>.wandb` (no wandb-summary.json, no config.yaml). W&B's own
reader, `wandb leet inspect --json`, prints one JSON record per line: the `run` record carries name,
group and config; `history` records carry the logged rows; `--summary --json` gives the final state.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class OfflineRun:
    path: Path
    run_id: str
    name: str
    group: str | None
    state: str  # finished | failed | running ...
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


def _wandb_cli() -> list[str]:
    beside = Path(sys.executable).parent / "wandb"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("wandb")
    if found is None:
        raise FileNotFoundError("the `wandb` command is not installed (pip install wandb)")
    return [found]


def _inspect(path: Path, *extra: str) -> str:
    proc = subprocess.run(
        [*_wandb_cli(), "leet", "inspect", "--json", *extra, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`wandb leet inspect {path}` failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def find_runs(root: Path) -> list[Path]:
    """Every offline (or synced) W&B run folder under `root`, oldest first."""
    return sorted(p.parent for p in root.rglob("run-*.wandb"))


def _strip_internal(config: dict[str, Any]) -> dict[str, Any]:
    """W&B stores config values as {"value": ...} in some records and adds `_wandb`."""
    out = {}
    for key, value in config.items():
        if key == "_wandb":
            continue
        out[key] = value["value"] if isinstance(value, dict) and set(value) == {"value"} else value
    return out


def read_run(path: Path) -> OfflineRun:
    """Parse one run folder (the one holding `run-<id>.wandb`)."""
    summary = json.loads(_inspect(path, "--summary"))
    group = None
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for line in _inspect(path).splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        kind = record.get("type")
        if kind == "run":
            group = record["run"].get("run_group") or group
            config |= record["run"].get("config", {}).get("update", {})
        elif kind == "config":
            config |= record["config"].get("update", {})
        elif kind == "history":
            history.append(record["history"]["item"])
    config |= summary.get("config", {})
    return OfflineRun(
        path=path,
        run_id=summary.get("run_id", ""),
        name=summary.get("name", ""),
        group=group,
        state=summary.get("state", "unknown"),
        tags=list(summary.get("tags", [])),
        config=_strip_internal(config),
        summary=summary.get("summary", {}),
        history=history,
    )
