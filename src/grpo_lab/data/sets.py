"""Rows into datasets, for every source: the seeded train/held-out split, the size caps, the JSONL files rows come
from (one line-numbered error per bad line).

Rows stay plain Python (``dict``) until :func:`pair` builds the ``datasets.Dataset``s: it is faster, and ``datasets``
(about a second to import) is imported only there, so that config-only commands never pay for it.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab.config import DataConfig
from grpo_lab.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset, Features

log = logging.getLogger(__name__)

Row = dict[str, Any]  # prompt, question, answer (and a source's own columns)


@dataclass(frozen=True)
class DatasetPair:
    """The train and held-out eval splits, each with ``prompt``, ``question`` and ``answer`` columns."""

    train: Dataset
    eval: Dataset


def text_features() -> Features:
    """Fixed column types, so an all-None ``answer`` column is still a string column."""
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"prompt": List(message), "question": Value("string"), "answer": Value("string")})


def to_dataset(rows: list[Row], features: Features | None = None) -> Dataset:
    from datasets import Dataset

    features = features or text_features()
    columns = {name: [row[name] for row in rows] for name in features}
    return Dataset.from_dict(columns, features=features)


def cap(rows: list[Row], size: int | None, seed: int, split: str) -> list[Row]:
    """At most ``size`` rows, drawn after a seeded shuffle; None keeps every row in file order."""
    if size is None:
        return rows
    if size > len(rows):
        log.warning("data.%s_size=%d but only %d %s rows exist; using all of them.", split, size, len(rows), split)
        return rows
    shuffled = list(rows)
    random.Random(f"{split}-subset-{seed}").shuffle(shuffled)
    return shuffled[:size]


def split(rows: list[Row], eval_fraction: float, seed: int, source: str) -> tuple[list[Row], list[Row]]:
    """A seeded train/eval split holding out ``eval_fraction`` of the rows (at least one in each part)."""
    n = len(rows)
    if n < 2:
        raise DataError(
            f"{source} has {n} row(s): splitting off an eval set needs at least 2. "
            "Add rows or give a separate held-out file with `data.eval_path=...`."
        )
    n_eval = min(max(1, round(n * eval_fraction)), n - 1)
    # Own RNG, independent of the one behind train_size/eval_size, so changing a size keeps the split.
    order = list(range(n))
    random.Random(f"split-{seed}").shuffle(order)
    held_out = set(order[:n_eval])
    # File order is kept inside each part.
    return [r for i, r in enumerate(rows) if i not in held_out], [r for i, r in enumerate(rows) if i in held_out]


def pair(train: list[Row], eval_: list[Row], cfg: DataConfig, features: Features | None = None) -> DatasetPair:
    """Apply the size caps and build the two datasets (rows stay plain Python until here: it is faster)."""
    return DatasetPair(
        to_dataset(cap(train, cfg.train_size, cfg.seed, "train"), features),
        to_dataset(cap(eval_, cfg.eval_size, cfg.seed, "eval"), features),
    )


def resolve(path: str, key: str) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        what = "is a directory, not a file" if resolved.is_dir() else "does not exist"
        raise DataError(
            f"`{key}={path}` {what}. Relative paths are resolved against the current directory "
            f"({Path.cwd()}), giving {resolved.absolute()}; pass an absolute path, e.g. `{key}=/abs/path/file.jsonl`."
        )
    return resolved


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; malformed lines name their number."""
    found = False
    lineno = 0
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno}).") from e
                if not isinstance(obj, dict):
                    raise DataError(f"{path}:{lineno}: each line must be a JSON object, got {type(obj).__name__}.")
                found = True
                yield lineno, obj
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason} at byte {e.start}).") from e
    except OSError as e:  # gone, unreadable or on a failing disk since it was checked
        raise DataError(f"Cannot read {path}: {e.strerror or e}.") from e
    if not found:
        raise DataError(f"{path} is empty: it has no JSON lines.")


def require(obj: dict[str, Any], needed: Sequence[str], where: str, extra: str = "") -> None:
    missing = [c for c in needed if c not in obj]
    if missing:
        found = ", ".join(sorted(obj)) or "none"
        raise DataError(
            f"{where}: missing column(s) {', '.join(missing)}; found: {found}; needed: {', '.join(needed)}.{extra}"
        )


def load_local(
    cfg: Any, path: str, rows: Callable[[str, str], list[Row]], features: Features | None = None
) -> DatasetPair:
    """The rows of ``path`` (``rows(path, key)``) and of ``cfg.eval_path``, or a seeded split of ``path`` by
    ``cfg.eval_fraction``; then the size caps."""
    train = rows(path, "data.path")
    if cfg.eval_path is not None:
        eval_ = rows(cfg.eval_path, "data.eval_path")
    else:
        train, eval_ = split(train, cfg.eval_fraction, cfg.seed, path)
    return pair(train, eval_, cfg, features)
