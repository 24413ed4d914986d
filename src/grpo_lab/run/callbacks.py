"""The run's TrainerCallbacks: one per concern, and the one shared :class:`Outcome` that says why training stopped.

- :class:`HistoryWriter` appends each log row to history.jsonl as it happens (it survives a crash);
- :class:`RewardWeights` sets the reward weights of each step from `reward.schedule`;
- :class:`PeriodicEval` evaluates the held-out set every `eval.every_n_steps` and offers it to the pruner;
- :class:`HealthWatch` runs the health rules (grpo_lab.run.health) over each log;
- :class:`SweepPruning` reports to the sweep's Optuna trial and asks its pruner;
- :class:`StopSync`, last of these, shares the main process's :class:`Outcome` with every process at each log
  and stops training there, so that all processes stop at the same step.

Only the main process evaluates, watches and talks to Optuna; the callbacks record *why* on the Outcome and
never raise: `train.run` closes the run from it. A new reason to stop (a reward schedule, a generation
engine's health) is one more callback that calls :meth:`Outcome.propose`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from grpo_lab.run import health
from grpo_lab.run.summary import HEADLINES

# Shown beside the progress bar: TRL's log key -> a short name.
BAR_KEYS = {h.key: h.short for h in HEADLINES}

# The order in which reasons to stop win over one another: a diverged run is never reported as pruned.
_RANK = {"pruned": 1, "stopped": 2, "diverged": 3}


@dataclass
class Outcome:
    """Why training stopped before max_steps: `status` is None (not stopped), "pruned", "stopped" (a health
    rule with action stop) or "diverged" (NaN/inf); `event` is the health event that stopped it, as a dict."""

    status: str | None = None
    event: dict[str, Any] | None = None
    pending: bool = False  # a decision of the main process that the next log has not shared yet

    def propose(self, status: str, event: dict[str, Any] | None = None, *, replaces_no_signal: bool = False) -> None:
        """Ask to stop; the stronger reason wins (`_RANK`). A trial with no learning signal since its first
        log is pruned rather than stopped (`replaces_no_signal`): for a sampler it is a bad config, not a
        failed run."""
        no_signal_stop = self.status == "stopped" and (self.event or {}).get("rule") == "no_signal"
        if replaces_no_signal and no_signal_stop:
            self.status, self.event = status, None
        elif self.status is None or _RANK[status] > _RANK[self.status]:
            self.status, self.event = status, event
        self.pending = True

    def as_shared(self) -> tuple[str | None, dict[str, Any] | None]:
        return self.status, self.event


class HistoryWriter(TrainerCallback):
    """Each trainer log with a reward, to the recorder as it happens."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero and "reward" in logs:
            self.recorder.log_step({"step": state.global_step, **logs})


class RewardWeights(TrainerCallback):
    """`reward.schedule` (grpo_lab.config.schedule), applied at the start of every step that generates, on every
    process:
    TRL's `reward_weights` tensor, which scores the step's completions, is set in place from the steps completed (a
    resumed run continues from its checkpoint's step). The weights join the step's metrics as `reward_weights/<name>`,
    so they reach history.jsonl and W&B in the same row as the rewards they weighed."""

    def __init__(self, schedule: Any, recorder: Any) -> None:
        self.schedule, self.recorder = schedule, recorder

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        trainer = self.recorder.trainer
        # TRL scores completions when it generates them, every steps_per_generation x num_iterations micro-steps; a
        # step that trains on buffered completions was scored with the weights of the step that generated them.
        every, micro = args.steps_per_generation * trainer.num_iterations, trainer._step
        generates = any((micro + i) % every == 0 for i in range(args.gradient_accumulation_steps))
        if not generates and trainer._buffered_inputs is not None:
            return
        weights = self.schedule.at_step(state.global_step, state.max_steps)
        trainer.reward_weights.copy_(torch.tensor(weights, dtype=trainer.reward_weights.dtype))
        metrics = trainer._metrics["train"]  # TRL averages these over the logging interval and logs them
        for name, weight in zip(self.schedule.names, weights, strict=True):
            metrics[f"reward_weights/{name}"].append(weight)


