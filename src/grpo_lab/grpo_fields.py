"""The fields of TRL's ``GRPOConfig``, read from the installed source without importing TRL.

Importing trl (and with it torch and transformers) costs ~5 s; composing and validating a run must not
pay that. ``GRPOConfig`` is a dataclass chain ``TrainingArguments -> _BaseConfig -> GRPOConfig`` whose
fields are plain annotated class attributes, so parsing those three classes with :mod:`ast` gives the
exact field names and their literal defaults (a test checks this against ``dataclasses.fields``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (package, file inside the package, class) from base to most derived: later classes override defaults.
_CHAIN = (
    ("transformers", "training_args.py", "TrainingArguments"),
    ("trl", "trainer/base_config.py", "_BaseConfig"),
    ("trl", "trainer/grpo_config.py", "GRPOConfig"),
)

_NO_DEFAULT = object()


@dataclass(frozen=True)
class FieldInfo:
    name: str
    default: Any  # the literal default, or NO_DEFAULT when it is not a literal
    help: str


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{package} is not installed; run `make install` (see README).")
    return Path(spec.origin).parent


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return _NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return _NO_DEFAULT


def _field_default_and_help(value: ast.AST | None) -> tuple[Any, str]:
    """``x: int = 3`` or ``x: int = field(default=3, metadata={"help": ...})``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        default: Any = _NO_DEFAULT
        help_text = ""
        for kw in value.keywords:
            if kw.arg == "default":
                default = _literal(kw.value)
            elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                for k, v in zip(kw.value.keys, kw.value.values, strict=False):
                    if isinstance(k, ast.Constant) and k.value == "help":
                        text = _literal(v)
                        help_text = text if isinstance(text, str) else ""
        return default, help_text
    return _literal(value), ""


def _class_fields(path: Path, class_name: str) -> dict[str, FieldInfo]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            out = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    default, help_text = _field_default_and_help(stmt.value)
                    out[stmt.target.id] = FieldInfo(stmt.target.id, default, help_text)
            return out
    raise LookupError(f"class {class_name} not found in {path}: the installed TRL/transformers layout changed.")


@functools.cache
def grpo_config_fields() -> dict[str, FieldInfo]:
    """Every field name of ``trl.GRPOConfig`` -> its literal default and help text."""
    fields: dict[str, FieldInfo] = {}
    for package, rel, cls in _CHAIN:
        for name, info in _class_fields(_package_dir(package) / rel, cls).items():
            previous = fields.get(name)
            # A subclass that only re-annotates keeps the parent's help text.
            if previous is not None and not info.help:
                info = FieldInfo(name, info.default, previous.help)
            fields[name] = info
    return fields


def trl_default(name: str) -> Any:
    """TRL's literal default for ``name``; raises KeyError when it is not a GRPOConfig field."""
    default = grpo_config_fields()[name].default
    if default is _NO_DEFAULT:
        raise KeyError(f"GRPOConfig.{name} has no literal default")
    return default


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")
