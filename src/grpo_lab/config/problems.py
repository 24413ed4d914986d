"""One way to report a bad config value: a :class:`Problem` (the key as data, a kind) and one renderer.

pydantic's errors, TRL's, transformers' and peft's refusals and grpo_lab's own rules all become Problems, and
:func:`fail` turns them into one :class:`~grpo_lab.errors.ConfigError` whose message is one line and whose
``key`` and ``kind`` say what is wrong where, without anyone reading the message back.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ValidationError

from grpo_lab import errors
from grpo_lab.errors import ConfigError

# What went wrong: an unknown key, a missing one, a value of the wrong type, out of range, not among the
# choices, against a rule that spans keys, or refused by a library (TRL, transformers, peft).
Kind = Literal["unknown_key", "missing", "type", "range", "choice", "rule", "rejected"]


class _Unset:
    """No value given (None is a value: `null`); pickles as this module's UNSET (jobs send errors across processes)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Problem:
    key: str  # as the user types it: `lr`, `trainer.loss_type`, `model.lora.r`
    kind: Kind
    value: Any = UNSET
    must: str = ""  # what is allowed ("be > 0", "be one of a, b") or, for rules and libraries, what is wrong
    why: str = ""
    near: str | None = None  # the nearest valid key or value
    note: str = ""


# Keys that users of other libraries type, mapped onto ours.
ALIASES = {
    "kl_coeff": "beta",
    "kl_coef": "beta",
    "kl_coefficient": "beta",
    "init_kl_coef": "beta",
    "learning_rate": "lr",
    "num_generation": "num_generations",
    "group_size": "num_generations",
    "steps": "max_steps",
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
}


def alias(key: str, valid: list[str]) -> str | None:
    """The name grpo_lab or TRL uses for a key other libraries spell ``key``, when it is valid here."""
    name = ALIASES.get(key)
    return name if name in valid else None


def nearest(value: Any, candidates: Iterable[Any], cutoff: float = 0.6) -> str | None:
    """The candidate closest to `value` (difflib's ratio at least `cutoff`), for "did you mean"; None if none is."""
    matches = difflib.get_close_matches(str(value), [str(c) for c in candidates], n=1, cutoff=cutoff)
    return matches[0] if matches else None


