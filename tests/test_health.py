"""Training health: each rule on log rows as TRL writes them, then a diverging run and sweep trial through the CLI."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from optuna.trial import TrialState

from grpo_lab import config as run_config
from grpo_lab.compare.leaderboard import health
from grpo_lab.compare.sources import RunRecord
from grpo_lab.config import HealthConfig
from grpo_lab.errors import ConfigError
from grpo_lab.run import reward_check
from grpo_lab.run.health import Monitor, default_config, replay
from wandb_files import find_runs, read_run

from conftest import DIGITS_AGAINST_ITS_GRADER, FAST, REPO, compose, load_study, one_line_naming, run_cli, write_sweep

INF_REWARD = ["+reward.functions.inf._target_=failing_rewards.inf_reward", "+reward.weights.inf=1.0"]


def rows(**series: list) -> list[dict]:
    steps = max(len(v) for v in series.values())
    return [{"step": i + 1, **{k: v[i] for k, v in series.items() if i < len(v)}} for i in range(steps)]


def config(**changes) -> HealthConfig:
    return default_config().model_copy(update=changes)


def test_the_shipped_defaults():
    cfg = default_config()
    assert (cfg.nonfinite, cfg.kl, cfg.kl_max, cfg.patience) == ("stop", "warn", 0.1, 3)


def test_nan_or_inf_acts_at_once_and_a_nan_of_one_reward_function_does_not():
    (event,) = replay(rows(loss=[0.1, math.nan, math.nan]))
    assert (event.rule, event.step, event.action, event.flag) == ("nonfinite", 2, "stop", "nan")
    assert "loss = nan: the run has diverged" in event.message
    (event,) = replay(rows(reward=[0.5, "inf"]))  # how history.jsonl stores an inf
    assert event.values == {"reward": math.inf}
    # TRL's "not applicable" NaN of one function: its own mean is NaN, the weighted reward stays finite.
    assert replay(rows(reward=[0.5, 0.5], **{"rewards/extra/mean": [math.nan, math.nan]})) == []


def test_kl_needs_patience_and_fires_once():
    assert replay(rows(kl=[0.2, 0.2, 0.05, 0.2, 0.2])) == []  # never 3 logs in a row
    events = replay(rows(kl=[0.05, 0.15, 0.2, 0.3, 0.4, 0.5]))
    assert [(e.rule, e.step) for e in events] == [("kl", 4)]
    assert "kl = 0.3 above health.kl_max = 0.1" in events[0].message and "raise `beta`" in events[0].message
    assert replay(rows(kl=[0.2] * 6), config(kl="ignore")) == []


def test_no_signal_names_the_likely_cause():
    (zero,) = replay(rows(reward=[0.0] * 3, reward_std=[0.0] * 3, frac_reward_zero_std=[1.0] * 3))
    assert zero.flag == "no-signal" and "every reward is 0" in zero.message and "data.num_shots" in zero.message
    (same,) = replay(rows(reward=[0.7] * 3, reward_std=[0.2] * 3, frac_reward_zero_std=[0.95] * 3))
    assert "every completion of a prompt scores the same" in same.message and "trainer.temperature" in same.message
    assert replay(rows(reward=[0.7] * 3, reward_std=[0.2] * 3, frac_reward_zero_std=[0.5] * 3)) == []


def _trl_logs(groups: list[list[float]]) -> dict[str, float]:
    """What TRL logs for one step whose prompts' completions scored `groups` (one reward, weight 1)."""
    stds = [statistics.stdev(g) for g in groups]
    return {
        "reward": statistics.fmean(v for g in groups for v in g),
        "reward_std": statistics.fmean(stds),
        "frac_reward_zero_std": sum(s == 0 for s in stds) / len(stds),
    }


def test_check_rewards_and_the_live_rule_give_one_no_signal_diagnosis():
    """The same flat rewards before training (check_rewards) and in training's logs (the live rule): the same
    diagnosis, and a different one for each cause (never rewarded, always rewarded alike)."""
    diagnoses = []
    for groups in ([[0.0] * 4] * 4, [[1.0] * 4] * 3 + [[0.0] * 4]):
        check = reward_check.assess({"correctness": groups}, {"correctness": 1.0})
        (event,) = replay(rows(**{k: [v] * 3 for k, v in _trl_logs(groups).items()}))
        assert not check.healthy and event.rule == "no_signal"
        assert check.diagnosis and check.diagnosis in check.verdict and check.diagnosis in event.message
        diagnoses.append(check.diagnosis)
    assert diagnoses[0] != diagnoses[1]
    assert reward_check.assess({"length": [[0.0, 1.0]] * 4}, {"length": 1.0}).diagnosis is None  # a signal


