"""A search space written in Hydra's override grammar, turned into Optuna distributions.

    lr: tag(log, interval(1e-6, 1e-4))   -> FloatDistribution(1e-6, 1e-4, log=True)
    beta: interval(0.0, 0.1)             -> FloatDistribution(0.0, 0.1)
    num_generations: choice(2, 4, 8)     -> CategoricalDistribution([2, 4, 8])
    optimizer.gradient_accumulation_steps: range(1, 5)  -> IntDistribution(1, 4)
    model: tiny,smollm2_135m_gguf        -> a choice of config-group options

Anything that is not a sweep is a fixed override passed to every trial as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_lab.config import overrides as ov
from grpo_lab.errors import ConfigError


@dataclass(frozen=True)
class Param:
    name: str  # the config key or group, as Optuna's parameter name
    key_element: str  # what goes left of `=` in the trial's override (`++lr`, `model`)
    distribution: Any  # an optuna.distributions.BaseDistribution


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    fixed: tuple[str, ...]  # overrides given to every trial unchanged

    def overrides_for(self, values: dict[str, Any]) -> list[str]:
        """The overrides that run one trial with these sampled values."""
        return [*self.fixed, *(ov.render(p.key_element, values[p.name]) for p in self.params)]


def _distribution(override: Any) -> Any:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    sweep = override.value()
    key = override.key_or_group
    if unknown := sorted(set(sweep.tags) - _TAGS):
        raise ConfigError(f"Sweep `{key}`: unknown tag {', '.join(unknown)} (the tag grpo_lab reads is `log`).")
    log = "log" in sweep.tags
    if isinstance(sweep, ChoiceSweep):
        if not sweep.list:
            raise ConfigError(f"Sweep `{key}`: choice() needs at least one value.")
        return CategoricalDistribution(list(sweep.list))
    if isinstance(sweep, RangeSweep):
        _check_range(key, sweep)
        if all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step)):
            # Hydra's range excludes its stop, like Python's.
            return IntDistribution(int(sweep.start), int(sweep.stop) - 1, step=int(sweep.step), log=log)
        return CategoricalDistribution(list(sweep.range()))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if low is None or high is None or low >= high:
            raise ConfigError(f"Sweep `{key}`: interval({low}, {high}) needs low < high.")
        if log and low <= 0:
            raise ConfigError(f"Sweep `{key}`: a log interval needs low > 0, got {low}.")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    raise ConfigError(f"Sweep `{key}`: unsupported sweep {sweep!r} (use choice, range, interval, tag(log, ...)).")


_TAGS = {"log"}


def _check_range(key: str, sweep: Any) -> None:
    """Hydra's range(start, stop, step) excludes stop: it must give at least one value."""
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if step is None or step <= 0:
        raise ConfigError(f"Sweep `{key}`: range({start}, {stop}, {step}) needs a step > 0.")
    if start is None or stop is None or start >= stop:
        raise ConfigError(f"Sweep `{key}`: range({start}, {stop}) needs start < stop (stop is excluded).")


def check_values(space: SearchSpace, config: Any) -> None:
    """Every value the sweep can give a trial (each choice, each end of an interval or range, each fixed override
    of a config key) passes that key's declaration, on the sweep's composed base `config`: refused before a trial
    starts, not in every trial. Group selections (`model=...`) and combinations are the trials' own checks."""
    from grpo_lab.config import job

    candidates = [(o, ov.as_dict([o])) for o in space.fixed if o.startswith("++")]
    for param in space.params:
        if param.key_element.startswith("++"):
            candidates += [(param.name, {param.name: v}) for v in _ends(param.distribution)]
    for shown, values in candidates:
        try:
            job.with_values(config, values)
        except ConfigError as e:
            raise ConfigError(f"Sweep `{ov.as_typed(shown)}`: a trial would get {_show(values)}: {e}") from None


def _ends(distribution: Any) -> list[Any]:
    if hasattr(distribution, "choices"):
        return list(distribution.choices)
    return [distribution.low, distribution.high]


def _show(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def expand_wildcards(params: dict[str, Any], config: Any) -> dict[str, Any]:
    """`reward.weights.*: interval(0, 2)` -> one parameter per key of `reward.weights` in the composed config.

    So a sweep file can say "every reward of whatever reward set is selected".
    """
    from omegaconf import DictConfig, OmegaConf

    out: dict[str, Any] = {}
    for key, value in params.items():
        if not key.endswith(".*"):
            out[key] = value
            continue
        node = OmegaConf.select(config, key[:-2])
        if not isinstance(node, DictConfig) or not node:
            raise ConfigError(f"Sweep parameter `{key}`: `{key[:-2]}` is not a non-empty mapping in the config.")
        for child in node:
            out.setdefault(f"{key[:-2]}.{child}", value)
    return out


def parse_space(params: dict[str, Any], arguments: list[str], groups: set[str]) -> SearchSpace:
    """The sweep file's `params` plus the command line's overrides; the command line wins per key.

    Plain config keys are force-added like the CLI's (:func:`grpo_lab.config.overrides.normalise`), so that any TRL
    field can be swept or set; group selections stay plain.
    """
    lines = [f"{key}={value}" for key, value in (params or {}).items()]
    by_key: dict[str, Any] = {}
    try:
        for override in ov.parse_all([*lines, *arguments]):
            by_key[override.key_or_group] = override
    except Exception as e:  # Hydra's grammar errors say exactly what is wrong with the expression
        raise ConfigError(f"Cannot parse the sweep's search space: {e}") from e
    found: list[Param] = []
    fixed: list[str] = []
    for key, override in by_key.items():
        if override.is_sweep_override():
            found.append(
                Param(name=key, key_element=ov.key_element(override, groups), distribution=_distribution(override))
            )
        else:
            fixed.append(ov.normalise(override, groups))
    if not found:
        raise ConfigError(
            "The sweep has no search space: add `hydra.sweeper.params` (e.g. `lr: tag(log, interval(1e-6, 1e-4))`) "
            "or sweep overrides on the command line."
        )
    return SearchSpace(params=tuple(found), fixed=tuple(fixed))
