"""Optuna sweeps through grpo_lab's own Hydra sweeper: real SQLite/PostgreSQL storage, real GRPO trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from grpo_lab.config.samplers import build_pruner, build_sampler, options, prunes
from grpo_lab.errors import ConfigError
from grpo_lab.sweep.space import parse_space
from wandb_files import find_runs, read_run

from conftest import (
    FAST,
    REPO,
    cli_env,
    fresh_postgres_database,
    load_study,
    one_line_naming,
    postgres_url,
    run_cli,
    run_prune_sweep,
    sqlite_url,
    trials_if_ready,
    write_sweep,
)
from conftest import load_study as load_sqlite_study

GROUPS = {"model", "data", "experiment", "sweep"}


# ------------------------------------------------------------------------------------------- parsing
def test_search_space_from_override_grammar():
    space = parse_space(
        {
            "lr": "tag(log, interval(1e-6, 1e-4))",
            "beta": "interval(0.0, 0.1)",
            "num_generations": "choice(2, 4, 8)",
            "optimizer.gradient_accumulation_steps": "range(1, 4)",
        },
        ["experiment=smoke", "++seed=1,2", "model=tiny"],
        GROUPS,
    )
    dists = {p.name: p.distribution for p in space.params}
    assert dists["lr"] == optuna.distributions.FloatDistribution(1e-6, 1e-4, log=True)
    assert dists["beta"] == optuna.distributions.FloatDistribution(0.0, 0.1)
    assert dists["num_generations"] == optuna.distributions.CategoricalDistribution([2, 4, 8])
    assert dists["optimizer.gradient_accumulation_steps"] == optuna.distributions.IntDistribution(1, 3)
    assert dists["seed"] == optuna.distributions.CategoricalDistribution([1, 2])
    assert space.fixed == ("experiment=smoke", "model=tiny")
    overrides = space.overrides_for(
        {"lr": 2e-5, "beta": 0.05, "num_generations": 4, "optimizer.gradient_accumulation_steps": 2, "seed": 1}
    )
    assert "++lr=2e-05" in overrides and "++num_generations=4" in overrides and "++seed=1" in overrides


def test_search_space_errors():
    with pytest.raises(ConfigError) as error:
        parse_space({}, ["experiment=smoke"], GROUPS)
    one_line_naming(error.value, "hydra.sweeper.params")
    with pytest.raises(ConfigError) as error:
        parse_space({"beta": "tag(log, interval(0.0, 0.1))"}, [], GROUPS)
    one_line_naming(error.value, "beta", "0.0")


# ------------------------------------------------------------------------------ samplers and pruners
def sweeper_settings(*overrides: str, search_path: Path | None = None) -> dict:
    """`hydra.sweeper` as Hydra composes it for these overrides (the CLI's own rewriting included)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from grpo_lab.cli import prepare_overrides
    from grpo_lab.paths import CONF_DIR

    extra = [f"hydra.searchpath=[file://{search_path}]"] if search_path else []
    rewritten, _ = prepare_overrides(["sweep=lr_beta", *overrides, *extra])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=rewritten, return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.sweeper)


@pytest.mark.parametrize(
    ("kind", "shipped"),
    [
        ("sampler", {"tpe", "random", "nsgaii"}),
        ("pruner", {"median", "successive_halving", "hyperband", "wilcoxon", "none"}),
    ],
)
def test_every_shipped_sampler_and_pruner_is_the_optuna_class_its_file_names(kind, shipped):
    from hydra.utils import get_class

    assert set(options(kind)) == shipped
    for name in shipped:
        spec = sweeper_settings(f"hydra/sweeper/{kind}={name}")[kind]
        built = build_sampler(spec, seed=3) if kind == "sampler" else build_pruner(spec)
        assert type(built) is get_class(spec["_target_"]), name
        if kind == "pruner":
            assert prunes(spec) == (name != "none")