def test_a_run_that_never_had_a_learning_signal_is_told_from_one_whose_signal_faded():
    # What a sweep's dead-trial pruning reads (grpo_lab.run.train): only the first kind is pruned.
    never, faded = Monitor(config()), Monitor(config())
    for step, log in enumerate(rows(reward=[0.0] * 3, reward_std=[0.0] * 3), 1):
        never.observe(step, log)
    for step, log in enumerate(rows(reward=[0.4, 1.0, 1.0, 1.0], reward_std=[0.3, 0.0, 0.0, 0.0]), 1):
        faded.observe(step, log)
    assert [e.rule for e in never.events] == [e.rule for e in faded.events] == ["no_signal"]
    assert not never.signal_seen and faded.signal_seen
    assert not Monitor(config()).signal_seen  # nothing seen yet: no signal either


def test_length_jumps_and_collapses_against_the_rolling_median_and_clipping():
    key = "completions/mean_length"
    assert replay(rows(**{key: [40, 44, 60, 80, 100, 120, 150]})) == []  # gradual growth follows the median
    (jump,) = replay(rows(**{key: [40, 41, 40, 150]}))
    assert jump.step == 4 and "jumped to 150 tokens from a median of 40" in jump.message
    (collapse,) = replay(rows(**{key: [40, 41, 40, 9]}))
    assert "collapsed to 9 tokens" in collapse.message
    (clipped,) = replay(rows(**{"completions/clipped_ratio": [0.95, 1.0, 1.0]}))
    assert clipped.flag == "clipped" and "raise `trainer.max_completion_length`" in clipped.message.lower()


def test_a_stop_rule_is_the_monitors_stop():
    monitor = Monitor(config(kl="stop", patience=1))
    assert monitor.observe(1, {"kl": 0.01}) == [] and monitor.stop is None
    (event,) = monitor.observe(2, {"kl": 0.5})
    assert monitor.stop is event and event.action == "stop"


# TRL's keys when vLLM generates; HF generate runs log neither.
LOGP_DIFF, IS_RATIO = "sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean"


def test_vllm_mismatch_needs_patience_resets_on_a_healthy_log_and_says_what_to_check():
    cfg = default_config()
    assert (cfg.vllm_mismatch, cfg.logp_diff_max, cfg.is_ratio_min, cfg.is_ratio_max) == ("warn", 0.1, 0.5, 2.0)
    # Stale vLLM weights (measured: 0.30); 2 logs over the threshold are not yet a trend.
    assert replay(rows(**{LOGP_DIFF: [0.005, 0.3, 0.3], IS_RATIO: [1.0, 1.0, 1.0]})) == []
    # A healthy log in between starts the count again: fires at step 6, the 3rd bad log in a row.
    (event,) = replay(rows(**{LOGP_DIFF: [0.3, 0.3, 0.01, 0.3, 0.3, 0.3, 0.3], IS_RATIO: [1.0] * 7}))
    assert (event.rule, event.step, event.action, event.flag) == ("vllm_mismatch", 6, "warn", "vllm-mismatch")
    assert event.values == {LOGP_DIFF: 0.3, IS_RATIO: 1.0}
    assert f"{LOGP_DIFF} = 0.3" in event.message and "health.logp_diff_max = 0.1" in event.message
    assert "synced" in event.message and "dtype" in event.message
    assert "vllm_importance_sampling_correction" in event.message
    # The importance-sampling ratio leaving its band fires on its own, either way (masked ratios: 0; stale: >2).
    (low,) = replay(rows(**{LOGP_DIFF: [0.05] * 3, IS_RATIO: [0.2] * 3}))
    assert (low.rule, low.step) == ("vllm_mismatch", 3) and f"{IS_RATIO} = 0.2" in low.message
    assert [e.rule for e in replay(rows(**{IS_RATIO: [2.5] * 3}))] == ["vllm_mismatch"]
    # A synced run: gaps of 0.001-0.02, ratios about 1.
    assert replay(rows(**{LOGP_DIFF: [0.001, 0.02, 0.015, 0.09], IS_RATIO: [0.99, 1.01, 0.6, 1.9]})) == []
    # Thresholds and action are the user's; ignore never fires.
    (strict,) = replay(rows(**{LOGP_DIFF: [0.05] * 3}), config(logp_diff_max=0.04))
    assert "health.logp_diff_max = 0.04" in strict.message
    assert replay(rows(**{LOGP_DIFF: [0.05] * 3}), config(logp_diff_max=0.04, vllm_mismatch="ignore")) == []
    assert replay(rows(**{IS_RATIO: [1.5] * 3}), config(is_ratio_max=1.2))[0].rule == "vllm_mismatch"


