"""The sweeper's settings (`hydra.sweeper.*`), each declared once: its type and default (Hydra's structured config,
registered by ``hydra_plugins.grpo_lab_sweeper``), its range or choices and its meaning (the field's metadata).

Hydra refuses an unknown key or a value of the wrong type while it composes (grpo_lab.config.problems.hydra_problem
words that refusal); :func:`check` adds the ranges and choices and returns the settings typed. Kept light (no
pydantic, no Optuna at import): Hydra imports the plugin, and so this module, on every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

# Where a sweep keeps its Optuna study unless `hydra.sweeper.storage` says otherwise (the sweeper and the doctor).
DEFAULT_STORAGE = "sqlite:///outputs/sweeps/optuna.db"


def _meta(help: str, **limits: Any) -> dict[str, Any]:
    return {"help": help, **limits}


@dataclass
class ConfirmSettings:
    top_k: int = field(
        default=0,
        metadata=_meta(
            "after the search, re-run the top_k configs with `seeds` more seeds each (seed + 1 .. seed + seeds) and "
            "pick the winner by the mean over seeds; 0: no confirmation (one objective only; `seed` not swept)",
            ge=0,
        ),
    )
    seeds: int = field(default=2, metadata=_meta("the more seeds each confirmed config runs with", ge=1))


@dataclass
class SweeperSettings:
    _target_: str = "hydra_plugins.grpo_lab_sweeper.sweeper.GrpoOptunaSweeper"
    # The sampler and pruner configs reach the sweeper as configs: it seeds each worker's sampler itself and
    # hands the pruner's config to every trial's job.
    _recursive_: bool = False
    # The sampler and the pruner are `_target_` configs, options of the groups hydra/sweeper/sampler and
    # hydra/sweeper/pruner (conf/hydra/sweeper/): `hydra/sweeper/pruner=hyperband`, or a file of one's own.
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": "median"}])
    study_name: str = field(
        default="grpo_lab", metadata=_meta("the Optuna study; trial folders go under it", min_len=1)
    )
    storage: Optional[str] = field(  # noqa: UP045 (OmegaConf's structured configs need Optional)
        default=None,
        metadata=_meta(
            f"null: {DEFAULT_STORAGE}; any Optuna RDB URL (postgresql+psycopg2://...), journal:<path> for a journal "
            "file shared by workers without a database, or grpc://HOST:PORT for Optuna's proxy"
        ),
    )
    sweep_root: str = field(default="outputs/sweeps", metadata=_meta("trial folders: <sweep_root>/<study>/trial_<n>/"))
    n_trials: int = field(
        default=8,
        metadata=_meta(
            "finished (complete or pruned) trials the study should reach, over all workers and restarts: running "
            "the command again continues the study up to it",
            ge=1,
        ),
    )
    n_jobs: int = field(default=1, metadata=_meta("trials launched at once (hydra/launcher=joblib: in parallel)", ge=1))
    objectives: Any = field(
        default_factory=lambda: [{"metric": "eval_after/accuracy", "direction": "maximize"}],
        metadata=_meta("a list of {metric, direction}: grpo_lab.config.Objective each", min_len=1),
    )
    confirm: ConfirmSettings = field(default_factory=ConfirmSettings)
    sampler: Any = "???"
    pruner: Any = "???"
    params: Any = field(default_factory=dict, metadata=_meta("key: override-grammar sweep, e.g. `lr: tag(log, ...)`"))
    enqueue: Any = field(default_factory=list, metadata=_meta("parameter sets to try first (a new study only)"))
    max_failure_fraction: float = field(
        default=0.5, metadata=_meta("stop when more than this share of ended trials failed (after 3)", ge=0, le=1)
    )
    retry_failed: int = field(
        default=0, metadata=_meta("re-run a trial a killed worker left RUNNING up to this many times", ge=0)
    )
    heartbeat_interval: int = field(default=10, metadata=_meta("seconds between running trials' heartbeats", gt=0))
    grace_period: int = field(default=30, metadata=_meta("seconds of silence after which a trial is stale", gt=0))
    keep_models: str = field(
        default="best",
        metadata=_meta(
            "trial models kept on disk: best (the best keep_top_k, or the Pareto front), all, or none (no model "
            "saved; a fp32 SmolLM2-135M is ~517 MB a trial)",
            choices=("all", "best", "none"),
        ),
    )
    keep_top_k: int = field(default=1, metadata=_meta("how many of the best trials keep their model", ge=1))


def check(settings: Any) -> SweeperSettings:
    """The sweeper's settings (Hydra's keyword arguments, a DictConfig or a mapping), typed and checked against each
    field's range and choices; a bad value is one ConfigError naming `hydra.sweeper.<key>`. Nested values (sampler,
    pruner, params, objectives) come back as plain dicts and lists."""
    from omegaconf import OmegaConf

    from grpo_lab.config.problems import fail

    if isinstance(settings, SweeperSettings):
        typed = settings
    else:
        raw = OmegaConf.to_container(OmegaConf.create(dict(settings)), resolve=True)
        names = {f.name for f in fields(SweeperSettings)} - {"defaults"}
        typed = SweeperSettings(**{k: v for k, v in raw.items() if k in names})
        typed.confirm = ConfirmSettings(**typed.confirm) if isinstance(typed.confirm, dict) else typed.confirm
    found = _out_of_bounds(typed, "hydra.sweeper") + _objective_problems(typed.objectives)
    if found := found + _study_name_problems(typed.study_name) + _seed_problems(typed.sampler):
        raise fail(*found)
    return typed


def _out_of_bounds(settings: Any, prefix: str) -> list[Any]:
    from grpo_lab.config.problems import Problem, nearest, show

    found = []
    for f in fields(settings):
        value, key, limit = getattr(settings, f.name), f"{prefix}.{f.name}", f.metadata
        if is_dataclass(value):
            found += _out_of_bounds(value, key)
            continue
        bounds = [("ge", lambda v, b: v >= b, "be >= {}"), ("gt", lambda v, b: v > b, "be > {}"),
                  ("le", lambda v, b: v <= b, "be <= {}")]  # fmt: skip
        for name, holds, must in bounds:
            if name in limit and isinstance(value, int | float) and not holds(value, limit[name]):
                found.append(Problem(key, "range", value, must.format(show(limit[name])), limit["help"]))
        if "choices" in limit and value not in limit["choices"]:
            must = "be one of " + ", ".join(limit["choices"])
            near = nearest(str(value), list(limit["choices"]))
            found.append(Problem(key, "choice", value, must, limit["help"], near=near))
        if "min_len" in limit and hasattr(value, "__len__") and len(value) < limit["min_len"]:
            found.append(Problem(key, "range", value, f"hold at least {limit['min_len']}", limit["help"]))
    return found


def _study_name_problems(name: Any) -> list[Any]:
    """The study's name is its folder's (<sweep_root>/<study_name>): one folder, inside sweep_root."""
    from grpo_lab.config.problems import Problem

    if isinstance(name, str) and name and ("/" in name or "\\" in name or name in (".", "..")):
        must = "must be a folder name (no `/`, not `.` or `..`): its trials go in <sweep_root>/<study_name>"
        return [Problem("hydra.sweeper.study_name", "rule", name, must)]
    return []


def _seed_problems(sampler: Any) -> list[Any]:
    from grpo_lab.config.problems import Problem

    seed = sampler.get("seed") if isinstance(sampler, dict) else None
    if seed is None or (isinstance(seed, int) and not isinstance(seed, bool)):
        return []
    return [Problem("hydra.sweeper.sampler.seed", "type", seed, "be an integer or null (each worker adds its number)")]


def _objective_problems(objectives: Any) -> list[Any]:
    from pydantic import ValidationError

    from grpo_lab.config.problems import Problem, problems
    from grpo_lab.config.schema import Objective

    if not isinstance(objectives, list):
        return [Problem("hydra.sweeper.objectives", "type", objectives, "be a list of {metric, direction}")]
    found = []
    for i, objective in enumerate(objectives):
        try:
            Objective.model_validate(objective)
        except ValidationError as e:
            found += problems(e, Objective, prefix=f"hydra.sweeper.objectives.{i}")
    return found
