"""Rows into datasets, for every source: the three parts (train; validation, which chooses: the objective, pruning,
checkpoints, rankings; test, which only reports), seeded by ``data.seed`` and deduplicated by prompt; the size
caps; the JSONL files rows come from (one line-numbered error per bad line).

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


# Under this many items a graded part cannot tell anything but huge changes from noise (a 95% interval of about
# +-22 points around 50%), and a choice made on it is mostly luck.
MIN_GRADED_ITEMS = 20

# The held-out parts: config key prefix and what the part is called in messages.
PARTS = {"eval": "validation", "test": "test"}


@dataclass(frozen=True)
class DataParts:
    """Three disjoint parts, each with ``prompt``, ``question`` and ``answer`` columns: ``train``; ``eval``, the
    validation items every choice reads (its keys and metrics keep the name ``eval``); ``test``, graded only to
    report, after choosing."""

    train: Dataset
    eval: Dataset
    test: Dataset


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


def split(rows: list[Row], seed: int, source: str, **fractions: float) -> tuple[list[Row], dict[str, list[Row]]]:
    """Seeded held-out parts of ``rows`` (``eval=0.2, test=0.2``: each a fraction of all rows, at least one row),
    and the rows left to train on (at least one). One shuffle by ``seed`` deals the parts in the order given, so
    validation holds the same rows whether or not a test part is dealt after it."""
    n = len(rows)
    if sum(fractions.values()) >= 1:
        keys = " + ".join(f"`data.{name}_fraction={fraction}`" for name, fraction in fractions.items())
        raise DataError(f"{keys} holds out all of {source}: nothing is left to train on. Lower them (e.g. 0.2 each).")
    if n < len(fractions) + 1:
        names = " and ".join(PARTS[name] for name in fractions)
        raise DataError(
            f"{source} has {n} row(s): splitting off {names} parts needs at least {len(fractions) + 1}. "
            f"Add rows or give the held-out files with {', '.join(f'`data.{k}_path=...`' for k in fractions)}."
        )
    # Own RNG, independent of the one behind the size caps, so changing a size keeps the split.
    order = list(range(n))
    random.Random(f"split-{seed}").shuffle(order)
    dealt: dict[str, list[int]] = {}
    start = 0
    for name, fraction in fractions.items():
        size = min(max(1, round(n * fraction)), n - start - (len(fractions) - len(dealt)))
        dealt[name] = order[start : start + size]
        start += size
    taken = set(order[:start])
    # File order is kept inside each part.
    held = {name: [rows[i] for i in sorted(indices)] for name, indices in dealt.items()}
    return [r for i, r in enumerate(rows) if i not in taken], held


def _item_key(row: Row) -> str:
    """What makes two rows the same item: the whole prompt (a conversation's every turn, not only its last
    question), whitespace aside. The system prompt and worked examples are the same in every part."""
    prompt = row["prompt"]
    if not isinstance(prompt, list):
        return " ".join(str(prompt).split())
    return json.dumps([(m.get("role"), " ".join(str(m.get("content", "")).split())) for m in prompt])


def dedupe(train: list[Row], eval_: list[Row], test: list[Row]) -> tuple[list[Row], list[Row]]:
    """Train and validation without any prompt the parts after them hold (test keeps every row: it reports;
    validation loses what test holds; train what either holds), whitespace aside."""
    in_test = {_item_key(r) for r in test}
    kept_eval = [r for r in eval_ if _item_key(r) not in in_test]
    held = in_test | {_item_key(r) for r in kept_eval}
    kept_train = [r for r in train if _item_key(r) not in held]
    dropped = {"validation": len(eval_) - len(kept_eval), "train": len(train) - len(kept_train)}
    if any(dropped.values()):
        log.warning(
            "Removed rows whose prompt another part holds, so the parts are disjoint: %s.",
            ", ".join(f"{n} from {part}" for part, n in dropped.items() if n),
        )
    return kept_train, kept_eval


def parts(
    train: list[Row], eval_: list[Row], test: list[Row], cfg: DataConfig, features: Features | None = None
) -> DataParts:
    """Deduplicate, apply the size caps and build the three datasets (rows stay plain Python until here: faster)."""
    train, eval_ = dedupe(train, eval_, test)
    return DataParts(
        to_dataset(cap(train, cfg.train_size, cfg.seed, "train"), features),
        to_dataset(cap(eval_, cfg.eval_size, cfg.seed, "eval"), features),
        to_dataset(cap(test, cfg.test_size, cfg.seed, "test"), features),
    )


def check_graded_sizes(data: DataParts, test: bool = True) -> None:
    """A part that is graded holds at least MIN_GRADED_ITEMS items (called where it is graded; `test`: whether the
    test part is: `eval.test`)."""
    for name, label in PARTS.items():
        if name == "test" and not test:
            continue
        n = len(getattr(data, name))
        if n < MIN_GRADED_ITEMS:
            raise DataError(
                f"The {label} part has {n} item(s), under {MIN_GRADED_ITEMS}: its accuracy's 95% interval would "
                f"be wider than +-20 points. Set `data.{name}_size=` to {MIN_GRADED_ITEMS} or more (or give a "
                f"larger file/fraction: `data.{name}_path=`, `data.{name}_fraction=`)."
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


def _same_files(given: dict[str, str]) -> None:
    """Two parts named the same file: they would share every item."""
    seen: dict[Path, str] = {}
    for key, path in given.items():
        resolved = Path(path).expanduser().resolve()
        if resolved in seen:
            raise DataError(
                f"`{seen[resolved]}` and `{key}` name the same file ({resolved}): the parts must not share items "
                f"(train learns, validation chooses, test reports). Give another file, or drop `{key}=` to split "
                f"that part off `data.path` by `{key.replace('_path', '_fraction')}` (seeded by data.seed)."
            )
        seen[resolved] = key


def load_local(
    cfg: Any, path: str, rows: Callable[[str, str], list[Row]], features: Features | None = None
) -> DataParts:
    """The rows of ``path`` (``rows(path, key)``) and of ``cfg.eval_path`` / ``cfg.test_path``; a part without its
    own file is a seeded split of ``path`` by ``cfg.eval_fraction`` / ``cfg.test_fraction``; then the size caps."""
    given = {name: (f"data.{name}_path", getattr(cfg, f"{name}_path")) for name in PARTS}
    _same_files({"data.path": path} | {key: file for key, file in given.values() if file is not None})
    train = rows(path, "data.path")
    held = {name: rows(file, key) for name, (key, file) in given.items() if file is not None}
    to_split = {name: getattr(cfg, f"{name}_fraction") for name in PARTS if name not in held}
    if to_split:
        train, dealt = split(train, cfg.seed, path, **to_split)
        held |= dealt
    return parts(train, held["eval"], held["test"], cfg, features)
