"""grpo_lab's settings in TRL's, transformers' and peft's terms, and what those libraries themselves refuse.

TRL is the authority on its settings: :func:`grpo_config` builds the real ``GRPOConfig`` (TRL's ``__post_init__``
checks it), and the job keeps it (one per process: see grpo_lab.config.job). :data:`TRAINER_FIELDS` is the one table
of the ``GRPOConfig`` fields grpo_lab sets from its own keys (``learning_rate`` from ``lr``...): the keyword
arguments, the key a user types for a field, and the refusal of ``trainer.learning_rate`` all read it. A library's
refusal names the key that caused it, found by asking the library again without that key, never by reading its
message. Importing TRL, transformers or peft happens only in the functions that need them (~4 s, once).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from grpo_lab.config import trl_fields
from grpo_lab.config.problems import UNSET, Problem, fail
from grpo_lab.config.trl_fields import trl_version

if TYPE_CHECKING:
    import peft

    from grpo_lab.config.schema import ModelConfig, RunConfig


def _checkpointing_field() -> str:
    """transformers 5 renamed it (the old name warns on every run); older releases have only the old one."""
    fields = trl_fields.grpo_config_fields()
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


# GRPOConfig field -> (the key a user types for it, its value in a run). Every other field is `trainer.<field>`.
TRAINER_FIELDS: dict[str, tuple[str, Callable[[RunConfig], Any]]] = {
    "learning_rate": ("lr", lambda run: run.lr),
    "beta": ("beta", lambda run: run.beta),
    "num_generations": ("num_generations", lambda run: run.num_generations),
    "seed": ("seed", lambda run: run.seed),
    "max_steps": ("max_steps", lambda run: run.max_steps),
    "optim": ("optimizer.optim", lambda run: run.optimizer.optim),
    "weight_decay": ("optimizer.weight_decay", lambda run: run.optimizer.weight_decay),
    # transformers 5 reads a float in [0, 1) as a fraction of the total steps.
    "warmup_steps": ("optimizer.warmup_ratio", lambda run: run.optimizer.warmup_ratio),
    "lr_scheduler_type": ("optimizer.scheduler", lambda run: run.optimizer.scheduler),
    "max_grad_norm": ("optimizer.max_grad_norm", lambda run: run.optimizer.max_grad_norm),
    "gradient_accumulation_steps": (
        "optimizer.gradient_accumulation_steps",
        lambda run: run.optimizer.gradient_accumulation_steps,
    ),
    "gradient_checkpointing": ("model.gradient_checkpointing", lambda run: run.model.gradient_checkpointing),
    "activation_checkpointing": ("model.gradient_checkpointing", lambda run: run.model.gradient_checkpointing),
    "reward_weights": ("reward.weights", lambda run: run.reward.ordered_weights()),
    # Set from the job (its folder, its tracker, its name), never by a user.
    "output_dir": ("hydra.run.dir", None),
    "run_name": ("logger.name", None),
    "report_to": ("logger", None),
}


def user_key(field: str) -> str:
    """The key a user types for GRPOConfig field ``field``: ``lr`` for ``learning_rate``, else ``trainer.<field>``."""
    return TRAINER_FIELDS[field][0] if field in TRAINER_FIELDS else f"trainer.{field}"


def grpo_kwargs(run: RunConfig, *, output_dir: str, report_to: list[str], run_name: str | None) -> dict[str, Any]:
    """Keyword arguments for ``trl.GRPOConfig``: the user's `trainer.*` plus the fields grpo_lab sets."""
    owned = {
        field: value(run)
        for field, (_, value) in TRAINER_FIELDS.items()
        if value is not None and (not field.endswith("_checkpointing") or field == _checkpointing_field())
    }
    return {**run.trainer, **owned, "output_dir": output_dir, "report_to": report_to, "run_name": run_name}


def grpo_config(run: RunConfig, *, output_dir: str, report_to: list[str], run_name: str | None) -> Any:
    """TRL's GRPOConfig for the run (imports trl); TRL's refusal is one line naming the `trainer.*` key behind it.

    The process's environment is left as it was (TrainingArguments may set ACCELERATE_*/FSDP_* variables, which
    `accelerate launch` children would inherit)."""
    environ = dict(os.environ)
    try:
        try:
            return _build(run, output_dir, report_to, run_name)
        except (ValueError, TypeError) as e:
            key = _culprit(run)
            why = f"TRL {trl_version()}'s GRPOConfig rejects it: {' '.join(str(e).split())}"
            value = run.trainer[key] if key is not None else UNSET
            raise fail(Problem(f"trainer.{key}" if key else "trainer", "rejected", value, why)) from e
    finally:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)


def _build(run: RunConfig, output_dir: str, report_to: list[str], run_name: str | None) -> Any:
    import torch
    from trl import GRPOConfig

    kwargs = grpo_kwargs(run, output_dir=output_dir, report_to=report_to, run_name=run_name)
    if "use_cpu" not in kwargs and not torch.cuda.is_available():
        # Without it, transformers sets up its device state without cpu=True and, under `accelerate
        # launch`, sees one process instead of the world size; with it, CPU ranks use gloo (MULTI_CPU).
        kwargs["use_cpu"] = True
    # `trainer.temperature=2` arrives as an int; transformers' sampling warpers refuse a non-float.
    for name, annotation in vars(GRPOConfig).get("__annotations__", {}).items():
        value = kwargs.get(name)
        if type(value) is int and annotation in (float, float | None, "float", "float | None"):
            kwargs[name] = float(value)
    return GRPOConfig(**kwargs)


def _culprit(run: RunConfig) -> str | None:
    """The first `trainer.*` key without which TRL accepts the settings."""
    for key in run.trainer:
        trainer = {k: v for k, v in run.trainer.items() if k != key}
        try:
            _build(run.model_copy(update={"trainer": trainer}), UNUSED_DIR, [], None)
        except (ValueError, TypeError):
            continue
        return key
    return None


# GRPOConfig needs an output_dir; building the config does not create it (checked by a test).
UNUSED_DIR = os.path.join(__import__("tempfile").gettempdir(), "grpo_lab-trl-check-never-created")


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


def generation_problem(args: Any) -> Problem | None:
    """What transformers' generation refuses of the GenerationConfig GRPOTrainer builds from `args` when it generates
    with transformers (TRL 1.16, grpo_trainer.py); None when it accepts it."""
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
        return None
    name, error = found
    if name in extra:
        key = f"trainer.generation_kwargs.{name}"
    else:
        key = "trainer.max_completion_length" if name == "max_new_tokens" else f"trainer.{name}" if name else "trainer"
    why = f"transformers' generation rejects it: {' '.join(str(error).split())}"
    return Problem(key, "rejected", settings.get(name, UNSET), why)


# ------------------------------------------------------------------------------------------------- peft
def lora_config(cfg: ModelConfig) -> peft.LoraConfig | None:
    """The peft LoRA config to pass to GRPOTrainer as ``peft_config``, or None to train all weights."""
    if not cfg.lora.enabled:
        return None
    import peft

    target = cfg.lora.target_modules
    return peft.LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        task_type="CAUSAL_LM",
    )


def lora_problem(cfg: ModelConfig) -> Problem | None:
    """What peft's LoraConfig refuses of the run's adapter; None when it accepts it (or LoRA is off)."""
    try:
        lora_config(cfg)
    except (ValueError, TypeError) as e:
        return Problem("model.lora", "rejected", must=f"peft's LoraConfig rejects it: {' '.join(str(e).split())}")
    return None
