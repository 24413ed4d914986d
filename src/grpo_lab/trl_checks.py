"""Would TRL, transformers and peft accept this run's settings, and can they work? Checked before W&B or a model.

TRL's ``GRPOConfig`` accepts many values that fail only later, inside ``GRPOTrainer`` or at the first
``generate`` (``temperature=-1``, ``loss_type=nosuch``, ``max_completion_length=-5``), by which time a
W&B run exists and a model is loaded. :func:`check` runs in two passes, right after the config is
composed and validated:

1. **Rules** (no torch import, instant): a small table of ranges and choices for GRPOConfig fields
   (and grpo_lab's LoRA keys) that TRL takes at config time but that crash later or cannot train,
   plus a few rules that span fields (``epsilon_high >= epsilon``, the eval batch shape, packages that
   ``use_vllm`` / ``use_liger_kernel`` need).
2. **The libraries' own checks** (imports trl, ~4 s, once: training needs these imports anyway):
   field types, the real ``GRPOConfig`` (via :func:`grpo_lab.config.to_grpo_config`), the
   ``GenerationConfig`` GRPOTrainer builds from it, validated strictly, the logits processors
   ``generate`` will create from it, and peft's ``LoraConfig`` (via :func:`grpo_lab.models.lora_config`).

Every failure is a :class:`~grpo_lab.errors.ConfigError` with one line: the key as the user types
it, the value, and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import re
import tempfile
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lab import config as config_mod
from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import trl_default, trl_version

if typing.TYPE_CHECKING:
    from grpo_lab.config import RunConfig

# GRPOConfig needs an output_dir; building the config does not create it (checked by a test).
_UNUSED_DIR = os.path.join(tempfile.gettempdir(), "grpo_lab-trl-check-never-created")
_UNSET = object()


def _show(value: Any) -> str:
    """A value as the user would type it on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _nearest_hint(value: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" Did you mean `{near[0]}`?" if near else ""


# ----------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """``key`` (as the user types it) must satisfy ``ok``; ``allowed`` and ``why`` go into the message."""

    key: str
    allowed: str
    ok: Callable[[Any], bool]
    why: str = ""
    # Only checked when this holds for the run (e.g. LoRA keys when LoRA is on).
    when: Callable[[RunConfig], bool] | None = None
    # For a choice: the allowed values (a wrong string gets the nearest one as a hint).
    choices: tuple[Any, ...] = ()


def _number(
    key: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    integer: bool = False,
    nullable: bool = False,
    why: str = "",
    when: Callable[[RunConfig], bool] | None = None,
) -> Rule:
    lo = f"({gt}" if gt is not None else f"[{ge}" if ge is not None else None
    hi = f"{lt})" if lt is not None else f"{le}]" if le is not None else None
    if lo and hi:
        bounds = f"in {lo}, {hi}"
    elif lo:
        bounds = f"{'>' if gt is not None else '>='} {lo[1:]}"
    elif hi:
        bounds = f"{'<' if lt is not None else '<='} {hi[:-1]}"
    else:
        bounds = ""
    kind = "an integer" if integer else "a number"
    allowed = f"{'null or ' if nullable else ''}{kind} {bounds}".strip()

    def ok(value: Any) -> bool:
        if value is None:
            return nullable
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            return False
        return not (
            math.isnan(value)
            or (gt is not None and not value > gt)
            or (ge is not None and not value >= ge)
            or (lt is not None and not value < lt)
            or (le is not None and not value <= le)
        )

    return Rule(key, allowed, ok, why, when)


def _choice(key: str, choices: tuple[Any, ...], why: str = "") -> Rule:
    shown = ", ".join(_show(c) for c in choices)
    return Rule(
        key, f"one of {shown}", lambda v: any(v == c and type(v) is type(c) for c in choices), why, choices=choices
    )


def _lora(run: RunConfig) -> bool:
    return run.model.lora.enabled


def _logging_steps_ok(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value <= 0:
        return False
    return value < 1 or float(value).is_integer()


_T = "trainer."
RULES: tuple[Rule, ...] = (
    # Sampling (GRPOTrainer passes these to transformers' GenerationConfig, or to vLLM).
    _number(_T + "temperature", gt=0, why="TRL divides the logits by it; e.g. 0.1 samples nearly greedily"),
    _number(_T + "top_p", gt=0, le=1, why="1.0 keeps every token"),
    _number(_T + "top_k", ge=0, integer=True, nullable=True, why="0, TRL's default, or null disables top-k"),
    _number(_T + "min_p", ge=0, le=1, nullable=True, why="null disables it"),
    _number(_T + "repetition_penalty", gt=0, why="1.0 means no penalty"),
    _number(_T + "max_completion_length", ge=1, integer=True, why="tokens generated per completion"),
    _number(_T + "num_iterations", ge=1, integer=True, why="updates per generation batch; 1 is on-policy"),
    # Clipping and loss.
    _number(_T + "epsilon", ge=0, why="the PPO clip range"),
    _number(_T + "epsilon_high", ge=0, nullable=True, why="null uses epsilon"),
    _number(
        _T + "delta",
        gt=1,
        nullable=True,
        why="the ratio's upper clip; at or below 1 every token is clipped and nothing is learned",
    ),
    _number(_T + "top_entropy_quantile", ge=0, le=1),
    _number(_T + "off_policy_mask_threshold", gt=0, nullable=True, why="null disables masking"),
    _number(_T + "sapo_temperature_pos", gt=0, why="the sapo loss divides by it"),
    _number(_T + "sapo_temperature_neg", gt=0, why="the sapo loss divides by it"),
    _number(_T + "ref_model_mixup_alpha", ge=0, le=1),
    _number(_T + "ref_model_sync_steps", ge=1, integer=True),
    _choice(_T + "loss_type", ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")),
    _choice(_T + "scale_rewards", ("group", "batch", "none", True, False)),
    _choice(_T + "importance_sampling_level", ("token", "sequence")),
    _choice(_T + "multi_objective_aggregation", ("sum_then_normalize", "normalize_then_sum")),
    # Batches and logging.
    _number(_T + "per_device_train_batch_size", ge=1, integer=True, why="completions per device per step"),
    _number(_T + "per_device_eval_batch_size", ge=1, integer=True),
    _number(_T + "steps_per_generation", ge=1, integer=True, nullable=True),
    _number(_T + "generation_batch_size", ge=1, integer=True, nullable=True),
    _number(_T + "num_generations_eval", ge=1, integer=True, nullable=True, why="null uses num_generations"),
    Rule(
        _T + "logging_steps",
        "a whole number >= 1 of steps, or a fraction in (0, 1) of the run",
        _logging_steps_ok,
    ),
    _number(_T + "num_completions_to_print", ge=0, integer=True, nullable=True),
    # vLLM.
    _choice(_T + "vllm_mode", ("colocate", "server")),
    _choice(_T + "vllm_model_impl", ("vllm", "transformers")),
    _choice(
        _T + "vllm_importance_sampling_mode", ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    ),
    _number(_T + "vllm_gpu_memory_utilization", gt=0, le=1),
    _number(_T + "vllm_tensor_parallel_size", ge=1, integer=True),
    _number(_T + "vllm_server_port", ge=1, le=65535, integer=True),
    _number(_T + "vllm_group_port", ge=1, le=65535, integer=True),
    _number(_T + "vllm_server_timeout", gt=0, why="seconds"),
    # grpo_lab's LoRA keys, turned into peft's LoraConfig (models.lora_config).
    _number("model.lora.r", ge=1, integer=True, why="the adapter rank", when=_lora),
    _number("model.lora.alpha", gt=0, why="peft scales the adapter by alpha / r", when=_lora),
    _number("model.lora.dropout", ge=0, lt=1, when=_lora),
)


def _rule_value(run: RunConfig, kwargs: Mapping[str, Any], key: str) -> Any:
    if key.startswith(_T):
        return kwargs.get(key.removeprefix(_T), _UNSET)
    value: Any = run
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _check_rules(run: RunConfig, kwargs: Mapping[str, Any]) -> None:
    for rule in RULES:
        if rule.when is not None and not rule.when(run):
            continue
        value = _rule_value(run, kwargs, rule.key)
        if value is _UNSET or rule.ok(value):
            continue
        why = f" ({rule.why})" if rule.why else ""
        hint = _nearest_hint(str(value), [str(c) for c in rule.choices]) if rule.choices else ""
        raise ConfigError(f"`{rule.key}={_show(value)}`: must be {rule.allowed}{why}.{hint}")


# ------------------------------------------------------------------------------------- cross-field rules
def _value(kwargs: Mapping[str, Any], field: str) -> Any:
    """The field as GRPOConfig will see it: set by the user or grpo_lab, else TRL's literal default."""
    if field in kwargs:
        return kwargs[field]
    try:
        return trl_default(field)
    except KeyError:
        return None


def _epsilon_high(run: RunConfig, kwargs: Mapping[str, Any], num_processes: int) -> str | None:
    high, low = kwargs.get("epsilon_high"), _value(kwargs, "epsilon")
    if high is not None and high < low:
        return (
            f"`trainer.epsilon_high={_show(high)}`: must be >= trainer.epsilon={_show(low)} "
            "(the upper clip bound; null uses epsilon)."
        )
    return None


def _eval_batch(run: RunConfig, kwargs: Mapping[str, Any], num_processes: int) -> str | None:
    # TRL checks this with the world size of the process that builds GRPOConfig, which for
    # `launcher=ddp` is the single parent process: check it for the real number of processes.
    if _value(kwargs, "eval_strategy") in ("no", None):
        return None
    per_device = _value(kwargs, "per_device_eval_batch_size")
    groups = kwargs.get("num_generations_eval") or run.num_generations
    if isinstance(per_device, int) and (per_device * num_processes) % groups:
        return (
            f"`trainer.per_device_eval_batch_size={per_device}`: {per_device} x {num_processes} process(es) "
            f"must be a multiple of the generations per eval prompt, {groups} (TRL's GRPOConfig rule)."
        )
    return None


# GRPOConfig switch -> (package it imports, how to get it).
_NEEDS = {
    "use_vllm": ("vllm", "`pip install vllm` (CUDA GPUs only)"),
    "use_liger_kernel": ("liger_kernel", "`pip install liger-kernel`"),
}


def _installed(run: RunConfig, kwargs: Mapping[str, Any], num_processes: int) -> str | None:
    for field, (package, how) in _NEEDS.items():
        if kwargs.get(field) is True and importlib.util.find_spec(package) is None:
            return f"`trainer.{field}=true`: needs the `{package}` package, which is not installed; {how}."
    return None


CROSS_FIELD_RULES: tuple[Callable[[RunConfig, Mapping[str, Any], int], str | None], ...] = (
    _epsilon_high,
    _eval_batch,
    _installed,
)


# ------------------------------------------------------------------------------------ library checks
_ENUM_ERROR = re.compile(r"^(?P<value>.*) is not a valid (?P<enum>\w+), please select one of \[(?P<choices>.*)\]")
_SIMPLE = (bool, int, float, str, type(None))


def _simple_types(annotation: Any) -> tuple[type, ...] | None:
    """The plain types a field annotation allows, or None when it is not a union of plain types."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    allowed = args or (annotation,)
    return allowed if all(a in _SIMPLE for a in allowed) else None


def _type_ok(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int) and (int in allowed or float in allowed):
        return True
    return any(isinstance(value, t) for t in allowed if t is not bool)


def _check_types(kwargs: Mapping[str, Any], grpo_config_cls: type) -> None:
    """GRPOConfig is a plain dataclass: `trainer.save_steps=abc` would pass it and fail much later."""
    ruled = {rule.key.removeprefix(_T) for rule in RULES}  # checked already, e.g. scale_rewards=false
    for field in dataclasses.fields(grpo_config_cls):
        if field.name not in kwargs or field.name in ruled or (allowed := _simple_types(field.type)) is None:
            continue
        value = kwargs[field.name]
        if not _type_ok(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ConfigError(
                f"`{config_mod.user_key(field.name)}={_show(value)}`: must be {names} "
                f"(the type of TRL's GRPOConfig.{field.name}), got {type(value).__name__}."
            )


def _explain(error: Exception, kwargs: Mapping[str, Any], source: str) -> ConfigError:
    """One line naming the key and value from a library's ValueError/TypeError."""
    text = " ".join(str(error).split())
    if (m := _ENUM_ERROR.match(text)) is not None:
        value, choices = m["value"], [c.strip(" '\"") for c in m["choices"].split(",")]
        field = next((k for k, v in kwargs.items() if str(v) == value), None)
        if field is not None:
            return ConfigError(
                f"`{config_mod.user_key(field)}={value}`: must be one of {', '.join(choices)} ({source})."
                + _nearest_hint(value, choices)
            )
    field = _named_field(text, kwargs)
    if field is None:
        return ConfigError(f"{source} rejects the settings: {text}")
    return ConfigError(f"`{config_mod.user_key(field)}={_show(kwargs[field])}`: {source} rejects it: {text}")


def _named_field(text: str, names: typing.Iterable[str]) -> str | None:
    """The first of ``names`` that the message mentions as a word."""
    found = [(m.start(), name) for name in names if (m := re.search(rf"(?<![\w.]){re.escape(name)}\b", text))]
    return min(found)[1] if found else None


def _grpo_config(run: RunConfig, kwargs: Mapping[str, Any], num_processes: int) -> Any:
    from trl import GRPOConfig

    _check_types(kwargs, GRPOConfig)
    if num_processes > 1 and "eval_strategy" in run.trainer:
        # This process is one of one: TRL would check the eval batch for 1 process, not num_processes
        # (_eval_batch has checked it for the real count).
        run = run.model_copy(update={"trainer": {**run.trainer, "eval_strategy": "no"}})
    environ = dict(os.environ)
    try:
        return config_mod.to_grpo_config(run, output_dir=_UNUSED_DIR, report_to=[], run_name=None)
    except ConfigError as e:
        cause = e.__cause__
        if isinstance(cause, ValueError | TypeError):
            raise _explain(cause, kwargs, f"TRL {trl_version()}'s GRPOConfig") from cause
        raise
    finally:
        # TrainingArguments may set ACCELERATE_*/FSDP_* variables; `accelerate launch` children inherit
        # the parent's environment, so leave it as it was.
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)


# generate() adds one processor per sampling setting that is not a no-op (transformers'
# GenerationMixin._get_logits_processor); their constructors are where bad values are refused.
_PROCESSORS: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("temperature", "TemperatureLogitsWarper", lambda v: v is not None and v != 1.0),
    ("top_k", "TopKLogitsWarper", lambda v: v is not None and v != 0),
    ("top_p", "TopPLogitsWarper", lambda v: v is not None and v != 1.0),
    ("min_p", "MinPLogitsWarper", lambda v: v is not None),
    ("repetition_penalty", "RepetitionPenaltyLogitsProcessor", lambda v: v is not None and v != 1.0),
)


def _generation_config(args: Any) -> None:
    """The GenerationConfig GRPOTrainer builds when it generates with transformers (TRL 1.16, grpo_trainer.py)."""
    from transformers import GenerationConfig
    from transformers.generation import logits_process

    settings = {
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
    }
    extra = args.generation_kwargs if isinstance(args.generation_kwargs, Mapping) else {}
    settings.update(extra)
    keys = {
        name: f"trainer.generation_kwargs.{name}"
        if name in extra
        else ("trainer.max_completion_length" if name == "max_new_tokens" else f"trainer.{name}")
        for name in settings
    }
    try:
        generation = GenerationConfig(**settings, disable_compile=True)
        generation.validate(strict=True)
        for name, processor, active in _PROCESSORS:
            value = getattr(generation, name, None)
            if active(value):
                getattr(logits_process, processor)(value)
    except (ValueError, TypeError) as e:
        text = " ".join(str(e).split())
        name = _named_field(text, settings) or _named_field(text, ["penalty"])
        name = "repetition_penalty" if name == "penalty" else name
        if name is None:
            raise ConfigError(f"transformers' GenerationConfig rejects the sampling settings: {text}") from e
        raise ConfigError(f"`{keys[name]}={_show(settings[name])}`: transformers' generation rejects it: {text}") from e


def _lora_config(run: RunConfig) -> None:
    from grpo_lab.models import lora_config

    try:
        lora_config(run.model)
    except (ValueError, TypeError) as e:
        lora = run.model.lora
        shown = f"r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}, target_modules={lora.target_modules}"
        raise ConfigError(f"`model.lora` ({shown}): peft's LoraConfig rejects it: {' '.join(str(e).split())}") from e


# ---------------------------------------------------------------------------------------------- public
def check(run_cfg: RunConfig, *, num_processes: int) -> Any:
    """Raise ConfigError when TRL, transformers or peft would refuse a setting, or it cannot train.

    Builds TRL's GRPOConfig (importing trl, torch and transformers), the generation config and peft's
    LoraConfig, but no model, no W&B run and nothing on disk. Returns that GRPOConfig (the doctor reads it).
    """
    kwargs = config_mod.grpo_kwargs(run_cfg, output_dir=_UNUSED_DIR, report_to=[], run_name=None)
    _check_rules(run_cfg, kwargs)
    for rule in CROSS_FIELD_RULES:
        if (message := rule(run_cfg, kwargs, num_processes)) is not None:
            raise ConfigError(message)
    args = _grpo_config(run_cfg, kwargs, num_processes)
    if not args.use_vllm:  # vLLM takes the sampling settings itself (checked by the rules above)
        _generation_config(args)
    if run_cfg.model.lora.enabled:
        _lora_config(run_cfg)
    return args
