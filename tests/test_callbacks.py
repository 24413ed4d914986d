"""The training stops as data: the Outcome's precedence, and the callbacks that propose to it, driven by a real
health monitor and a real Optuna trial (the sweeper's storage) on hand-made trainer logs."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from grpo_lab.config import HealthConfig, TrialConfig
from grpo_lab.run.callbacks import HealthWatch, Outcome, SweepPruning
from grpo_lab.run.health import Monitor
from grpo_lab.run.trial import TrialReporter

DEAD = {"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0, "loss": 0.0}
NO_SIGNAL = {"rule": "no_signal", "step": 3}


def test_the_stronger_reason_to_stop_wins():
    outcome = Outcome()
    outcome.propose("pruned")
    outcome.propose("stopped", {"rule": "kl"})
    outcome.propose("pruned")
    assert (outcome.status, outcome.event, outcome.pending) == ("stopped", {"rule": "kl"}, True)
    outcome.propose("diverged", {"rule": "nonfinite"})
    assert outcome.status == "diverged"


@pytest.mark.parametrize(("stop", "expected"), [(NO_SIGNAL, "pruned"), ({"rule": "kl", "step": 3}, "stopped")])
def test_a_dead_trial_replaces_only_a_no_signal_stop(stop, expected):
    outcome = Outcome()
    outcome.propose("stopped", stop)
    outcome.propose("pruned", replaces_no_signal=True)
    assert outcome.status == expected


class _Recorder:
    """Keeps what the health watch hands the run's recorder."""

    def __init__(self) -> None:
        self.events: list = []

    def health_event(self, event) -> None:
        self.events.append(event)


def _reporter(tmp_path, pruner: dict) -> TrialReporter:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    trial = study.ask()
    cfg = TrialConfig(study="s", storage=storage, number=trial.number, id=trial._trial_id, pruner=pruner)
    return TrialReporter(cfg, ("eval", "accuracy"))


def _health(no_signal: str) -> HealthConfig:
    return HealthConfig(
        patience=3, nonfinite="stop", kl="warn", kl_max=0.1, no_signal=no_signal, reward_std_min=0.01,
        frac_zero_std_max=0.9, length="warn", length_ratio=3.0, clipped="warn", clipped_max=0.9,
        vllm_mismatch="warn", logp_diff_max=0.1, is_ratio_min=0.5, is_ratio_max=2.0, divergence="warn",
    )  # fmt: skip


@pytest.mark.parametrize("already_pruned", [False, True])
def test_a_dead_trial_stopped_by_health_is_pruned_even_when_its_pruner_decided_first(tmp_path, already_pruned):
    """health.no_signal=stop and a pruner that prunes dead trials: the trial ends pruned, also when a periodic
    evaluation had the pruner prune it at the same step (the stop must not turn it into a failed run)."""
    reporter = _reporter(tmp_path, {"_target_": "optuna.pruners.MedianPruner", "prune_no_signal": True})
    outcome = Outcome()
    if already_pruned:
        reporter.pruned = True
        outcome.propose("pruned")
    watch = HealthWatch(Monitor(_health("stop")), _Recorder(), outcome)
    callbacks = [watch, SweepPruning(reporter, watch, outcome)]
    for step in (1, 2, 3):
        state, control = SimpleNamespace(global_step=step), SimpleNamespace(should_training_stop=False)
        for callback in callbacks:
            callback.on_log(None, state, control, logs=DEAD)
    assert [e.rule for e in watch.recorder.events] == ["no_signal"]
    assert outcome.status == "pruned" and reporter.pruned


def test_a_trial_that_had_a_signal_is_stopped_not_pruned(tmp_path):
    reporter = _reporter(tmp_path, {"_target_": "optuna.pruners.MedianPruner", "prune_no_signal": True})
    outcome = Outcome()
    watch = HealthWatch(Monitor(_health("stop")), _Recorder(), outcome)
    callbacks = [watch, SweepPruning(reporter, watch, outcome)]
    logs = [{"reward": 0.5, "reward_std": 0.4, "frac_reward_zero_std": 0.0, "loss": 0.1}] + [DEAD] * 3
    for step, row in enumerate(logs, start=1):
        for callback in callbacks:
            callback.on_log(None, SimpleNamespace(global_step=step), SimpleNamespace(), logs=row)
    assert (outcome.status, outcome.event["rule"]) == ("stopped", "no_signal")