def test_sampler_seed_and_pruner_settings_come_from_the_config():
    spec = sweeper_settings("hydra.sweeper.sampler.seed=7", "hydra.sweeper.pruner.n_startup_trials=5")
    assert spec["sampler"] == {
        "_target_": "optuna.samplers.TPESampler",
        "seed": 7,
        "n_startup_trials": 4,
        "constant_liar": True,
    }
    assert build_pruner(spec["pruner"])._n_startup_trials == 5
    # The same seed gives the same first point, another seed (worker 1 of the study) another one.
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}

    def first_point(seed: int) -> float:
        study = optuna.create_study(sampler=build_sampler(spec["sampler"], seed))
        return study.ask(space).params["x"]

    assert first_point(7) == first_point(7) != first_point(8)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # PatientPruner
def test_a_pruner_of_ones_own_from_a_user_config_folder(tmp_path):
    (tmp_path / "hydra" / "sweeper" / "pruner").mkdir(parents=True)
    (tmp_path / "hydra" / "sweeper" / "pruner" / "patient.yaml").write_text(
        "_target_: optuna.pruners.PatientPruner\n"
        "wrapped_pruner: {_target_: optuna.pruners.MedianPruner, n_startup_trials: 1}\n"
        "patience: 2\n"
    )
    spec = sweeper_settings("hydra/sweeper/pruner=patient", search_path=tmp_path)["pruner"]
    pruner = build_pruner(spec)
    assert isinstance(pruner, optuna.pruners.PatientPruner)
    assert isinstance(pruner._wrapped_pruner, optuna.pruners.MedianPruner)


def test_bad_sampler_or_pruner_settings_say_how_to_fix_them():
    from grpo_lab.cli import prepare_overrides

    with pytest.raises(ConfigError, match=r"`hydra/sweeper/pruner=none` \(options: hyperband, median, none"):
        prepare_overrides(["-m", "sweep=lr_beta", "hydra.sweeper.pruner.name=none"])
    with pytest.raises(ConfigError) as error:  # a sweep file of an earlier release
        build_sampler({"_target_": "optuna.samplers.TPESampler", "name": "random"}, seed=0)
    one_line_naming(error.value, "hydra/sweeper/sampler=random")
    with pytest.raises(ConfigError) as error:
        build_pruner({"_target_": "optuna.pruners.MedianPruner", "n_startup_trial": 1})
    one_line_naming(error.value, "hydra.sweeper.pruner", "optuna.pruners.MedianPruner", "`n_startup_trials`")
    with pytest.raises(ConfigError) as error:
        build_pruner({"patience": 2})
    one_line_naming(error.value, "_target_")


def test_misspelt_sweep_lists_the_available_ones(tmp_path, model_cache):
    proc = run_cli(["-m", "sweep=lr_bta", *FAST], tmp_path, model_cache, timeout=60)
    assert proc.returncode != 0
    assert "lr_beta" in proc.stderr and "grpo" in proc.stderr and "pareto" in proc.stderr