class MetricsProgressBar(ProgressCallback):
    """transformers' progress bar with the key metrics as its postfix instead of a printed 40-key dict per step
    (the full logs go to W&B and history.jsonl)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            # Only numbers: TRL logs None for a statistic it could not compute (e.g. reward_std of inf rewards).
            shown = {short: f"{logs[key]:.3g}" for key, short in BAR_KEYS.items() if _is_number(logs.get(key))}
            if shown:
                self.training_bar.set_postfix(shown, refresh=False)


class PeriodicEval(TrainerCallback):
    """The held-out evaluation every `every` steps (main process): recorded, and offered to the pruner."""

    def __init__(
        self,
        every: int | None,
        evaluate: Any,
        recorder: Any,
        reporter: Any,
        outcome: Outcome,
        monitor: Any,
        keeper: Any = None,
    ) -> None:
        self.every, self.evaluate, self.recorder = every, evaluate, recorder
        self.reporter, self.outcome, self.monitor = reporter, outcome, monitor
        self.keeper = keeper  # grpo_lab.run.keep.Keeper with output.keep=best|top_k: the last step is a candidate too

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        last = step >= state.max_steps
        if not self.every or not state.is_world_process_zero or (last and self.keeper is None):
            return
        if step % self.every and not last:
            return
        result = self.evaluate(model, processing_class, desc=f"eval at step {step}")
        metrics = result.scores()
        self.recorder.log_eval(step, metrics)
        # Item by item, for the divergence rule (grpo_lab.run.health), judged with the next log.
        self.monitor.observe_eval(step, result.every_outcome())
        if self.keeper is not None:
            self.keeper.observe(step, metrics)
        # The last step's evaluation is output.keep's candidate only: a trial is not pruned after all its training.
        if self.reporter is not None and not last and self.reporter.observe_eval(step, metrics):
            self.outcome.propose("pruned")


class HealthWatch(TrainerCallback):
    """The health rules over each log (main process): events to the recorder, a `stop` action to the Outcome."""

    def __init__(self, monitor: health.Monitor, recorder: Any, outcome: Outcome) -> None:
        self.monitor, self.recorder, self.outcome = monitor, recorder, outcome
        self.fired: list[health.Event] = []  # this log's events, for SweepPruning's dead-trial rule

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.fired = []
        if not logs or not ("reward" in logs or "loss" in logs):
            return
        self.fired = self.monitor.observe(state.global_step, logs)
        for event in self.fired:
            self.recorder.health_event(event)
            if event.action == "stop":
                self.outcome.propose("diverged" if event.rule == "nonfinite" else "stopped", event.as_dict())


class SweepPruning(TrainerCallback):
    """The sweep trial's intermediate values and pruner (main process). A trial that has had no learning signal
    since its first log is pruned when its pruner prunes dead trials (`prune_no_signal`)."""

    def __init__(self, reporter: Any, watch: HealthWatch | None, outcome: Outcome) -> None:
        self.reporter, self.watch, self.outcome = reporter, watch, outcome

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        dead = self._dead_trial()
        # A health stop ends the run unreported, except a dead trial's no_signal stop: that trial is pruned.
        halted = self.outcome.status == "diverged" or (self.outcome.status == "stopped" and dead is None)
        if "reward" in logs and not halted and self.reporter.observe_log(state.global_step, logs):
            self.outcome.propose("pruned")
        if dead is not None and (self.reporter.observe_no_signal(dead.step, dead.message) or self.reporter.pruned):
            self.outcome.propose("pruned", replaces_no_signal=True)

    def _dead_trial(self) -> health.Event | None:
        """This log's no_signal event, when the trial never had a signal and its pruner prunes dead trials."""
        if self.watch is None or not self.reporter.no_signal or self.watch.monitor.signal_seen:
            return None
        return next((e for e in self.watch.fired if e.rule == "no_signal"), None)


class StopSync(TrainerCallback):
    """Shares the main process's Outcome at every log (all processes log at the same steps) and stops there."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def on_log(self, args, state, control, logs=None, **kwargs):
        shared = self.outcome.as_shared() if self.outcome.pending else (None, None)
        if args.world_size > 1:
            from accelerate.utils import broadcast_object_list

            shared = tuple(broadcast_object_list(list(shared), from_process=0))
        status, event = shared
        if status is not None:
            self.outcome.status, self.outcome.event, self.outcome.pending = status, event, False
            control.should_training_stop = True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