def test_vllm_mismatch_never_fires_without_its_keys_or_on_nothing_measured():
    hf_generate = rows(
        loss=[0.1] * 6, kl=[0.01] * 6, reward=[0.5] * 6, reward_std=[0.3] * 6, frac_reward_zero_std=[0.1] * 6
    )
    assert replay(hf_generate) == []
    assert replay(hf_generate, config(patience=1, logp_diff_max=1e-9, is_ratio_min=0.999, is_ratio_max=1.001)) == []
    # NaN (vLLM scored no token) and TRL's 0/0 for a step with no completion token: not a mismatch.
    assert replay(rows(**{LOGP_DIFF: [math.nan] * 3, IS_RATIO: [math.nan] * 3})) == []
    assert replay(rows(**{LOGP_DIFF: ["nan"] * 3, IS_RATIO: ["nan"] * 3})) == []
    assert replay(rows(**{LOGP_DIFF: [0.0] * 3, IS_RATIO: [0.0] * 3})) == []


def test_vllm_mismatch_stop_ends_training():
    monitor = Monitor(config(vllm_mismatch="stop", patience=2))
    assert monitor.observe(1, {LOGP_DIFF: 0.3, IS_RATIO: 1.0}) == [] and monitor.stop is None
    (event,) = monitor.observe(2, {LOGP_DIFF: 0.31, IS_RATIO: 1.0})
    assert monitor.stop is event and (event.rule, event.step, event.action) == ("vllm_mismatch", 2, "stop")
    assert "for 2 logs" in event.message
    assert monitor.observe(3, {LOGP_DIFF: 0.3, IS_RATIO: 1.0}) == []  # once per run


def test_compare_replays_vllm_mismatch_for_a_run_recorded_before_events():
    history = rows(loss=[0.1] * 4, **{LOGP_DIFF: [0.3] * 4, IS_RATIO: [1.0] * 4})
    assert health(RunRecord(name="r", state="finished", objective=None, history=history)) == ["vllm-mismatch"]
    (event,) = replay(history)  # what compare replays, the same event as live
    assert (event.rule, event.step) == ("vllm_mismatch", 3)


@pytest.mark.parametrize(
    "override",
    [
        "health.vllm_mismatch=off",
        "health.logp_diff_max=0",
        "health.logp_diff_max=abc",
        "health.is_ratio_min=1.5",
        "health.is_ratio_max=0.9",
    ],
)
def test_bad_vllm_mismatch_settings_name_their_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as info:
        run_config.load(compose(["experiment=smoke", override]))
    assert info.value.key == key
    one_line_naming(info.value, f"`{key}", "must be")


