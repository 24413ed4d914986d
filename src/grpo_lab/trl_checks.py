"""Would TRL, transformers and peft accept this run's settings, and can they work? Checked before W&B or a model.

:func:`grpo_lab.config.load` has already checked every ``trainer.*`` value against TRL's declared types and
choices and grpo_lab's table of values that cannot work (:mod:`grpo_lab.limits`), without importing TRL.
:func:`check` adds what needs the libraries themselves (imports trl, ~4 s, once: training needs these imports
anyway): the rules that span fields, the real ``GRPOConfig`` (TRL's ``__post_init__``), the
``GenerationConfig`` GRPOTrainer builds from it and the logits processors ``generate`` will create, and
peft's ``LoraConfig``. A library's refusal names the key that caused it, found by asking the library again
without that key, never by reading its message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from grpo_lab import config as config_mod
from grpo_lab import limits
from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import trl_version
from grpo_lab.validation import UNSET, Problem, fail

if typing.TYPE_CHECKING:
    from grpo_lab.config import RunConfig

# GRPOConfig needs an output_dir; building the config does not create it (checked by a test).
UNUSED_DIR = os.path.join(tempfile.gettempdir(), "grpo_lab-trl-check-never-created")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# ------------------------------------------------------------------------------------------ GRPOConfig
def _build(run: RunConfig) -> Any:
    return config_mod.to_grpo_config(run, output_dir=UNUSED_DIR, report_to=[], run_name=None)


def _culprit(run: RunConfig) -> str | None:
    """The first `trainer.*` key without which TRL accepts the settings."""
    for key in run.trainer:
        trainer = {k: v for k, v in run.trainer.items() if k != key}
        try:
            _build(run.model_copy(update={"trainer": trainer}))
        except ConfigError:
            continue
        return key
    return None


def _grpo_config(run: RunConfig, num_processes: int) -> Any:
    if num_processes > 1 and "eval_strategy" in run.trainer:
        # This process is one of one: TRL would check the eval batch for 1 process, not num_processes
        # (limits._eval_batch has checked it for the real count).
        run = run.model_copy(update={"trainer": {**run.trainer, "eval_strategy": "no"}})
    environ = dict(os.environ)
    try:
        try:
            return _build(run)
        except ConfigError as e:
            if not isinstance(e.__cause__, ValueError | TypeError):
                raise
            key = _culprit(run)
            source = f"TRL {trl_version()}'s GRPOConfig rejects it: {_one_line(e.__cause__)}"
            value = run.trainer[key] if key is not None else UNSET
            raise fail(Problem(f"trainer.{key}" if key else "trainer", "rejected", value, source)) from e.__cause__
    finally:
        # TrainingArguments may set ACCELERATE_*/FSDP_* variables; `accelerate launch` children inherit
        # the parent's environment, so leave it as it was.
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)


# --------------------------------------------------------------------------------------- generation
# generate() adds one processor per sampling setting that is not a no-op (transformers'
# GenerationMixin._get_logits_processor); their constructors are where bad values are refused.
_PROCESSORS: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("temperature", "TemperatureLogitsWarper", lambda v: v is not None and v != 1.0),
    ("top_k", "TopKLogitsWarper", lambda v: v is not None and v != 0),
    ("top_p", "TopPLogitsWarper", lambda v: v is not None and v != 1.0),
    ("min_p", "MinPLogitsWarper", lambda v: v is not None),
    ("repetition_penalty", "RepetitionPenaltyLogitsProcessor", lambda v: v is not None and v != 1.0),
)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _generation_error(settings: Mapping[str, Any]) -> tuple[str, Exception] | None:
    """(the setting, transformers' error) for the first setting generation refuses, else None."""
    from transformers import GenerationConfig
    from transformers.generation import logits_process

    try:
        generation = GenerationConfig(**settings, disable_compile=True)
        generation.validate(strict=True)
    except (ValueError, TypeError) as e:
        with _quiet("transformers"):  # a probe without do_sample would warn about the sampling flags
            name = next(
                (n for n in settings if _generation_error({k: v for k, v in settings.items() if k != n}) is None), ""
            )
        return name, e
    for name, processor, active in _PROCESSORS:
        value = getattr(generation, name, None)
        try:
            if active(value):
                getattr(logits_process, processor)(value)
        except (ValueError, TypeError) as e:
            return name, e
    return None


def _generation_config(args: Any) -> None:
    """The GenerationConfig GRPOTrainer builds when it generates with transformers (TRL 1.16, grpo_trainer.py)."""
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
    if (found := _generation_error(settings)) is None:
        return
    name, error = found
    if name in extra:
        key = f"trainer.generation_kwargs.{name}"
    else:
        key = "trainer.max_completion_length" if name == "max_new_tokens" else f"trainer.{name}" if name else "trainer"
    value = settings.get(name, UNSET)
    why = f"transformers' generation rejects it: {_one_line(error)}"
    raise fail(Problem(key, "rejected", value, why)) from error


def _lora_config(run: RunConfig) -> None:
    from grpo_lab.models import lora_config

    try:
        lora_config(run.model)
    except (ValueError, TypeError) as e:
        raise fail(Problem("model.lora", "rejected", must=f"peft's LoraConfig rejects it: {_one_line(e)}")) from e


# ---------------------------------------------------------------------------------------------- public
def check(run_cfg: RunConfig, *, num_processes: int) -> Any:
    """Raise ConfigError when TRL, transformers or peft would refuse a setting, or it cannot train.

    Builds TRL's GRPOConfig (importing trl, torch and transformers), the generation config and peft's
    LoraConfig, but no model, no W&B run and nothing on disk. Returns that GRPOConfig (the doctor reads it).
    """
    kwargs = config_mod.grpo_kwargs(run_cfg, output_dir=UNUSED_DIR, report_to=[], run_name=None)
    found = [p for rule in limits.CROSS_FIELD_RULES if (p := rule(run_cfg, kwargs, num_processes)) is not None]
    if found:
        raise fail(found[0])
    args = _grpo_config(run_cfg, num_processes)
    if not args.use_vllm:  # vLLM takes the sampling settings itself (checked by config.load)
        _generation_config(args)
    if run_cfg.model.lora.enabled:
        _lora_config(run_cfg)
    return args
