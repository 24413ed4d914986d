"""What each `hydra.sweeper.*` setting may hold, declared once as a pydantic model.

The defaults live in the sweeper's Hydra schema (``hydra_plugins.grpo_lab_sweeper``), which also refuses an
unknown key or a value of the wrong type while Hydra composes (:func:`grpo_lab.validation.hydra_problem` words
that refusal); this model adds the choices and ranges. It lives outside ``hydra_plugins`` because Hydra
executes every module there on each command, and pydantic must not load for ``--help`` or ``--cfg``.
"""

from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_lab.validation import fail, problems


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Objective(_Settings):
    metric: str = Field(min_length=1)
    direction: Literal["maximize", "minimize"]


class Confirm(_Settings):
    top_k: int = Field(ge=0, description="0: no confirmation runs")
    seeds: int = Field(ge=1)


class SweeperSettings(_Settings):
    study_name: str = Field(min_length=1)
    storage: str | None
    sweep_root: str
    n_trials: int = Field(ge=1)
    n_jobs: int = Field(ge=1)
    objectives: list[Objective] = Field(min_length=1)
    confirm: Confirm
    # `_target_` configs, built (and checked) by grpo_lab.sweep.samplers.
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    params: dict[str, Any]
    enqueue: list[dict[str, Any]]
    max_failure_fraction: float = Field(ge=0, le=1)
    retry_failed: int = Field(ge=0)
    heartbeat_interval: int = Field(gt=0, description="seconds")
    grace_period: int = Field(gt=0, description="seconds")
    keep_models: Literal["all", "best", "none"]
    keep_top_k: int = Field(ge=1)


def check(settings: DictConfig) -> SweeperSettings:
    """The sweeper's settings, checked; a bad one is one ConfigError naming `hydra.sweeper.<key>`."""
    raw = OmegaConf.to_container(settings, resolve=True)
    try:
        return SweeperSettings.model_validate(raw)
    except ValidationError as e:
        raise fail(*problems(e, SweeperSettings, prefix="hydra.sweeper")) from None