# ------------------------------------------------------------------------------------- through the CLI
def test_a_run_whose_reward_turns_inf_stops_at_once_as_diverged(tmp_path, model_cache):
    proc = run_cli(
        [*FAST, "max_steps=6", *INF_REWARD], tmp_path, model_cache, timeout=300, PYTHONPATH=str(REPO / "tests")
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ERROR grpo_lab: Training diverged at step 1 (health.nonfinite=stop): reward = inf")
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    run_dir = metrics_file.parent
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "diverged" and metrics["metrics"]["health/nonfinite"] == 1.0
    assert [(e["rule"], e["step"], e["action"]) for e in metrics["health"]] == [("nonfinite", 1, "stop")]
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 1  # stopped within one log step
    (path,) = find_runs(run_dir)
    run = read_run(path)
    assert run.summary["status"] == "diverged" and "diverged" in run.tags
    assert run.summary["health/nonfinite"] == 1.0


def test_a_diverging_sweep_trial_fails_with_the_reason(tmp_path, model_cache):
    args = write_sweep(
        tmp_path / "conf",
        "diverge",
        """
hydra:
  sweeper:
    study_name: diverge
    n_trials: 1
    max_failure_fraction: 1.0
    objectives: [{metric: train/rewards/length/mean, direction: maximize}]
    params:
      +reward.weights.inf: choice(1.0, 0.0)
    enqueue: [{reward.weights.inf: 1.0}, {reward.weights.inf: 0.0}]
""",
    )
    proc = run_cli(
        ["-m", *args, *FAST, INF_REWARD[0], "hydra/sweeper/pruner=none"],
        tmp_path,
        model_cache,
        timeout=300,
        PYTHONPATH=str(REPO / "tests"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    diverged, healthy = load_study(tmp_path, "diverge").trials  # the sweep goes on after the failure
    assert (diverged.state, healthy.state) == (TrialState.FAIL, TrialState.COMPLETE)
    assert diverged.user_attrs["error"].startswith("TrainingHalted: Training diverged at step 1")


@pytest.mark.parametrize("bad", ["health.kl=off", "health.kl_max=0", "health.patience=0"])
def test_bad_health_settings_fail_before_training(bad, tmp_path, model_cache):
    proc = run_cli([*FAST, bad], tmp_path, model_cache, timeout=60)
    (line,) = proc.stderr.strip().splitlines()  # one line that names the key
    assert proc.returncode == 1 and f"`{bad.split('=')[0]}" in line and "must be" in line


# ------------------------------------------------------------------------------ rewards before training
def check_rewards(args: list[str], cwd, cache):
    return run_cli(args, cwd, cache, module="grpo_lab.check_rewards")


def test_check_rewards_sees_a_signal_and_its_absence(tmp_path, model_cache):
    """The tiny model's length reward varies within every group; without it only the GSM8K rewards are left,
    which a random model never earns: every reward 0, no signal, exit status 2."""
    proc = check_rewards(["--prompts", "4", "experiment=smoke"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 prompts x 4 completions of the untrained model" in proc.stdout
    (report,) = (tmp_path / "outputs" / "reward_checks").rglob("reward_check.json")
    data = json.loads(report.read_text())
    length = next(r for r in data["rewards"] if r["name"] == "length")
    assert data["healthy"] and length["flat_groups"] == 0.0 and len(length["values"]) == 16
    assert data["total"]["mean"] == pytest.approx(sum(length["values"]) / 16)  # weight 1, the others all 0
    assert (report.parent / "reward_check.png").stat().st_size > 5000
    flat = check_rewards(
        ["--prompts", "4", "experiment=smoke", "~reward.functions.length", "~reward.weights.length"],
        tmp_path,
        model_cache,
    )
    assert flat.returncode == 2, flat.stderr[-3000:]
    assert "no signal: every reward is 0" in flat.stdout and "data.num_shots=1" in flat.stdout
    bad = check_rewards(["experiment=smoke", "lr=abc"], tmp_path, model_cache)
    (line,) = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and "`lr" in line and "must be a number" in line


# ------------------------------------------------------------------------------ divergence: reward up, grader down
def _feed(monitor: Monitor, rewards: list[float], evals: dict[int, list[bool]], every: int) -> list:
    """Logs of `rewards` (step 1 on) with evaluations during training at `evals`' steps (step 0: before training),
    in the trainer's order: the evaluation at a step's end, then that step's log."""
    if 0 in evals:
        monitor.observe_eval(0, {"accuracy": evals[0]})
    fired = []
    for step, reward in enumerate(rewards, start=1):
        if step in evals:
            monitor.observe_eval(step, {"accuracy": evals[step]})
        fired += monitor.observe(step, {"reward": reward, "reward_std": 0.3})
    return fired


RISING = [0.1, 0.12, 0.11, 0.13, 0.3, 0.32, 0.31, 0.33, 0.6, 0.62, 0.61, 0.63]
FLAT = [0.3, 0.32, 0.31, 0.33] * 3
GOOD, BAD = [True] * 15 + [False] * 5, [True] * 3 + [False] * 17  # 75% -> 15% of the same 20 items


def test_divergence_fires_when_the_reward_rises_and_a_grader_falls_each_beyond_its_noise():
    monitor = Monitor(config())
    fired = _feed(monitor, RISING, {0: GOOD, 4: GOOD, 8: GOOD, 12: BAD}, every=4)
    (event,) = fired
    assert (event.rule, event.step, event.action, event.flag) == ("divergence", 12, "warn", "reward-vs-validation")
    assert event.values["eval/accuracy_best"] == 0.75 and event.values["eval/accuracy"] == 0.15
    assert event.values["reward_now"] > event.values["reward_then"]
    assert "12 lost" in event.message and "McNemar p" in event.message and "Welch p" in event.message


@pytest.mark.parametrize(
    ("rewards", "evals", "why"),
    [
        (FLAT, {0: GOOD, 4: GOOD, 8: GOOD, 12: BAD}, "the reward did not rise: a grader falling alone is not it"),
        (RISING, {0: GOOD, 4: GOOD, 8: GOOD, 12: [*GOOD[1:], False]}, "a drop of one item is noise, not a fall"),
        (RISING, {0: GOOD, 12: BAD}, "two evaluations: too few to judge"),
        (RISING, {0: BAD, 4: BAD, 8: GOOD, 12: GOOD}, "the grader rose with the reward: healthy learning"),
        (list(reversed(RISING)), {0: GOOD, 4: GOOD, 8: GOOD, 12: BAD}, "both fell: not this rule's pattern"),
    ],
)
def test_divergence_stays_silent_without_two_real_changes_in_opposite_directions(rewards, evals, why):
    assert not _feed(Monitor(config()), rewards, evals, every=4), why


def test_divergence_judges_against_the_best_evaluation_so_far_not_the_last():
    """A slow slide, each step within the noise of the one before, still fires against the best evaluation."""
    slide = {0: GOOD, 4: GOOD[:13] + [False] * 7, 8: GOOD[:9] + [False] * 11, 12: BAD}
    (event,) = _feed(Monitor(config()), RISING, slide, every=4)
    assert event.values["eval/accuracy_best"] == 0.75 and "at step 0" in event.message


def test_divergence_stop_ends_training_and_ignore_silences_it():
    stop = Monitor(config(divergence="stop"))
    _feed(stop, RISING, {0: GOOD, 4: GOOD, 8: GOOD, 12: BAD}, every=4)
    assert stop.stop is not None and stop.stop.rule == "divergence"
    assert not _feed(Monitor(config(divergence="ignore")), RISING, {0: GOOD, 4: GOOD, 8: GOOD, 12: BAD}, every=4)


HACKED = [*DIGITS_AGAINST_ITS_GRADER, "max_steps=30", "output.save_model=false", "eval.every_n_steps=5"]


def test_a_run_whose_reward_pays_for_what_the_grader_does_not_raises_the_divergence_alarm(tmp_path, model_cache):
    """A real run: the reward pays for digits, the validation grader wants few. The alarm is recorded as an
    event (metrics.json, the W&B summary), named in compare's health column, and `stop` ends training there."""
    proc = run_cli(HACKED, tmp_path, model_cache, PYTHONPATH=str(REPO / "tests"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    record = json.loads((run_dir / "metrics.json").read_text())
    (event,) = [e for e in record["health"] if e["rule"] == "divergence"]
    assert event["action"] == "warn" and event["step"] % 5 == 0 and event["step"] >= 10
    assert event["values"]["reward_now"] > event["values"]["reward_then"]
    assert event["values"]["eval/words"] < event["values"]["eval/words_best"]
    assert record["status"] == "finished" and record["metrics"]["train/steps"] == 30
    assert "Health (reward-vs-validation)" in proc.stderr
    (wandb_run,) = find_runs(run_dir)
    assert read_run(wandb_run).summary["health/divergence"] == event["step"]
    assert health(RunRecord("r", "finished", 0.0, health=record["health"], run_dir=run_dir)) == ["reward-vs-validation"]
    # As `stop`: training ends at the step the alarm fired; with output.keep=best the run still ends with the best
    # step's model before it, saved and graded (validation and test), and is recorded as stopped.
    stopped = tmp_path / "stop"
    stopped.mkdir()
    args = [*HACKED, "health.divergence=stop", "output.keep=best", "output.save_model=true"]
    proc = run_cli(args, stopped, model_cache, PYTHONPATH=str(REPO / "tests"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    (metrics_file,) = stopped.glob("outputs/runs/*/*/metrics.json")
    record = json.loads(metrics_file.read_text())
    metrics = record["metrics"]
    assert record["status"] == "stopped" and metrics["train/steps"] == event["step"], record["status"]
    kept, scores = int(metrics["keep/step"]), {int(k): v for k, v in record["keep"]["scores"].items()}
    assert kept == max(scores, key=lambda s: (scores[s], -s)) < event["step"]  # the best evaluation, before the alarm
    assert metrics["eval_after/words"] == scores[kept]  # graded again: the kept model
    assert metrics["test_after/num_samples"] == 20 and (metrics_file.parent / "model" / "config.json").is_file()
    assert (
        f"The run ends with step {kept}'s model (output.keep=best), graded on the validation and test parts"
        in (record["error"])
    )
