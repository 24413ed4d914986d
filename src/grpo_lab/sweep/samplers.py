"""Optuna samplers and pruners from the sweeper's config (`hydra.sweeper.sampler` / `.pruner`).

Shared by the sweeper and by the trial's job: `Trial.should_prune()` asks the pruner of the study
object in the job's own process, so the job must build the same pruner the sweep was configured with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_lab.errors import ConfigError


def build_sampler(spec: Mapping[str, Any], seed: int | None) -> Any:
    import optuna

    name = spec["name"]
    if name == "tpe":
        # constant_liar: concurrent trials see each other's pending points instead of piling onto one.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec["n_startup_trials"], constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsgaii":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise ConfigError(f"Unknown sampler {name!r}: use tpe, random or nsgaii (hydra.sweeper.sampler.name).")


def build_pruner(spec: Mapping[str, Any] | None) -> Any:
    import optuna

    name = "none" if spec is None else spec["name"]
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=spec["n_startup_trials"], n_warmup_steps=spec["n_warmup_steps"]
        )
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec["min_resource"], reduction_factor=spec["reduction_factor"]
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=spec["min_resource"], reduction_factor=spec["reduction_factor"]
        )
    raise ConfigError(
        f"Unknown pruner {name!r}: use median, successive_halving, hyperband or none (hydra.sweeper.pruner.name)."
    )
