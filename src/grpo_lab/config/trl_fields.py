"""The fields of TRL's ``GRPOConfig`` as data: name, default, the plain types and the choices TRL declares.

TRL is the authority on ``trainer.*``: everything here is read from ``dataclasses.fields(GRPOConfig)``, never
written by hand, so a TRL release that adds a field or a choice needs no change in grpo_lab. Importing TRL
(with torch and transformers) costs ~5 s, which composing and validating must not pay: the first process that
imports TRL anyway (any run, ``doctor``) writes what it read to a small JSON file in the cache folder, keyed by
the TRL and transformers versions, and later processes read that file instead.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_DEFAULT = "<no literal default>"
_FORMAT = "v1"
# The plain types a field can declare, by the names the JSON file uses.
_PLAIN = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null", list: "list", dict: "dict"}
# Values TRL's help text quotes, in single quotes or backticks; a value after `=` belongs to another field.
_QUOTED = re.compile(r"(?<![=\w])'(\w+)'|(?<![\w'])`(\w+)`")


@dataclass(frozen=True)
class TrlField:
    name: str
    default: Any  # JSON-able literal, or NO_DEFAULT
    types: tuple[str, ...] | None  # names from _PLAIN; None when the annotation is not a union of them
    choices: tuple[Any, ...] | None  # from an Enum or Literal in the annotation
    named: tuple[str, ...]  # the values the field's help quotes (TRL types some choices as plain `str`)


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _describe(field: dataclasses.Field, names: set[str]) -> TrlField:
    types_: list[str] = []
    choices: list[Any] | None = None
    for member in _members(field.type):
        origin = typing.get_origin(member) or member
        if isinstance(member, type) and issubclass(member, enum.Enum):
            choices = [*(choices or []), *(e.value for e in member)]
        elif origin is typing.Literal:
            choices = [*(choices or []), *typing.get_args(member)]
        elif origin in _PLAIN:
            types_.append(_PLAIN[origin])
        else:
            types_ = []
            break
    default = field.default
    try:
        json.dumps(default)
    except (TypeError, ValueError):
        default = NO_DEFAULT
    if default is dataclasses.MISSING:
        default = NO_DEFAULT
    help_text = str(field.metadata.get("help", ""))
    quoted = dict.fromkeys(a or b for a, b in _QUOTED.findall(help_text))  # in TRL's order
    named = tuple(q for q in quoted if q not in names and q not in ("True", "False", "None"))
    return TrlField(field.name, default, tuple(types_) or None, None if choices is None else tuple(choices), named)


def from_class(config_cls: type) -> dict[str, TrlField]:
    """The fields of a GRPOConfig-like dataclass (``trl.GRPOConfig``, or a stand-in in a test)."""
    fields = dataclasses.fields(config_cls)
    names = {f.name for f in fields}
    return {f.name: _describe(f, names) for f in fields}


def _cache_file() -> Path:
    from importlib.metadata import version  # ~20 ms: not on the path of a config that fails before TRL's keys

    from grpo_lab.paths import cache_dir

    # _FORMAT changes with TrlField, so that a file an older grpo_lab wrote is not misread.
    return cache_dir() / "trl" / f"grpo_config-{_FORMAT}-trl{version('trl')}-transformers{version('transformers')}.json"


def _read(path: Path) -> dict[str, TrlField] | None:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return {
            r["name"]: TrlField(
                r["name"],
                r["default"],
                None if r["types"] is None else tuple(r["types"]),
                None if r["choices"] is None else tuple(r["choices"]),
                tuple(r["named"]),
            )
            for r in rows
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, fields: dict[str, TrlField]) -> None:
    rows = [dataclasses.asdict(f) for f in fields.values()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows), encoding="utf-8")
        os.replace(tmp, path)  # another process may write the same file at the same time
    except OSError:
        pass  # a read-only cache only costs the import next time


@functools.cache
def grpo_config_fields() -> dict[str, TrlField]:
    """Every field of the installed ``trl.GRPOConfig``: from the cache file, else from TRL itself (imports it)."""
    path = _cache_file()
    if (cached := _read(path)) is not None:
        return cached
    from trl import GRPOConfig

    fields = from_class(GRPOConfig)
    _write(path, fields)
    return fields


def trl_default(name: str) -> Any:
    """TRL's literal default for ``name``; raises KeyError when it is not a GRPOConfig field or has none."""
    default = grpo_config_fields()[name].default
    if default == NO_DEFAULT:
        raise KeyError(f"GRPOConfig.{name} has no literal default")
    return default


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")
