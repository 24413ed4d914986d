"""Optuna samplers and pruners from the sweeper's `_target_` configs (`hydra.sweeper.sampler` / `.pruner`).

The options are the files of conf/hydra/sweeper/{sampler,pruner}/ (and of a user's config folder), picked
with `hydra/sweeper/pruner=hyperband`; Hydra's `instantiate` builds them, so any Optuna sampler or pruner
(or one of the user's own) works without code here. Shared by the sweeper and by the trial's job:
`Trial.should_prune()` asks the pruner of the study object in the job's own process, so the job must build
the same pruner the sweep was configured with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_lab.config.problems import nearest
from grpo_lab.errors import ConfigError

PRUNE_NO_SIGNAL = "prune_no_signal"  # grpo_lab's key in a pruner's config; the rest is Optuna's


def build_sampler(spec: Mapping[str, Any], seed: int | None) -> Any:
    """The sampler of `spec`, seeded with `seed` (the sweep's seed + the worker's number) if it takes a seed."""
    return _build("sampler", spec, **({"seed": seed} if "seed" in spec else {}))


def build_pruner(spec: Mapping[str, Any] | None) -> Any:
    """The pruner of `spec`; Optuna's NopPruner for None (a trial that is not pruned)."""
    import optuna

    if spec is None:
        return optuna.pruners.NopPruner()
    return _build("pruner", {k: v for k, v in spec.items() if k != PRUNE_NO_SIGNAL})


def prunes_no_signal(spec: Mapping[str, Any] | None) -> bool:
    """Whether a trial of a sweep with this pruner also ends, PRUNED, when the health rule `no_signal` fires
    before any log showed a signal (grpo_lab's own key of the pruner's config, not Optuna's: a trial whose
    rewards have not varied within a group has a zero GRPO gradient, so its later steps buy nothing whatever
    the pruner would say). `spec` is what the sweeper hands a trial: None when its pruner cannot prune."""
    return spec is not None and bool(spec.get(PRUNE_NO_SIGNAL, False))


def prunes(spec: Mapping[str, Any]) -> bool:
    """Whether the pruner of `spec` can stop a trial (`hydra/sweeper/pruner=none` cannot)."""
    import optuna

    return not isinstance(build_pruner(spec), optuna.pruners.NopPruner)


def per_item(spec: Mapping[str, Any] | None) -> bool:
    """Whether the pruner of `spec` compares trials item by item on the held-out evaluation (Optuna's
    WilcoxonPruner: intermediate values are per-item results, their steps the items' ids)."""
    import optuna

    return spec is not None and isinstance(build_pruner(spec), optuna.pruners.WilcoxonPruner)


def _build(kind: str, spec: Mapping[str, Any], **kwargs: Any) -> Any:
    import warnings

    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from optuna.exceptions import ExperimentalWarning

    spec = dict(spec)
    if "name" in spec:
        raise renamed(kind, spec["name"])
    if "_target_" not in spec:
        raise ConfigError(f"`hydra.sweeper.{kind}` needs a `_target_` (options: {', '.join(options(kind))}).")
    try:
        with warnings.catch_warnings():
            # e.g. WilcoxonPruner is "experimental" in Optuna: a choice the user made, said on every build
            warnings.filterwarnings("ignore", category=ExperimentalWarning)
            return instantiate(spec, **kwargs)
    except InstantiationException as e:  # a typo in the target or in one of its arguments
        hint = _nearest_argument(spec)
        detail = " ".join(str(e.__cause__ or e).split())  # Hydra's message spans lines
        raise ConfigError(f"`hydra.sweeper.{kind}` ({spec['_target_']}) cannot be built: {detail}{hint}") from None


def _nearest_argument(spec: dict[str, Any]) -> str:
    """`. Did you mean `x`?` for the first argument the target does not take, when a close one exists."""
    import inspect

    from hydra.utils import get_class

    try:
        accepted = list(inspect.signature(get_class(spec["_target_"])).parameters)
    except Exception:  # the target itself is what is wrong: Hydra's message says so
        return ""
    for key in spec:
        if key != "_target_" and key not in accepted and (close := nearest(key, accepted)):
            return f". Did you mean `{close}`?"
    return ""


def renamed(kind: str, name: Any) -> ConfigError:
    """The flat settings of earlier grpo_lab (`hydra.sweeper.pruner.name=none`), in a sweep file or typed."""
    return ConfigError(
        f"`hydra.sweeper.{kind}.name` is gone: pick the {kind} as a config group, "
        f"`hydra/sweeper/{kind}={name}` (options: {', '.join(options(kind))})."
    )


def options(kind: str) -> list[str]:
    """The names of the `hydra/sweeper/<kind>` options in every config folder (ours and the user's)."""
    from grpo_lab.paths import config_dirs

    return sorted({p.stem for d in config_dirs() for p in (d / "hydra" / "sweeper" / kind).glob("*.yaml")})
