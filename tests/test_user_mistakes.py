"""The mistakes a user makes, made as a user would: the CLI in a subprocess, on the tiny presets.

Each gets one line, before a model loads or a W&B run starts, and nothing made earlier is overwritten, mixed or
detached: the folders it could touch are hashed before and after (docs/reliability.md says what grpo_lab
promises; these tests hold it). One finished run with checkpoints and one small sweep are made once for the module
and copied where a test writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from wandb_files import find_runs, read_run

from conftest import FAST, REPO, error_line, load_study, run_cli

# One worker runs this module: its module-scoped run is made once, not once per pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("user_mistakes")

TESTS = str(REPO / "tests")
CHECKPOINTED = [*FAST, "eval.before=true", "trainer.save_strategy=steps", "trainer.save_steps=1"]
WORDS = ["+reward.functions.words._target_=failing_rewards.words", "+reward.weights.words=1.0"]
SWEEP = [
    "-m",
    "sweep=lr_beta",
    "experiment=smoke",
    "max_steps=2",
    "hydra.sweeper.n_trials=1",
    "hydra.sweeper.study_name=mine",
    "trainer.save_strategy=steps",
    "trainer.save_steps=1",
]


def digest(folder: Path, *, logs: bool = True) -> dict[str, str]:
    """Every file under `folder` (a link by its target) -> its sha256; without `logs`, the job logs left out."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = "-> " + str(path.readlink())
        elif path.is_file() and (logs or path.suffix != ".log"):
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_cache) -> Path:
    """A finished smoke run (2 steps) with a checkpoint per step and its evaluation before and after training."""
    cwd = tmp_path_factory.mktemp("finished")
    proc = run_cli(CHECKPOINTED, cwd, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (metrics,) = cwd.glob("outputs/runs/*/*/metrics.json")
    assert "eval_change/accuracy" in json.loads(metrics.read_text())["metrics"]
    return metrics.parent


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    copy = tmp_path / "outputs" / "runs" / "mine"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, model_cache) -> Path:
    """A finished one-trial sweep (study `mine`, SQLite in outputs/sweeps/optuna.db); its working folder."""
    cwd = tmp_path_factory.mktemp("sweep")
    proc = run_cli(SWEEP, cwd, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Optuna's warnings about grpo_lab's deliberate calls are not repeated to the user after each trial.
    for said in ("ExperimentalWarning", "Heartbeat of storage is supposed to be used"):
        assert said not in proc.stderr, proc.stderr[-3000:]
    return cwd


# --------------------------------------------------------------------------------------------- resume
def test_resume_with_only_the_folder_continues_the_same_run(run_copy, tmp_path, model_cache):
    before = json.loads((run_copy / "metrics.json").read_text())
    proc = run_cli([f"resume={run_copy}", "max_steps=4"], tmp_path, model_cache)  # none of its overrides typed
    assert proc.returncode == 0, proc.stderr[-4000:]
    after = json.loads((run_copy / "metrics.json").read_text())
    assert after["status"] == "finished" and after["metrics"]["train/steps"] == 4
    assert after["run_name"] == before["run_name"] and after["resumed_from"]["step"] == 2
    assert "eval_change/accuracy" in after["metrics"]  # the paired change: the items before training, restored
    assert after["metrics"]["eval_before/accuracy"] == before["metrics"]["eval_before/accuracy"]
    job = json.loads((run_copy / "job.json").read_text())
    assert job["run"]["name"] == "smoke" and job["run"]["max_steps"] == 4  # its own settings, the new length
    assert "max_steps=4" in (run_copy / "overrides.yaml").read_text()  # the command that re-runs it says so
    runs = [read_run(p) for p in find_runs(run_copy)]
    assert len({r.run_id for r in runs}) == 1 and len(runs) == 2  # one W&B run, continued
    assert [p.name for p in (tmp_path / "outputs" / "runs").iterdir()] == ["mine"]  # no second folder


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "finished its max_steps=2 steps; to train on, resume with a larger max_steps (e.g. max_steps=4)"),
        (["max_steps=2"], "finished its max_steps=2 steps"),
        (["lr=3e-5", "max_steps=4"], "`lr=3e-5`: resume="),
        (["model=tiny_vllm", "max_steps=4"], "`model=tiny_vllm`"),
        (["hydra.run.dir=elsewhere", "max_steps=4"], "a resumed run stays in its own folder"),
        (["-m", "max_steps=4"], "takes no -m"),
    ],
)
def test_a_refused_resume_changes_nothing(run_copy, tmp_path, model_cache, args, says):
    before = digest(run_copy)
    proc = run_cli([f"resume={run_copy}", *args], tmp_path, model_cache, timeout=120)
    error_line(proc, says)
    assert digest(run_copy) == before  # not even the log: refused before Hydra wrote anything
    assert [p.name for p in (tmp_path / "outputs" / "runs").iterdir()] == ["mine"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_resume_that_fails_before_a_step_changes_nothing_in_the_record(run_copy, tmp_path, model_cache):
    (run_copy / "trainer" / "checkpoint-2" / "model.safetensors").write_bytes(b"")  # damaged on disk
    before = digest(run_copy, logs=False)
    proc = run_cli([f"resume={run_copy}", "max_steps=4"], tmp_path, model_cache)
    error_line(proc, "Resuming from", "checkpoint-2", "failed before training a step", "remove it")
    assert digest(run_copy, logs=False) == before  # metrics.json, history, config, job.json, W&B files
    assert "ended before training a step: the run's record is as it was" in proc.stderr


def test_a_folder_of_an_earlier_release_resumes_from_its_config(run_copy, tmp_path, model_cache):
    from grpo_lab.run.resume import resumed_spec

    own, _ = resumed_spec(run_copy, ["max_steps=3"], model_cache)
    (run_copy / "job.json").unlink()  # before job.json: config.yaml, overrides.yaml and metrics.json
    old, _ = resumed_spec(run_copy, ["max_steps=3"], model_cache)
    assert old.run == own.run and old.run_name == own.run_name and old.run.max_steps == 3


def test_a_sweeps_trial_and_folder_resume_only_through_the_sweep(sweep, model_cache):
    folder = sweep / "outputs" / "sweeps" / "mine"
    before = digest(sweep / "outputs")
    proc = run_cli([f"resume={folder / 'trial_0'}", "max_steps=4"], sweep, model_cache, timeout=120)
    line = error_line(proc, "trial 0 of the sweep study 'mine'", "python -m grpo_lab -m")
    assert "sweep=lr_beta" in line and "hydra.sweeper.study_name=mine" in line  # the sweep's own command
    proc = run_cli([f"resume={folder}"], sweep, model_cache, timeout=120)
    error_line(proc, "is the folder of a grid or a sweep, not of one run")
    assert digest(sweep / "outputs") == before


# ----------------------------------------------------------------------------------- folders and studies
def test_a_new_run_never_writes_into_a_run_or_grid_folder(run_copy, sweep, tmp_path, model_cache):
    before = digest(run_copy)
    proc = run_cli([*FAST, f"hydra.run.dir={run_copy}"], tmp_path, model_cache, timeout=120)
    error_line(proc, f"hydra.run.dir={run_copy}", "holds a run already", "resume=")
    assert digest(run_copy) == before
    multirun = sweep / "outputs" / "sweeps" / "mine"
    before = digest(multirun)
    proc = run_cli(["-m", *FAST, "lr=1e-5,2e-5", f"hydra.sweep.dir={multirun}"], tmp_path, model_cache, timeout=120)
    error_line(proc, "holds a multirun already")
    assert digest(multirun) == before


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("max_steps=3", "max_steps: 2 in the study, 3 now"),
        ("seed=7", "seed: 42 in the study, 7 now"),
        ("+hydra.sweeper.objectives=[{metric:eval_after/format,direction:maximize}]", "objectives"),
        ("hydra.sweeper.storage=journal:./other.log", "holds the trials of another study named 'mine'"),
    ],
)
def test_a_sweep_that_would_mix_or_overwrite_its_study_is_refused(sweep, model_cache, change, says):
    before = digest(sweep / "outputs", logs=False)
    args = [a for a in SWEEP if not a.startswith(change.split("=")[0].lstrip("+"))]
    proc = run_cli([*args, change], sweep, model_cache, timeout=180)
    line = error_line(proc, says)
    assert "hydra.sweeper.study_name=" in line  # how to start a new study
    assert "Leaderboard" not in proc.stdout  # no stale leaderboard of the study it refused to join
    assert digest(sweep / "outputs", logs=False) == before
    assert len(load_study(sweep, "mine").trials) == 1