def show(value: Any) -> str:
    """A value as the user would type it on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _bound(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else show(value)


def _one_of(choices: tuple[Any, ...]) -> str:
    shown = ", ".join(show(c) for c in choices[:12])
    return f"be one of {shown}" + (f", ... ({len(choices)} in all)" if len(choices) > 12 else "")


def render(p: Problem) -> str:
    near = f" Did you mean `{p.near}`?" if p.near else ""
    note = f" {p.note}" if p.note else ""
    if p.kind == "unknown_key":
        return f"Unknown config key `{p.key}`.{near}{note}"
    if p.kind == "missing":
        return f"Missing config key `{p.key}`: every key needs a value in conf/ (YAML holds the defaults)."
    why = f" ({p.why})" if p.why else ""
    if p.kind in ("rule", "rejected"):
        where = f"`{p.key}`" if p.value is UNSET else f"`{p.key}={show(p.value)}`"
        return f"{where}: {p.must}{why}{near}{note}"
    got = "" if p.value is UNSET else f", got {show(p.value)}"
    return f"`{p.key}` must {p.must}{why}{got}.{near}{note}"


def fail(*problems: Problem) -> ConfigError:
    """One ConfigError, one line, for all ``problems`` (the first one's key and kind on the error)."""
    lines = list(dict.fromkeys(render(p) for p in problems))
    message = lines[0] if len(lines) == 1 else f"{len(lines)} problems in the config: " + " ".join(lines)
    return ConfigError(" ".join(message.split()), key=problems[0].key, kind=problems[0].kind, problems=problems)


# ------------------------------------------------------------------------------------ pydantic's errors
def members(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union (Annotated wrappers removed), or () if ``tp`` is not one."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return ()
    return tuple(typing.get_args(a)[0] if typing.get_origin(a) is Annotated else a for a in typing.get_args(tp))


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if m := members(tp):
        return " | ".join(_type_name(a) for a in m)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "a mapping"
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


class Where(typing.NamedTuple):
    """A pydantic error location as the user's dotted key, and what is declared there."""

    key: str
    holder: type[BaseModel] | None = None  # the model whose key the location ends in
    field: Any = None  # its FieldInfo (None inside dicts and lists)
    declared: Any = None  # the declared type; a union when pydantic tried several alternatives


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tagged(tp: Any, tag: Any) -> Any:
    """The member of a discriminated union whose Literal field holds ``tag``, else None."""
    for m in members(tp):
        if isinstance(m, type) and issubclass(m, BaseModel):
            for f in m.model_fields.values():
                if typing.get_origin(f.annotation) is Literal and tag in typing.get_args(f.annotation):
                    return m
    return None


def locate(loc: tuple[Any, ...], root: Any, prefix: str = "") -> Where:
    """Walk ``loc`` through the declared types from ``root`` (a model or a type)."""
    path, holder, field, tp = prefix, None, None, root
    parts = list(loc)
    while parts:
        if m := members(tp):
            models = [a for a in m if a is not type(None)]
            if (chosen := _tagged(tp, parts[0])) is not None:  # a discriminated union names the tag it picked
                parts.pop(0)
                tp = chosen
            elif len(models) == 1:  # `X | None`: pydantic reports inside X directly
                tp = models[0]
            else:  # several alternatives were tried: the error is about the whole union
                break
            continue
        part = str(parts.pop(0))
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            holder = tp
            field = tp.model_fields.get(part) or next((f for f in tp.model_fields.values() if f.alias == part), None)
            path, tp = _join(path, part), (field.annotation if field else None)
        elif typing.get_origin(tp) in (dict, list):
            path, tp, field = _join(path, part), typing.get_args(tp)[-1], None
        else:
            path = _join(path, part)
    return Where(path, holder, field, tp)


# What each pydantic type error means, in a user's words.
_EXPECTED = {
    "bool_type": "true or false",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
_BOUNDS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}
_SIGNS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _literals(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return tuple(v for m in members(tp) for v in _literals(m))


def problem(
    error: Any, where: Where, aliases: Callable[[str, list[str]], str | None] | None = None, why: str = ""
) -> Problem:
    """One pydantic error dict as a Problem (``aliases`` may name the key another library uses for a typo)."""
    kind, value, ctx = error["type"], error.get("input", UNSET), error.get("ctx") or {}
    why = where.field.description if where.field is not None and where.field.description else why
    if kind == "missing":
        return Problem(where.key, "missing")
    if kind == "extra_forbidden":
        valid = [f.alias or n for n, f in where.holder.model_fields.items()] if where.holder else []
        parent, _, name = where.key.rpartition(".")
        return unknown_key(parent, name, valid, aliases)
    if kind == "union_tag_invalid":
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        tag = ctx.get("tag")
        return Problem(_join(where.key, "kind"), "choice", tag, f"be one of {', '.join(tags)}", near=nearest(tag, tags))
    if kind == "union_tag_not_found":
        return Problem(where.key, "type", value, "be a mapping with a `kind`")
    if kind == "literal_error" and (choices := _literals(where.declared)):
        return Problem(where.key, "choice", value, _one_of(choices), why, nearest(value, choices))
    if kind in _BOUNDS:
        bound = _BOUNDS[kind]
        return Problem(where.key, "range", value, f"be {_SIGNS[bound]} {_bound(ctx[bound])}", why)
    if kind == "too_short":
        return Problem(where.key, "range", value, "not be empty", why)
    if kind in _EXPECTED or kind.endswith("_type"):
        expected = _type_name(where.declared) if members(where.declared) else _EXPECTED.get(kind, kind)
        return Problem(where.key, "type", value, f"be {expected}", why)
    if kind in ("type", "range", "choice"):  # our own PydanticCustomError, its message says what is allowed
        return Problem(where.key, kind, value, error["msg"], why)
    # A whole section's validator (its input the section's mapping): its message names the keys and values.
    return Problem(where.key, "rule", UNSET if isinstance(value, dict) else value, error["msg"], why)


def unknown_key(
    parent: str, name: str, valid: list[str], aliases: Callable[[str, list[str]], str | None] | None = None
) -> Problem:
    """``parent.name`` is not a key: name the alias or the nearest valid key, else list them."""
    alias = aliases(name, valid) if aliases else None
    near = alias or nearest(name, valid)
    note = f"(`{alias}` is TRL's / grpo_lab's name for it.)" if alias else ""
    if near is None and len(valid) <= 30:
        note = f"Valid keys here: {', '.join(sorted(valid))}."
    return Problem(_join(parent, name), "unknown_key", near=near and _join(parent, near), note=note)


def problems(error: ValidationError, root: Any, prefix: str = "", aliases: Any = None, why: str = "") -> list[Problem]:
    """Every error pydantic found, as Problems, keys relative to ``prefix`` (``why``: the root's description)."""
    return [problem(e, locate(e["loc"], root, prefix), aliases, why) for e in error.errors(include_url=False)]


# ------------------------------------------------------------------------------- Hydra's refusals
# Structured configs of ours that Hydra checks while composing (keys and types): their refusals are ours.
_OWN_SCHEMAS = ("grpo_lab.config.sweep",)
_PLAIN_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def hydra_problem(error: BaseException) -> Problem | None:
    """Hydra's refusal of a key or value in one of our structured configs, as a Problem; None otherwise.

    OmegaConf's exception carries the key, the value and the dataclass as attributes: nothing is read from
    its message.
    """
    import dataclasses

    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    schema = getattr(cause, "object_type", None)
    if cause is None or not dataclasses.is_dataclass(schema) or not schema.__module__.startswith(_OWN_SCHEMAS):
        return None
    fields = {f.name: f for f in dataclasses.fields(schema)}
    full_key, key = str(getattr(cause, "full_key", "")), str(getattr(cause, "key", ""))
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key not in fields:
        return unknown_key(full_key.rpartition(".")[0], key, list(fields))
    if isinstance(cause, OmegaConfValidationError) and key in fields:
        declared = fields[key].type
        expected = _PLAIN_NAMES.get(declared) or _type_name(declared)
        return Problem(full_key, "type", getattr(cause, "value", UNSET), f"be {expected}")
    return None


def describe(error: BaseException) -> str | None:
    """:func:`grpo_lab.errors.describe`, and Hydra's refusal of a key or value of our own schemas in our words: the
    one line a command prints for a user or environment error (None: a bug, which keeps its traceback)."""
    if (problem := hydra_problem(error)) is not None:
        return render(problem)
    if (line := _missing_option(error)) is not None:
        return line
    return errors.describe(error)


def _missing_option(error: BaseException) -> str | None:
    """Hydra's "Could not find 'model/tinyy'" (with its search path) as the group's options and the nearest one."""
    from hydra.errors import MissingConfigException

    if not isinstance(error, MissingConfigException) or not error.options or not error.missing_cfg_file:
        return None
    group, _, option = str(error.missing_cfg_file).rpartition("/")
    options = [o for o in error.options if not o.startswith("_")]  # `_base`: shared by the options, not one
    near = nearest(option, options)
    hint = f" Did you mean `{group}={near}`?" if near else ""
    return f"`{group}={option}`: no such option.{hint} The options of `{group}`: {', '.join(options)}."
