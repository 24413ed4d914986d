"""Command-line overrides, in Hydra's own grammar: parse, normalise, classify and render them.

Users type `lr=1e-5`; the CLI hands Hydra `++lr=1e-5` (:func:`normalise`), so that a key missing from the
config reaches our validation (which names the nearest valid key) instead of Hydra's "Could not override".
Whatever shows overrides back to a user (run names, the re-run command in best.yaml, leaderboards) drops
that `++` again (:func:`as_typed`) and leaves out the sweep machinery's own overrides (:func:`machinery`).

    >>> normalise(parse("lr=1e-5"), groups={"model"}), normalise(parse("model=tiny"), groups={"model"})
    ('++lr=1e-5', 'model=tiny')
    >>> user_overrides(["model=tiny", "++lr=1e-05", "++trial={number:3}", "hydra.sweep.subdir=trial_3"])
    ['model=tiny', 'lr=1e-05']
    >>> render("++logger.group", "my study")
    '++logger.group=my\\\\ study'
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override


class Machinery(enum.Enum):
    """Overrides that say how a job was run, not what it tried."""

    HYDRA = "hydra"  # hydra.* settings and hydra/ groups (sweep dir, launcher, verbosity)
    TRIAL = "trial"  # `trial=`: the sweeper tells a trial's job its study, storage and trial id
    LABEL = "label"  # the sweep selection and the names the sweeper gives its trials


# Keys the sweeper labels every trial with (unless the user set them), and the sweep selection itself.
_LABEL_KEYS = frozenset({"sweep", "logger.name", "logger.group"})

# Characters that Hydra's grammar reads as syntax in an unquoted value; a backslash makes them literal.
_SPECIAL = re.compile(r"([\\()\[\]{}:=, \t])")


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


# ----------------------------------------------------------------------------------------------- parse
def parse_all(texts: Iterable[str]) -> list[Override]:
    """Overrides in Hydra's grammar; a bad one raises Hydra's OverrideParseException, which says what is wrong."""
    return [_parse_one(text) for text in texts]


@functools.lru_cache(maxsize=4096)
def _parse_one(text: str) -> Override:
    # Cached: a sweep re-reads the same trial overrides after every batch (best.yaml, the re-run command), and
    # Hydra's ANTLR parser costs ~1 ms an override. Callers only read the Override it returns.
    return _parser().parse_overrides([text])[0]


def parse(text: str) -> Override:
    return parse_all([text])[0]


def key(text: str) -> str:
    """The config key or group an override sets: `++lr=1e-5` -> `lr`, `model@x=tiny` -> `model`."""
    return parse(text).key_or_group


def as_dict(texts: Iterable[str]) -> dict[str, Any]:
    """{key: value} of the overrides that have a value, values typed by Hydra's grammar (`lr=1e-5` -> 1e-05)."""
    return {o.key_or_group: o.value() for o in parse_all(texts) if o.value_type is not None}


# ------------------------------------------------------------------------------------------- classify
def machinery(override: Override) -> Machinery | None:
    """What part of the sweep machinery set this override; None for the user's own."""
    name = override.key_or_group
    if name == "hydra" or override.is_hydra_override():
        return Machinery.HYDRA
    if name.split(".")[0] == "trial":
        return Machinery.TRIAL
    return Machinery.LABEL if name in _LABEL_KEYS else None


def is_group(override: Override, groups: Collection[str]) -> bool:
    """A config group selection (`model=tiny`, `hydra/launcher=basic`), not a config value."""
    return override.key_or_group in groups or "/" in override.key_or_group


def swept_key(override: Override) -> str | None:
    """The key a multirun sweeps (`lr=1e-5,2e-5` -> `lr`); None for a single value or a Hydra setting."""
    return override.key_or_group if override.is_sweep_override() and machinery(override) is None else None


def without(texts: Iterable[str], *parts: Machinery) -> list[str]:
    """The overrides that these parts of the sweep machinery did not set, unchanged."""
    texts = list(texts)
    return [text for text, o in zip(texts, parse_all(texts), strict=True) if machinery(o) not in parts]


# ------------------------------------------------------------------------------------------ normalise
def _forced(override: Override, groups: Collection[str]) -> bool:
    """A plain `key=value` of a config value (not a group, not Hydra's, no `+`, `++`, `~` or `@package`)."""
    from hydra.core.override_parser.types import OverrideType

    plain = override.type == OverrideType.CHANGE and override.package is None
    return plain and not is_group(override, groups) and machinery(override) is not Machinery.HYDRA


def normalise(override: Override, groups: Collection[str]) -> str:
    """The override as grpo_lab hands it to Hydra: plain config values force-added (`lr=1` -> `++lr=1`), so
    that any key, also one missing from the config, reaches our validation; everything else as typed."""
    return ("++" if _forced(override, groups) else "") + str(override.input_line)


def key_element(override: Override, groups: Collection[str]) -> str:
    """What :func:`normalise` puts left of `=`: `++lr`, `model`, `+x`."""
    return ("++" if _forced(override, groups) else "") + override.get_key_element()


# --------------------------------------------------------------------------------------------- render
def as_typed(text: str) -> str:
    """An override as the user typed it: without the `++` of :func:`normalise` (the CLI adds it again)."""
    return text.removeprefix("++")


def user_overrides(texts: Iterable[str]) -> list[str]:
    """A job's overrides as the user would type them, without the sweep machinery's."""
    return [as_typed(text) for text in without(texts, *Machinery)]


def render(key_element: str, value: Any) -> str:
    """`key_element=value` in Hydra's grammar: `render("++trial", {"n": 1})` -> `++trial={n:1}`."""
    return f"{key_element}={render_value(value)}"


def render_value(value: Any) -> str:
    """A Python value in Hydra's grammar, such that `key=<this>` parses back to the same value."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return _render_str(value)
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_escape(str(k))}:{render_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    raise TypeError(f"Cannot write a {type(value).__name__} as an override value: {value!r}")


def _escape(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def _render_str(text: str) -> str:
    """Unquoted with Hydra's escapes (`a\\ b`, `sqlite\\:///x.db`) where that reads back as this string;
    otherwise quoted (`'it\\'s'`, `'true'`, `'1'`: a quote, or text the grammar would read as another type)."""
    from hydra.core.override_parser.types import Quote, QuotedString
    from hydra.errors import HydraException

    escaped = _escape(text)
    try:
        if parse(f"k={escaped}").value() == text:
            return escaped
    except HydraException:
        pass
    return QuotedString(text=text, quote=Quote.single).with_quotes()


__all__ = [
    "Machinery",
    "as_dict",
    "as_typed",
    "is_group",
    "key",
    "key_element",
    "machinery",
    "normalise",
    "parse",
    "parse_all",
    "render",
    "render_value",
    "swept_key",
    "user_overrides",
    "without",
]
