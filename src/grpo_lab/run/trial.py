"""Inside a trial's job: report intermediate values to Optuna and stop training when its pruner says so.

The sweeper owns the study's lifecycle (ask, tell); the job only rebuilds its own trial from the
storage (`optuna.Trial(study, trial_id)`), calls `report()` / `should_prune()`, and raises
`optuna.TrialPruned` once training has stopped, which the sweeper records as PRUNED.

Two kinds of intermediate value: a metric over training steps (the smoothed training reward or a periodic
evaluation, for the median, successive-halving and hyperband pruners), or, for Optuna's WilcoxonPruner, the
held-out evaluation after training item by item (step = the item's id, value = 1/0), in an order shuffled
per trial, so that a trial significantly worse than the best one stops its evaluation early.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from grpo_lab import interrupts
from grpo_lab.config import RunConfig, TrialConfig

log = logging.getLogger("grpo_lab")

# Smoothing of a training metric used as the intermediate value (single steps are noisy).
_EMA = 0.3


def intermediate_source(cfg: RunConfig) -> tuple[str, str] | None:
    """("eval", name) when periodic evaluation measures the objective, ("train", key) for a logged key,
    ("items", name) when a per-item pruner watches the evaluation after training (`samplers.per_item`).

    None when nothing tracks the objective (then the trial is not pruned).
    """
    from grpo_lab.config.samplers import per_item

    prefix, _, name = cfg.objective.metric.partition("/")
    if per_item(cfg.trial.pruner if cfg.trial is not None else None):
        return ("items", name) if prefix == "eval_after" and cfg.eval.after else None
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
        self._items: list[float] = []  # per-item values reported so far ("items" source)
        self.number = trial_cfg.number
        self.best_number: int | None = None  # the trial a per-item pruner compared this one with
        from grpo_lab.config.samplers import build_pruner, prunes_no_signal
        from grpo_lab.redact import reveal
        from grpo_lab.run.study import open_storage

        self._storage = open_storage(reveal(trial_cfg.storage))  # the sweeper masks the password in overrides
        # The job's own study object decides should_prune(): it needs the sweep's pruner, not Optuna's default.
        with interrupts.deferred():
            pruner = build_pruner(trial_cfg.pruner)
            study = optuna.load_study(study_name=trial_cfg.study, storage=self._storage, pruner=pruner)
            self.trial = optuna.Trial(study, trial_cfg.id)
        wanted = trial_cfg.pruner is not None
        self.enabled = wanted and source is not None and len(study.directions) == 1
        if wanted and not self.enabled:
            log.info("Trial %d: no intermediate value tracks the objective; pruning is off.", trial_cfg.number)
        # (a per-item pruner's trials are compared on their evaluation after training, not pruned in it)
        self.no_signal = self.enabled and not self.per_item and prunes_no_signal(trial_cfg.pruner)
        self.reason: str | None = None  # why a rule other than the pruner's comparison pruned the trial

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

    def observe_no_signal(self, step: int, message: str) -> bool:
        """The health rule `no_signal` fired (health.Monitor's message); returns True when that prunes the
        trial (its pruner's config says `prune_no_signal: true`). The intermediate value stays the last one
        reported: a sampler ranks the trial by it, as any pruned trial."""
        if not self.no_signal or self.pruned:
            return False
        self.pruned, self.reason = True, message
        self.last = (step, self.last[1] if self.last else float("nan"))  # nan: no intermediate value yet
        log.info("Trial %d pruned at step %d: no learning signal (health.no_signal).", self.number, step)
        return True

    @property
    def per_item(self) -> bool:
        return self.enabled and self.source is not None and self.source[0] == "items"

    def item_order(self, n: int) -> list[int] | None:
        """The order in which to evaluate n items: shuffled per trial (seeded by its number, so a resumed
        trial sees the same order), or None (the eval set's order) when items are not reported."""
        if not self.per_item:
            return None
        import random

        order = list(range(n))
        random.Random(self.number).shuffle(order)
        return order

    def observe_items(self, samples: list[dict[str, Any]], total: int) -> bool:
        """One evaluated batch (evaluate's samples); returns True when the evaluation should stop."""
        if not self.per_item or self.source is None:
            return False
        grader = self.source[1]
        with interrupts.deferred():
            for s in samples:
                if s[grader] is not None:  # items the grader cannot grade (no reference) have no outcome
                    self._items.append(float(s[grader]))
                    self.trial.report(self._items[-1], s["item"])
            if not self._items:
                return False
            self.last = (len(self._items), sum(self._items) / len(self._items))
            if not self.trial.should_prune():
                return False
            self.pruned = True
            self.best_number = self.trial.study.best_trial.number
            # Optuna's samplers rank pruned trials by their last step's value; a last value at a step past
            # every item id gives them the mean so far (the best trial, never pruned, lacks that step, so
            # the per-item pairing is unchanged).
            self.trial.report(self.last[1], total)
            log.info(
                "Trial %d pruned after %d of %d eval items (%s %.4g so far).",
                self.number,
                len(self._items),
                total,
                self.source[1],
                self.last[1],
            )
        return self.pruned

    def pruned_metrics(self) -> dict[str, float]:
        """The record of where the pruner stopped the trial (metrics.json, the W&B summary)."""
        step, value = self.last or (0, float("nan"))
        where = "pruned/eval_items" if self.per_item else "pruned/step"
        return {where: float(step), "pruned/intermediate_value": value}

    def close(self) -> None:
        """Let go of the study's database (a launcher's worker process runs many jobs)."""
        if hasattr(self._storage, "engine"):  # RDBStorage: its pooled connections
            self._storage.engine.dispose()
        elif hasattr(self._storage, "close"):  # the gRPC proxy's channel
            self._storage.close()

    def _report(self, step: int, value: float) -> bool:
        with interrupts.deferred():
            self.trial.report(value, step)
            self.last = (step, value)
            prune = self.trial.should_prune()
        if prune:
            self.pruned = True
            log.info("Trial %d pruned at step %d (intermediate value %.4g).", self.trial.number, step, value)
        return self.pruned


def pruned_error(reporter: TrialReporter) -> Exception:
    import optuna

    step, value = reporter.last or (0, float("nan"))
    if reporter.per_item:
        name = reporter.source[1] if reporter.source else "objective"
        return optuna.TrialPruned(
            f"pruned after {step} eval items ({name} {value:.4g} so far, significantly below "
            f"trial {reporter.best_number}'s on the same items: Wilcoxon signed-rank test)"
        )
    if reporter.reason is not None:  # it names the values it saw
        return optuna.TrialPruned(f"pruned at step {step}, {reporter.reason}")
    return optuna.TrialPruned(f"pruned at step {step} (intermediate value {value:.4g})")
