"""The file I/O every run folder and sweep file goes through: written atomically with secrets masked, read
back with damage named.

Writers mask secrets (:func:`grpo_lab.redact.redact`) and go through a temporary file and a rename, so a reader
never sees half a file and a full disk leaves none. Readers: a missing file gives None (JSON/YAML) or []
(JSONL); one that exists but cannot be read or parsed raises :class:`RunFolderError` naming it; in a JSONL
file, a line that is not a JSON object (cut by a crash) is skipped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_lab.errors import GrpoLabError
from grpo_lab.redact import redact


class RunFolderError(GrpoLabError):
    """A file of a run folder exists but cannot be read (damaged, or not written by grpo_lab)."""


def write_atomic(path: Path, text: str, *, mode: int = 0o666) -> None:
    """Write through a temporary file of this process and rename: a reader never sees half a file. `mode` (less the
    umask) is the file's from its creation on: 0o600 keeps it this user's even while it is written."""
    write_atomic_bytes(path, text.encode("utf-8"), mode=mode)


def write_atomic_bytes(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            f.write(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: stored as strings, so the file stays readable everywhere; numpy/torch scalars as
    plain numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return jsonable(value.item())
    return value


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON, secrets masked, atomically."""
    write_atomic(path, json.dumps(redact(jsonable(data)), indent=2) + "\n")


def write_private_json(path: Path, data: Any) -> None:
    """`data` as JSON with its secrets, readable by this user only: the file that hands a job's child processes
    their config (`launch/job.json`), which needs the real values. Its writer removes it when the job ends."""
    write_atomic(path, json.dumps(jsonable(data), indent=2) + "\n", mode=0o600)


def write_yaml(path: Path, data: Any) -> None:
    from omegaconf import OmegaConf

    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(redact(jsonable(row))) + "\n")


def rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """A JSONL file holding exactly `rows` (an older file is replaced)."""
    path.unlink(missing_ok=True)
    for row in rows:
        append_jsonl(path, row)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")  # a cut multi-byte character: a bad line
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunFolderError(f"Cannot read {path}: {e.strerror or e}.") from e


def read_parsed(path: Path, parse: Callable[[str], Any]) -> Any:
    """The parsed file; None when it does not exist; RunFolderError naming it when it does not parse."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as e:  # json.JSONDecodeError and yaml's errors (yaml_load) both say where
        raise RunFolderError(f"{path} is damaged (cut short or edited?): {e}") from e


def yaml_load(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e).replace("\n", " ")) from e


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON-object row of a JSONL file ([] when it does not exist)."""
    rows = []
    for line in (read_text(path) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
