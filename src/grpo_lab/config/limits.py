"""Values of ``trainer.*`` that TRL or transformers accept but that cannot work: grpo_lab's one table of them.

TRL is the authority on ``trainer.*``: each field's type and choices come from the installed ``GRPOConfig``
(:mod:`grpo_lab.config.trl_fields`). This module adds only what TRL does not declare but needs: ranges (pydantic's
own ``Field`` constraints), which plain-``str`` fields TRL reads as a choice among the values its help names, and
values TRL maps onto a choice. A value outside them would pass GRPOConfig and fail later, inside GRPOTrainer or at
the first ``generate``, after W&B and the model have started. (The rules that span fields: grpo_lab.config.rules.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from grpo_lab.config import trl_fields as grpo_fields
from grpo_lab.config.problems import Problem, problems
from grpo_lab.config.trl_fields import NO_DEFAULT, TrlField


def _whole_or_fraction(value: float) -> float:
    if value >= 1 and not float(value).is_integer():
        raise PydanticCustomError("range", "be a whole number >= 1 of steps, or a fraction in (0, 1) of the run")
    return value


# Ranges, keyed as the user types them. Sampling settings reach transformers' GenerationConfig or vLLM.
LIMITS: dict[str, Any] = {
    "trainer.temperature": Field(gt=0, description="TRL divides the logits by it; e.g. 0.1 samples nearly greedily"),
    "trainer.top_p": Field(gt=0, le=1, description="1.0 keeps every token"),
    "trainer.top_k": Field(ge=0, description="0, TRL's default, or null disables top-k"),
    "trainer.min_p": Field(ge=0, le=1, description="null disables it"),
    "trainer.repetition_penalty": Field(gt=0, description="1.0 means no penalty"),
    "trainer.max_completion_length": Field(ge=1, description="tokens generated per completion"),
    "trainer.num_iterations": Field(ge=1, description="updates per generation batch; 1 is on-policy"),
    # Clipping and loss.
    "trainer.epsilon": Field(ge=0, description="the PPO clip range"),
    "trainer.epsilon_high": Field(ge=0, description="null uses epsilon"),
    "trainer.delta": Field(gt=1, description="the ratio's upper clip; at or below 1 every token is clipped"),
    "trainer.top_entropy_quantile": Field(ge=0, le=1),
    "trainer.off_policy_mask_threshold": Field(gt=0, description="null disables masking"),
    "trainer.sapo_temperature_pos": Field(gt=0, description="the sapo loss divides by it"),
    "trainer.sapo_temperature_neg": Field(gt=0, description="the sapo loss divides by it"),
    "trainer.ref_model_mixup_alpha": Field(ge=0, le=1),
    "trainer.ref_model_sync_steps": Field(ge=1),
    # Batches and logging.
    "trainer.per_device_train_batch_size": Field(ge=1, description="completions per device per step"),
    "trainer.per_device_eval_batch_size": Field(ge=1),
    "trainer.steps_per_generation": Field(ge=1),
    "trainer.generation_batch_size": Field(ge=1),
    "trainer.num_generations_eval": Field(ge=1, description="null uses num_generations"),
    "trainer.logging_steps": (Field(gt=0), AfterValidator(_whole_or_fraction)),
    "trainer.num_completions_to_print": Field(ge=0),
    # vLLM.
    "trainer.vllm_gpu_memory_utilization": Field(gt=0, le=1),
    "trainer.vllm_tensor_parallel_size": Field(ge=1),
    "trainer.vllm_server_port": Field(ge=1, le=65535),
    "trainer.vllm_group_port": Field(ge=1, le=65535),
    "trainer.vllm_server_timeout": Field(gt=0, description="seconds"),
}
# GRPOConfig fields that TRL types as plain `str` but reads as one of the values its help names (any other
# value fails only in the middle of the first training step).
NAMED_CHOICES = frozenset(
    {
        "loss_type",
        "scale_rewards",
        "importance_sampling_level",
        "multi_objective_aggregation",
        "vllm_mode",
        "vllm_model_impl",
        "vllm_importance_sampling_mode",
    }
)
# Values a field takes beyond its declared type: TRL maps true/false onto group/none, and transformers'
# generation reads a null top_k as "off".
ALSO: dict[str, tuple[Any, ...]] = {"scale_rewards": (True, False), "top_k": (None,)}
_PY = {"bool": bool, "int": int, "float": float, "str": str, "null": type(None), "list": list, "dict": dict}
_STRICT = ConfigDict(strict=True)


def choices(field: TrlField) -> tuple[Any, ...] | None:
    """The values TRL allows for ``field``: its Enum/Literal, else (for NAMED_CHOICES) the values its help names."""
    if field.choices:
        return field.choices
    if field.name in NAMED_CHOICES and field.named:
        default = () if field.default == NO_DEFAULT else (field.default,)
        return tuple(dict.fromkeys((*field.named, *default)))
    return None


def _base(field: TrlField) -> Any:
    also = ALSO.get(field.name, ())
    nullable = None in also or "null" in (field.types or ())
    if (allowed := choices(field)) is not None:
        base: Any = Literal[tuple(dict.fromkeys((*allowed, *(a for a in also if a is not None))))]
    elif field.types:
        base = Union[tuple(_PY[t] for t in field.types if t != "null") or (type(None),)]  # noqa: UP007
        if extra := tuple(a for a in also if a is not None):
            base = Union[base, Literal[extra]]  # noqa: UP007
    else:
        return Any
    return Optional[base] if nullable else base  # noqa: UP045


def _why(key: str) -> str:
    limit = LIMITS.get(key, ())
    return (
        next((f.description for f in limit if getattr(f, "description", None)), "")
        if isinstance(limit, tuple)
        else (limit.description or "")
    )


@functools.lru_cache(maxsize=512)
def _adapter(field: TrlField) -> tuple[TypeAdapter, Any]:
    limit = LIMITS.get(f"trainer.{field.name}")
    annotation = _base(field)
    if limit is not None and annotation is not Any:
        annotation = Annotated[(annotation, *(limit if isinstance(limit, tuple) else (limit,)))]
    return TypeAdapter(annotation, config=_STRICT), annotation


def trainer_problems(kwargs: Mapping[str, Any], user_key: Callable[[str], str]) -> list[Problem]:
    """Each GRPOConfig keyword checked against TRL's type and choices and the LIMITS above."""
    fields = grpo_fields.grpo_config_fields()
    found: list[Problem] = []
    for name, value in kwargs.items():
        if name not in fields:
            continue  # unknown keys are config.load's, with the nearest name
        adapter, annotation = _adapter(fields[name])
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            found += problems(e, annotation, prefix=user_key(name), why=_why(f"trainer.{name}"))
    return found