def test_swept_reward_weights_need_a_weight_free_objective_and_pruning_signal(tmp_path, model_cache):
    """sweep=grpo varies every reward weight: a small weight lowers the weighted reward without the trial
    being any worse, so neither the objective nor the pruning signal may be that reward."""
    base = ["-m", "sweep=grpo", *FAST]
    proc = run_cli([*base, "eval.every_n_steps=null"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "eval.every_n_steps", "hydra/sweeper/pruner=none")  # the two ways out
    objective = "hydra.sweeper.objectives=[{metric:train/reward_end,direction:maximize}]"
    proc = run_cli([*base, objective], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "train/reward_end", "train/rewards/<name>/mean")  # the objective, and what to use
    # A scheduled reward's weight is its schedule's: sweeping the weight would change nothing.
    proc = run_cli([*base, "reward.schedule.xmlcount=[[0,0.1],[1,0.2]]"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "`reward.weights.xmlcount`", "reward.schedule.xmlcount")
    assert not (tmp_path / "outputs" / "sweeps" / "optuna.db").exists()  # refused before any study or trial


# --------------------------------------------------------------------------------------- full sweeps
def test_grpo_sweep_runs_trials_tracks_them_and_best_yaml_reruns(tmp_path, model_cache):
    confirming = ["hydra.sweeper.confirm.top_k=1", "hydra.sweeper.confirm.seeds=1"]
    args = ["-m", "sweep=grpo", *FAST, "output.save_model=true", "hydra.sweeper.n_trials=3", *confirming]
    proc = run_cli(args, tmp_path, model_cache, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = load_study(tmp_path, "grpo")
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == 4 == len(study.trials)
    # After the 3 search trials, the best config again with seed 42 + 1: never pruned, tagged `confirm`.
    (again,) = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert again.number == 3 and again.state == TrialState.COMPLETE
    assert (
        again.params == study.trials[again.user_attrs["confirm_of"]].params and again.user_attrs["confirm_seed"] == 43
    )
    assert "Confirmation runs (eval_after/accuracy, mean over seeds" in proc.stdout
    sampled = {"num_generations", "lr", "beta", "reward.weights.correctness", "reward.weights.xmlcount"}
    assert sampled <= set(finished[0].params)
    # Stable trial folders, one W&B run per trial, all in the study's group.
    sweep_dir = tmp_path / "outputs" / "sweeps" / "grpo"
    runs = {}
    for trial in study.trials:
        (path,) = find_runs(sweep_dir / f"trial_{trial.number}")
        runs[trial.number] = read_run(path)
    assert {r.group for r in runs.values()} == {"grpo"}
    assert all(r.config["trial"]["number"] == n for n, r in runs.items())
    assert runs[3].config["seed"] == 43 and runs[3].config["trial"]["pruner"] is None and "confirm" in runs[3].tags
    assert runs[0].config["lr"] == pytest.approx(study.trials[0].params["lr"])
    # One line per finished trial (its full summary in its folder), W&B's own blocks off; then the table.
    assert "== grpo_lab run" not in proc.stdout and "Run history" not in proc.stdout + proc.stderr
    for trial in study.get_trials(states=(TrialState.COMPLETE,)):
        summary_file = sweep_dir / f"trial_{trial.number}" / "summary.txt"
        assert f"Trial {trial.number} finished: eval_after/accuracy = " in proc.stdout
        assert f"({summary_file})" in proc.stdout
        assert f"== grpo_lab run `trial_{trial.number}`: finished ==" in summary_file.read_text()
    assert "== grpo_lab sweep `grpo`" in proc.stdout and "Best trial: #" in proc.stdout
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["trial"] == again.user_attrs["confirm_of"] == best["confirm"][0]["trial"]
    assert best["confirm"][0]["values"] == [study.trials[best["trial"]].value, again.value]
    assert best["command"].startswith("python -m grpo_lab ")
    # The test part: no trial graded it; once chosen, each seed's run of the best config is, with their mean.
    seeds = [sweep_dir / f"trial_{n}" for n in (best["trial"], again.number)]
    for trial in study.trials:
        metrics = json.loads((sweep_dir / f"trial_{trial.number}" / "metrics.json").read_text())["metrics"]
        assert not [k for k in metrics if k.startswith("test_")]
    report = json.loads((sweep_dir / "test.json").read_text())
    assert report["chosen_by"] == "eval_after/accuracy (mean over seeds)" and not report["missing"]
    assert sorted(report["graded"]) == sorted(map(str, seeds))
    assert all(m["test_after/num_samples"] == 20 for m in report["graded"].values())
    for run_dir in seeds:
        tested = {json.loads(line)["question"] for line in (run_dir / "test_after.jsonl").open()}
        validated = {json.loads(line)["question"] for line in (run_dir / "eval_after.jsonl").open()}
        assert len(tested) == 20 and not tested & validated
        assert (run_dir / "model" / "config.json").is_file()  # kept for it: every seed of the chosen config
    assert "Test part, graded after choosing (the choice read eval_after/accuracy (mean over seeds)" in proc.stdout
    assert "accuracy: mean over 2 seeds" in proc.stdout
    # Re-run the winner exactly as best.yaml says, and find its parameters in the new run's config.
    args = best["command"].split()[3:]
    (tmp_path / "rerun").mkdir()
    rerun = run_cli(args, tmp_path / "rerun", model_cache, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (metrics_file,) = (tmp_path / "rerun" / "outputs").rglob("metrics.json")
    config = yaml.safe_load((metrics_file.parent / "config.yaml").read_text())
    params = study.trials[best["trial"]].params
    assert config["lr"] == pytest.approx(params["lr"]) and config["num_generations"] == params["num_generations"]
    assert config["reward"]["weights"]["correctness"] == pytest.approx(params["reward.weights.correctness"])


def test_failures_are_recorded_and_the_sweep_goes_on(tmp_path, model_cache):
    extra = "reward.functions.extra._target_"
    args = write_sweep(
        tmp_path / "conf",
        "failures",
        f"""
hydra:
  sweeper:
    study_name: failures
    n_trials: 1
    max_failure_fraction: 1.0
    objectives: [{{metric: train/rewards/extra/mean, direction: maximize}}]
    params:
      +{extra}: choice(grpo_lab.rewards.math.int_answer, failing_rewards.explode, failing_rewards.nan_reward)
      num_generations: choice(4, 3)
    enqueue:
      - {{{extra}: failing_rewards.explode, num_generations: 4}}
      - {{{extra}: failing_rewards.nan_reward, num_generations: 4}}
      - {{{extra}: grpo_lab.rewards.math.int_answer, num_generations: 3}}
      - {{{extra}: grpo_lab.rewards.math.int_answer, num_generations: 4}}
""",
    )
    proc = run_cli(
        ["-m", *args, *FAST, "+reward.weights.extra=1.0", "hydra/sweeper/pruner=none"],
        tmp_path,
        model_cache,
        timeout=600,
        PYTHONPATH=str(REPO / "tests"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    trials = load_study(tmp_path, "failures").trials
    assert [t.state for t in trials] == [TrialState.FAIL] * 3 + [TrialState.COMPLETE]
    assert "this reward fails on purpose" in trials[0].user_attrs["error"]
    assert "is nan" in trials[1].user_attrs["error"]
    assert "not a multiple of num_generations=3" in trials[2].user_attrs["error"]


def test_pruning_stops_a_clearly_bad_trial_early(tmp_path, model_cache):
    trials = run_prune_sweep(tmp_path, model_cache)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    sweep_dir = tmp_path / "outputs" / "sweeps" / "prune"
    steps = [len((sweep_dir / f"trial_{n}" / "history.jsonl").read_text().splitlines()) for n in range(2)]
    assert steps[1] < steps[0] == 6
    (path,) = find_runs(sweep_dir / "trial_1")
    run = read_run(path)
    assert "pruned" in run.tags and run.state == "finished"


DEAD_SWEEP = """
hydra:
  sweeper:
    study_name: dead
    n_trials: 1
    objectives: [{metric: train/reward_end, direction: maximize}]
    # The first trial: the median pruner has no finished trial to compare it with.
    pruner: {n_startup_trials: 1, n_warmup_steps: 0}
    params:
      # An ideal length of 2 characters: every completion scores 0, so reward_std is 0 at every step.
      reward.functions.length.ideal_length: choice(2, 40)
    enqueue:
      - {reward.functions.length.ideal_length: 2}
"""


@pytest.mark.parametrize(("prune_no_signal", "action"), [(True, "warn"), (True, "stop"), (False, "warn")])
def test_a_trial_without_learning_signal_is_pruned_before_the_pruner_could_compare_it(
    tmp_path, model_cache, prune_no_signal, action
):
    args = write_sweep(tmp_path / "conf", "dead", DEAD_SWEEP)
    rule = ["health.patience=3", f"health.no_signal={action}"]
    switch = f"hydra.sweeper.pruner.prune_no_signal={str(prune_no_signal).lower()}"
    proc = run_cli(
        ["-m", *args, *FAST, "max_steps=6", "eval.after=false", *rule, switch],
        tmp_path,
        model_cache,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (trial,) = load_study(tmp_path, "dead").trials
    history = tmp_path / "outputs" / "sweeps" / "dead" / "trial_0" / "history.jsonl"
    steps = [json.loads(line)["step"] for line in history.read_text().splitlines()]
    metrics = json.loads((history.parent / "metrics.json").read_text())
    assert metrics["health"][0]["rule"] == "no_signal" and metrics["health"][0]["step"] == 3
    if prune_no_signal:  # the default of the median pruner's file; pruned, not failed, even where the action is stop
        assert trial.state == TrialState.PRUNED and steps == [1, 2, 3]
        why = trial.user_attrs["pruned"]
        one_line_naming(why, "step 3", "reward = 0", "reward_std = 0")  # where, and the values the rule saw
        assert metrics["status"] == "pruned" and metrics["metrics"]["pruned/step"] == 3
        assert metrics["pruned"] == trial.user_attrs["pruned"]
        (path,) = find_runs(history.parent)
        run = read_run(path)
        assert "pruned" in run.tags and run.summary["pruned/reason"] == why
    else:  # warned, and trained to the end: nothing to compare it with yet
        assert trial.state == TrialState.COMPLETE and steps == list(range(1, 7))


WILCOXON_SWEEP = """
hydra:
  sweeper:
    study_name: wilcoxon
    n_trials: 2
    objectives: [{metric: eval_after/format, direction: maximize}]
    params:
      lr: choice(1e-4)
"""


def test_wilcoxon_pruner_stops_the_evaluation_of_a_trial_worse_than_the_best_item_by_item(tmp_path, model_cache):
    # The best trial so far formatted every one of the 32 eval items (as a trained model would; the tiny random
    # model formats none): the new trial loses on each item it is scored on, and the one-sided Wilcoxon test
    # gets below p=0.1 as soon as n_startup_steps=8 items are paired (p = 2^-8), i.e. after 2 batches of 4.
    n_items = 32
    (tmp_path / "outputs" / "sweeps").mkdir(parents=True)
    study = optuna.create_study(study_name="wilcoxon", storage=sqlite_url(tmp_path), direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(
            value=1.0,
            params={"lr": 1e-4},
            distributions={"lr": optuna.distributions.CategoricalDistribution([1e-4])},
            intermediate_values={i: 1.0 for i in range(n_items)},
        )
    )
    args = write_sweep(tmp_path / "conf", "wilcoxon", WILCOXON_SWEEP)
    extra = [f"data.eval_size={n_items}", "eval.batch_size=4", "hydra/sweeper/pruner=wilcoxon"]
    proc = run_cli(["-m", *args, *FAST, *extra], tmp_path, model_cache, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    best, trial = load_study(tmp_path, "wilcoxon").trials
    assert best.state == TrialState.COMPLETE and trial.state == TrialState.PRUNED
    assert "pruned after 8 eval items (format 0 so far, significantly below trial 0's" in trial.user_attrs["pruned"]
    items = sorted(set(trial.intermediate_values) - {n_items})
    assert len(items) == 8 and set(items) < set(range(n_items)) and items != list(range(8))  # shuffled
    assert {trial.intermediate_values[i] for i in items} == {0.0}
    assert trial.intermediate_values[n_items] == 0.0  # the mean so far, for the sampler's ranking of pruned trials
    record = json.loads((tmp_path / "outputs" / "sweeps" / "wilcoxon" / "trial_1" / "metrics.json").read_text())
    assert record["status"] == "pruned" and record["metrics"]["pruned/eval_items"] == 8.0
    assert "eval_after/format" not in record["metrics"]  # a partial evaluation is not the objective


def test_wilcoxon_pruner_needs_an_objective_of_the_evaluation_after_training(tmp_path, model_cache):
    args = ["-m", "sweep=lr_beta", *FAST, "hydra/sweeper/pruner=wilcoxon", "eval.after=false"]
    proc = run_cli(args, tmp_path, model_cache, timeout=120)
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "eval_after/accuracy", "eval_after/format", "eval.after=False")
    assert not list((tmp_path / "outputs").rglob("metrics.json"))  # refused before any trial ran


def test_a_sweep_may_not_choose_on_the_test_part(tmp_path, model_cache):
    """A sweep whose objective reads the test part is refused in one line before any trial: the test part only
    reports, after choosing."""
    args = [
        "-m",
        "sweep=lr_beta",
        *FAST,
        "hydra.sweeper.objectives=[{metric: test_after/accuracy, direction: maximize}]",
    ]
    proc = run_cli(args, tmp_path, model_cache, timeout=120)
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "hydra.sweeper.objectives.0.metric", "test_after/accuracy", "eval_after/accuracy")
    assert not list((tmp_path / "outputs").rglob("metrics.json"))


def test_pareto_sweep_records_both_objectives(tmp_path, model_cache):
    proc = run_cli(["-m", "sweep=pareto", *FAST, "hydra.sweeper.n_trials=3"], tmp_path, model_cache, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = load_study(tmp_path, "pareto")
    assert len(study.directions) == 2
    assert all(t.state == TrialState.COMPLETE and len(t.values) == 2 for t in study.trials)
    assert "Pareto-optimal trials: #" in proc.stdout
    best = yaml.safe_load((tmp_path / "outputs" / "sweeps" / "pareto" / "best.yaml").read_text())
    assert {e["trial"] for e in best["pareto_front"]} == {t.number for t in study.best_trials}


# ------------------------------------------------------------------------------------- resuming, workers
def _popen(args: list[str], cwd: Path, cache: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_lab", *args],
        cwd=cwd,
        env=cli_env(cache),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _journal_study(path: Path, name: str) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(path))))


# `make test-all`: in CI, tests/test_stress.py kills a worker mid-sweep and resumes on PostgreSQL (at a random
# moment, with a CPU hog); the RDB heartbeat path is Optuna's on both SQLite and PostgreSQL. CI keeps to 20 min.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_resume_after_a_killed_worker(tmp_path, model_cache, kind):
    """A killed worker's RUNNING trial goes stale (Optuna's heartbeats on SQLite, grpo_lab's on journal
    files, which Optuna gives none) and the same command finishes the study with exactly n_trials."""
    journal = tmp_path / "shared" / "optuna.log"
    storage = [f"hydra.sweeper.storage='journal:{journal}'"] if kind == "journal" else []
    args = [
        "-m",
        "sweep=lr_beta",
        *FAST,
        "hydra.sweeper.n_trials=3",
        "hydra/sweeper/pruner=none",
        "hydra.sweeper.heartbeat_interval=1",
        "hydra.sweeper.grace_period=3",
        *storage,
    ]

    def load_study(cwd: Path, name: str) -> optuna.Study:
        return _journal_study(journal, name) if kind == "journal" else load_sqlite_study(cwd, name)

    worker = _popen(args, tmp_path, model_cache, tmp_path / "first.log")
    # Sync on the study itself: trial 1 is RUNNING in the storage and its job is training.
    history = tmp_path / "outputs" / "sweeps" / "lr_beta" / "trial_1" / "history.jsonl"
    db = journal if kind == "journal" else tmp_path / "outputs" / "sweeps" / "optuna.db"

    def trial_1_running() -> bool:
        if not db.exists() or not history.exists():
            return False
        trials = trials_if_ready(lambda: load_study(tmp_path, "lr_beta"))
        if trials is None:  # the study is not created yet
            return False
        return len(trials) == 2 and trials[1].state == TrialState.RUNNING

    deadline = time.monotonic() + 300
    while not trial_1_running() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(worker.pid, signal.SIGKILL)  # mid-training of trial 1
    worker.wait()
    before = load_study(tmp_path, "lr_beta").trials
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.RUNNING]
    time.sleep(3.5)  # past the grace period: trial 1's worker is surely gone
    proc = run_cli(args, tmp_path, model_cache, timeout=600)  # the same command again
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = load_study(tmp_path, "lr_beta").trials
    assert [t.number for t in after] == list(range(len(after)))
    assert after[1].state == TrialState.FAIL
    assert len([t for t in after if t.state == TrialState.COMPLETE]) == 3
    assert after[0].values == before[0].values and after[0].params == before[0].params


def _two_workers(tmp_path: Path, model_cache: Path, storage: str) -> optuna.Study:
    args = [
        "-m",
        "sweep=lr_beta",
        *FAST,
        "hydra.sweeper.n_trials=4",
        f"hydra.sweeper.storage='{storage}'",
        "hydra/sweeper/pruner=none",
    ]
    workers = [_popen(args, tmp_path, model_cache, tmp_path / f"worker{i}.log") for i in range(2)]
    for i, w in enumerate(workers):
        assert w.wait(timeout=600) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    study = load_study(tmp_path, "lr_beta", storage)
    numbers = [t.number for t in study.trials]
    described = [(t.number, t.state.name, t.user_attrs.get("worker"), t.user_attrs.get("error")) for t in study.trials]
    assert len(numbers) == 4 == len(set(numbers)), described
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert {t.user_attrs["worker"] for t in study.trials} == {0, 1}  # both really worked
    return study


# `make test-all`: in CI, tests/test_stress.py runs two workers on one SQLite and one PostgreSQL study.
@pytest.mark.slow
def test_two_workers_share_a_sqlite_study(tmp_path, model_cache):
    _two_workers(tmp_path, model_cache, sqlite_url(tmp_path))


@pytest.mark.slow
def test_two_workers_share_a_postgresql_study(tmp_path, model_cache):
    # A fresh, empty database: the two workers race to create the schema and the study.
    _two_workers(tmp_path, model_cache, fresh_postgres_database(postgres_url(), "test"))


def _two_trials_side_by_side(tmp_path: Path, model_cache: Path, launcher: list[str], timeout: int) -> optuna.Study:
    """A sweep of two trials, both in one batch through `launcher`: exactly those two finish, side by side
    (the second started before the first ended)."""
    args = ["-m", "sweep=lr_beta", *FAST, *launcher, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=2"]
    proc = run_cli(args, tmp_path, model_cache, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = load_study(tmp_path, "lr_beta")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2  # exactly n_trials, none extra
    first, second = study.trials
    assert second.datetime_start < first.datetime_complete
    return study


@pytest.mark.slow  # side-by-side trials stay covered in CI by the submitit_local test
def test_parallel_trials_through_the_joblib_launcher(tmp_path, model_cache):
    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    first, second = _two_trials_side_by_side(tmp_path, model_cache, launcher, timeout=600).trials
    assert first.params != second.params


@pytest.mark.heavy
def test_parallel_trials_through_the_submitit_local_launcher(tmp_path, model_cache):
    """hydra-submitit-launcher's `submitit_local` runs the code path of its Slurm launcher (pickled jobs,
    submitit's own job folders, results read back from files) as local processes."""
    launcher = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=15", "hydra.launcher.cpus_per_task=1"]
    study = _two_trials_side_by_side(tmp_path, model_cache, launcher, timeout=900)
    sweep_dir = tmp_path / "outputs" / "sweeps" / "lr_beta"
    for trial in study.trials:
        run_dir = sweep_dir / f"trial_{trial.number}"
        assert json.loads((run_dir / "metrics.json").read_text())["status"] == "finished"
        (path,) = find_runs(run_dir)  # one W&B run per trial, in its own folder
        run = read_run(path)
        assert run.group == "lr_beta" and run.config["trial"]["number"] == trial.number
        assert run.config["lr"] == pytest.approx(trial.params["lr"])
    # Each job went through submitit: its pickled result and logs are in submitit's folder.
    assert len(list((sweep_dir / ".submitit").rglob("*_result.pkl"))) == 2


def test_wildcard_expands_over_the_selected_reward_set():
    from grpo_lab.sweep.space import expand_wildcards

    from conftest import compose

    params = expand_wildcards(
        {"reward.weights.*": "interval(0.0, 2.0)", "lr": "interval(1e-6, 1e-5)"}, compose(["reward=format_length"])
    )
    assert params == {
        "reward.weights.format": "interval(0.0, 2.0)",
        "reward.weights.length": "interval(0.0, 2.0)",
        "lr": "interval(1e-6, 1e-5)",
    }
    with pytest.raises(ConfigError) as error:
        expand_wildcards({"nope.*": "interval(0, 1)"}, compose([]))
    one_line_naming(error.value, "nope.*")


def test_a_sweep_that_fails_everywhere_stops_and_names_the_error(tmp_path, model_cache):
    proc = run_cli(
        ["-m", "sweep=lr_beta", *FAST, "num_generations=3", "hydra.sweeper.n_trials=10"],
        tmp_path,
        model_cache,
        timeout=300,
    )
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "3 of 3", "num_generations=3")
    assert [t.state for t in load_study(tmp_path, "lr_beta").trials] == [TrialState.FAIL] * 3


def test_journal_storage_and_keep_models_none(tmp_path, model_cache):
    """A journal-file study; and keep_models=none: the sweeper tells each trial not to save its model (which
    runs do by default), so nothing is left."""
    journal = tmp_path / "shared" / "optuna.log"
    fast = [a for a in FAST if not a.startswith("output.save_model=")]
    args = ["-m", "sweep=lr_beta", *fast, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage='journal:{journal}'"]
    proc = run_cli([*args, "hydra.sweeper.keep_models=none"], tmp_path, model_cache, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    study = _journal_study(journal, "lr_beta")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    sweep_dir = tmp_path / "outputs" / "sweeps" / "lr_beta"
    assert yaml.safe_load((sweep_dir / "trial_1" / "config.yaml").read_text())["output"]["save_model"] is False
    assert (sweep_dir / "trial_1" / "metrics.json").exists() and not list(sweep_dir.glob("trial_*/model"))


def test_a_sweep_keeps_only_the_best_model(tmp_path, model_cache):
    """keep_models=best (the default): every trial saves its model, and only the best one's stays on disk."""
    args = ["-m", "sweep=lr_beta", *FAST, "output.save_model=true", "hydra.sweeper.n_trials=3"]
    args += ["hydra/sweeper/pruner=none", "objective.metric=train/reward_end"]
    proc = run_cli(args, tmp_path, model_cache, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweep_dir = tmp_path / "outputs" / "sweeps" / "lr_beta"
    kept = sorted(p.parent.name for p in sweep_dir.glob("trial_*/model"))
    study = load_study(tmp_path, "lr_beta")
    assert kept == [f"trial_{study.best_trial.number}"]
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["model"] == str(Path(study.best_trial.user_attrs["run_dir"]) / "model")
    assert f"Kept models (keep_models=best): {best['model']}" in proc.stdout


_WRITE_BEST_LOOP = """
import sys
from pathlib import Path

import optuna

from grpo_lab.sweep.report import write_best

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(direction="maximize")
study.optimize(lambda t: t.suggest_float("lr", 1e-6, 1e-4, log=True), n_trials=1)
for _ in range(300):
    write_best(study, Path(sys.argv[1]), metrics=["objective"], storage="memory")
"""


def test_workers_rewriting_best_yaml_at_once_never_break_each_other(tmp_path):
    """Every worker of a shared study rewrites best.yaml after each batch; with short trials they do so at the
    same moment (the sweeper_scaling benchmark's 4 workers did: a shared temporary name killed one sweep)."""
    path = tmp_path / "best.yaml"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITE_BEST_LOOP, str(path)], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in errors), [err[-2000:] for _, err in errors]
    assert yaml.safe_load(path.read_text())["study"] and not [p for p in tmp_path.iterdir() if p != path]


def test_models_a_confirmation_may_still_choose_stay_until_it_has_chosen():
    """keep_models=best, keep_top_k=1, confirming the best 2 configs: while the seeds run, both configs' search
    trials and every confirmation run keep their models (whichever config the seeds' mean chooses, each of its
    seeds is graded on the test part); once chosen, the best trial and every seed of the chosen config stay."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from grpo_lab.evaluation.ranking import from_trials
    from grpo_lab.sweep.retention import kept_trials

    study = optuna.create_study(direction="maximize")
    space = {"lr": FloatDistribution(1e-6, 1e-3, log=True)}

    def trial(lr: float, value: float, **attrs) -> None:
        study.add_trial(create_trial(params={"lr": lr}, distributions=space, value=value, user_attrs=attrs))

    for i, value in enumerate([0.5, 0.4, 0.3]):  # the search: #0 leads, #1 second
        trial(1e-4 * (i + 1), value)
    trial(1e-4, 0.2, confirm_of=0, confirm_seed=43)  # #0's second seed: mean 0.35
    trial(2e-4, 0.45, confirm_of=1, confirm_seed=43)  # #1's: mean 0.425, the chosen config
    ranking = from_trials(study)
    assert [c.trial for c in ranking.configs] == [1, 0]
    assert sorted(t.number for t in kept_trials(ranking, "best", 1, candidates=2)) == [0, 1, 3, 4]
    assert sorted(t.number for t in kept_trials(ranking, "best", 1)) == [1, 4]
