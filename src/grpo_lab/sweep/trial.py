"""Inside a trial's job: report intermediate values to Optuna and stop training when its pruner says so.

The sweeper owns the study's lifecycle (ask, tell); the job only rebuilds its own trial from the
storage (`optuna.Trial(study, trial_id)`), calls `report()` / `should_prune()`, and raises
`optuna.TrialPruned` once training has stopped, which the sweeper records as PRUNED.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from grpo_lab.config import RunConfig, TrialConfig

log = logging.getLogger("grpo_lab")

# Smoothing of a training metric used as the intermediate value (single steps are noisy).
_EMA = 0.3


def intermediate_source(cfg: RunConfig) -> tuple[str, str] | None:
    """("eval", name) when periodic evaluation measures the objective, ("train", key) for a logged key.

    None when nothing during training tracks the objective (then the trial is not pruned).
    """
    prefix, _, name = cfg.objective.metric.partition("/")
    if prefix in ("eval_after", "eval_before") and cfg.eval.every_n_steps:
        return ("eval", name)
    if prefix == "train":
        key = name.removesuffix("_end").removesuffix("_start") if name.startswith("reward_") else name
        return ("train", key)
    if cfg.objective.direction == "maximize":
        return ("train", "reward")  # an accuracy objective without periodic eval: the reward tracks it best
    return None


class TrialReporter:
    """One Optuna trial, rebuilt in the job process from its storage."""

    def __init__(self, trial_cfg: TrialConfig, source: tuple[str, str] | None) -> None:
        import optuna

        self.source = source
        self.pruned = False
        self.last: tuple[int, float] | None = None
        self._ema: float | None = None
        from grpo_lab.redact import reveal
        from grpo_lab.sweep.samplers import build_pruner
        from grpo_lab.sweep.storage import open_storage

        # The job's own study object decides should_prune(): it needs the sweep's pruner, not Optuna's default.
        study = optuna.load_study(
            study_name=trial_cfg.study,
            storage=open_storage(reveal(trial_cfg.storage)),  # the sweeper masks the password in overrides
            pruner=build_pruner(trial_cfg.pruner),
        )
        self.trial = optuna.Trial(study, trial_cfg.id)
        wanted = trial_cfg.pruner is not None
        self.enabled = wanted and source is not None and len(study.directions) == 1
        if wanted and not self.enabled:
            log.info("Trial %d: no intermediate value tracks the objective; pruning is off.", trial_cfg.number)

    def observe_log(self, step: int, logs: dict[str, Any]) -> bool:
        """A trainer log row; returns True when training should stop."""
        if not self.enabled or self.source is None or self.source[0] != "train":
            return False
        value = logs.get(self.source[1])
        if not isinstance(value, int | float) or not math.isfinite(value):
            return False
        self._ema = value if self._ema is None else _EMA * value + (1 - _EMA) * self._ema
        return self._report(step, self._ema)

    def observe_eval(self, step: int, metrics: dict[str, float]) -> bool:
        if not self.enabled or self.source is None or self.source[0] != "eval":
            return False
        value = metrics.get(self.source[1])
        return value is not None and math.isfinite(value) and self._report(step, value)

    def _report(self, step: int, value: float) -> bool:
        self.trial.report(value, step)
        self.last = (step, value)
        if self.trial.should_prune():
            self.pruned = True
            log.info("Trial %d pruned at step %d (intermediate value %.4g).", self.trial.number, step, value)
        return self.pruned


def pruned_error(reporter: TrialReporter) -> Exception:
    import optuna

    step, value = reporter.last or (0, float("nan"))
    return optuna.TrialPruned(f"pruned at step {step} (intermediate value {value:.4g})")