@pytest.mark.parametrize("damage", ['{"study": "mine", "uid"', '["mine"]'], ids=["truncated", "not-an-object"])
def test_a_damaged_study_record_is_refused_in_one_line(sweep, tmp_path, model_cache, damage):
    """study.json says which study owns a sweep's folder: damaged, the owner is unknown, so nothing is written."""
    shutil.copytree(sweep, tmp_path / "copy", symlinks=True)
    marker = tmp_path / "copy" / "outputs" / "sweeps" / "mine" / "study.json"
    marker.write_text(damage)
    before = digest(tmp_path / "copy" / "outputs", logs=False)
    proc = run_cli(SWEEP, tmp_path / "copy", model_cache, timeout=180)
    error_line(proc, "outputs/sweeps/mine/study.json cannot be read", "restore the file")
    assert digest(tmp_path / "copy" / "outputs", logs=False) == before


# ------------------------------------------------------------------------------ silently something else
def test_a_sweep_without_multirun_is_refused(tmp_path, model_cache):
    proc = run_cli(["sweep=lr_beta", "experiment=smoke"], tmp_path, model_cache, timeout=120)
    error_line(proc, "`sweep=lr_beta` is an Optuna sweep, which runs with -m", "python -m grpo_lab -m sweep=lr_beta")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["data.train_size=1"], "The training set has 1 prompt(s), but each generation batch takes"),
        (["data=jsonl"], "`data.path`: needs a value"),
        (["eval.samples=2", "eval.pass_k=[1,4]"], "every k of `eval.pass_k` (1, 4) must be at most `eval.samples` (2)"),
        (["model=tinyy"], "`model=tinyy`: no such option. Did you mean `model=tiny`?"),
        ([*WORDS], "must return numbers"),
    ],
)
def test_a_bad_run_is_one_line_and_leaves_no_run_folder(tmp_path, model_cache, args, says):
    proc = run_cli([*FAST, *args], tmp_path, model_cache, PYTHONPATH=TESTS)
    line = error_line(proc, says)
    assert "{" not in line or "pass_k" not in line  # no config section dumped into the message
    runs = [p for p in tmp_path.glob("outputs/runs/*/*") if p.is_dir()]
    if "words" not in " ".join(args):  # refused before training: no folder of a run that never started
        assert runs == [], runs
    else:  # a reward's wrong return fails the run at its first step, recorded
        (run,) = runs
        assert json.loads((run / "metrics.json").read_text())["status"] == "failed"


def test_check_rewards_and_doctor_check_one_config(tmp_path, model_cache):
    for module in ("grpo_lab.check_rewards", "grpo_lab.doctor"):
        proc = run_cli(["-m", "experiment=smoke"], tmp_path, model_cache, module=module, timeout=120)
        error_line(proc, f"{module} checks one run's config, not a grid or a sweep")
    proc = run_cli(
        ["experiment=smoke", *WORDS],
        tmp_path,
        model_cache,
        module="grpo_lab.check_rewards",
        PYTHONPATH=TESTS,
    )
    error_line(proc, "Reward `words`", "must return numbers", "'yes' (str)")


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("hydra.sweeper.storage=optuna.db", "not a storage URL. A SQLite file is `sqlite:///optuna.db`"),
        ("hydra.sweeper.storage=sqlite://", "an in-memory SQLite database lives in one process"),
        ("hydra.sweeper.study_name=a/b", "must be a folder name"),
        ("hydra.sweeper.sampler.seed=abc", "`hydra.sweeper.sampler.seed` must be an integer"),
        ("num_generations=choice(2,abc)", "a trial would get num_generations=abc"),
        ("lr=interval(0,1e-3)", "a trial would get lr=0.0: `lr` must be > 0"),
        ("num_generations=range(4,2)", "range(4, 2) needs start < stop"),
        ("lr=tag(lg,interval(1e-6,1e-4))", "unknown tag lg"),
    ],
)
def test_a_bad_sweep_setting_is_one_line_and_shows_no_other_studys_leaderboard(sweep, model_cache, setting, says):
    before = digest(sweep / "outputs", logs=False)
    args = [a for a in SWEEP if a != "hydra.sweeper.study_name=mine"]
    proc = run_cli([*args, "hydra.sweeper.study_name=other", setting], sweep, model_cache, timeout=120)
    error_line(proc, says)
    assert "Leaderboard" not in proc.stdout and "trial_" not in proc.stdout
    assert digest(sweep / "outputs", logs=False) == before


def test_a_grid_job_refused_by_a_check_says_why_in_the_leaderboard(tmp_path, model_cache):
    proc = run_cli(["-m", *FAST, "eval.before=false", "lr=1e-4,-1"], tmp_path, model_cache)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Job lr=-1 failed: `lr` must be > 0, got -1" in proc.stdout, proc.stdout[-3000:]
    (refused,) = [m for m in tmp_path.glob("outputs/multirun/*/*/1/metrics.json")]
    record = json.loads(refused.read_text())
    assert record["status"] == "failed" and record["refused"] is True


def test_compare_refuses_flags_that_would_not_change_a_folders_ranking(finished, tmp_path, model_cache):
    runs = finished.parent
    before = digest(runs)
    for flags, says in (
        (["--metric", "eval_after/format"], "--metric: for an Optuna storage (--study) or a W&B group"),
        (["--study", "x"], "--study"),
        (["--trial", "0"], "--trial chooses the trial that --export NAME writes"),
    ):
        proc = run_cli([str(runs), *flags, "--no-plots"], tmp_path, model_cache, module="grpo_lab.compare")
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr[-2000:]
    assert digest(runs) == before


def test_a_secret_masked_in_the_record_is_asked_for_again_on_resume(run_copy, model_cache):
    from grpo_lab.errors import ConfigError
    from grpo_lab.run.resume import resumed_spec

    job = json.loads((run_copy / "job.json").read_text())
    for section in (
        job["run"]["reward"]["functions"]["length"]["kwargs"],
        job["resolved_config"]["reward"]["functions"]["length"],
    ):
        section["api_key"] = "***"  # what the record keeps of a secret
    (run_copy / "job.json").write_text(json.dumps(job))
    with pytest.raises(ConfigError) as refused:
        resumed_spec(run_copy, ["max_steps=3"], model_cache)
    assert "masks its secret `reward.functions.length.api_key`" in str(refused.value)
    spec, _ = resumed_spec(run_copy, ["max_steps=3", "reward.functions.length.api_key=${oc.env:HOME}"], model_cache)
    assert spec.run.reward.functions["length"].kwargs["api_key"] == os.environ["HOME"]
