"""output.keep: the run ends with the best step's model by the validation objective, and keeps only what it asks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from grpo_lab import config
from grpo_lab.config import rules
from grpo_lab.errors import ConfigError
from wandb_files import find_runs, read_run

from conftest import DIGITS_AGAINST_ITS_GRADER, REPO, compose, one_line_naming, run_cli

# The tiny model rewarded for digits while its validation grader wants few: the grader is at its best early
# (100% at step 2) and 0% from step 4 on (measured, seed 3), so the best step is not the last.
HACKED = [*DIGITS_AGAINST_ITS_GRADER, "max_steps=8", "eval.every_n_steps=2"]


def check(*overrides: str) -> None:
    run = config.parse(compose(["experiment=smoke", *overrides]))
    rules.check(rules.Checking(run, run.launcher.num_processes), rules.JOB)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["output.keep=best"], ["eval.every_n_steps"]),
        (["output.keep=top_k", "eval.every_n_steps=2", "objective.metric=train/reward_end"], ["eval_after/<grader>"]),
        (["output.keep=best", "eval.every_n_steps=2", "objective.metric=eval_after/mean_length"], ["eval_after/"]),
        (["output.keep=best", "eval.every_n_steps=2", "launcher=ddp", "launcher.num_processes=2"], ["processes"]),
        (["output.keep=best", "eval.every_n_steps=2", "launcher=deepspeed_zero3"], ["DeepSpeed"]),
        (["output.keep=top_k", "eval.every_n_steps=2", "+trainer.save_total_limit=2"], ["save_total_limit=2"]),
    ],
)
def test_keep_without_a_validation_objective_evaluated_during_training_is_one_line(overrides, needles):
    with pytest.raises(ConfigError) as info:
        check(*overrides)
    assert info.value.key == "output.keep"
    one_line_naming(info.value, "output.keep", *needles)


@pytest.mark.parametrize(
    ("sweep", "needle"),
    [
        (["sweep=pareto"], "one objective"),
        (["sweep=lr_beta", "hydra.sweeper.objectives=[{metric: train/reward_end, direction: maximize}]"], "reward_end"),
    ],
)
def test_keep_in_a_sweep_without_one_validation_objective_is_refused_before_any_trial(
    tmp_path, model_cache, sweep, needle
):
    """The sweep's objective replaces each trial's: it is what a trial's step would be chosen by."""
    args = ["-m", *sweep, "experiment=smoke", "output.keep=best", "eval.every_n_steps=2"]
    proc = run_cli(args, tmp_path, model_cache, timeout=120)
    assert proc.returncode != 0
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error")]
    one_line_naming(line, "output.keep", needle)
    assert not list((tmp_path / "outputs").rglob("metrics.json"))


def test_keep_best_ends_with_the_best_steps_model_graded_and_only_its_checkpoint(tmp_path, model_cache):
    proc = run_cli([*HACKED, "output.keep=best"], tmp_path, model_cache, PYTHONPATH=str(REPO / "tests"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    record = json.loads((run_dir / "metrics.json").read_text())
    periodic = {row["step"]: row["words"] for row in record["eval_periodic"]}
    assert sorted(periodic) == [2, 4, 6, 8]  # every N steps, and the last step: a candidate too
    best = max(periodic, key=lambda s: (periodic[s], -s))
    assert periodic[best] > periodic[8], periodic  # the scenario: the best step is not the last
    m = record["metrics"]
    assert m["keep/step"] == best and m["keep/candidates"] == 4 and record["keep"]["steps"] == [best]
    # The final validation grades the kept model: greedy, the same items, the same score as at its step.
    assert m["eval_after/words"] == periodic[best] and m["train/steps"] == 8
    # Only the kept checkpoint stays, and model/ holds its weights.
    assert sorted(p.name for p in (run_dir / "trainer").glob("checkpoint-*")) == [f"checkpoint-{best}"]
    kept = load_file(run_dir / "trainer" / f"checkpoint-{best}" / "model.safetensors")
    saved = load_file(run_dir / "model" / "model.safetensors")
    assert kept.keys() == saved.keys() and all(torch.equal(kept[k], saved[k]) for k in kept)
    assert f"kept         step {best}, the best of 4 evaluations" in proc.stdout and "biased upward" in proc.stdout
    (wandb_run,) = find_runs(run_dir)
    assert read_run(wandb_run).summary["keep/step"] == best
    # Its record ends at step 8 but its latest checkpoint is the kept one: continuing it is refused, in one line.
    again = run_cli([f"resume={run_dir}", "max_steps=12"], tmp_path, model_cache, PYTHONPATH=str(REPO / "tests"))
    assert again.returncode == 1
    lines = [x for x in again.stderr.splitlines() if x.startswith("Error") or "ERROR" in x]
    assert len(lines) == 1, again.stderr[-2000:]
    one_line_naming(lines[0], "output.keep=best", f"latest is step {best}", "larger max_steps")


def test_keep_top_k_keeps_k_checkpoints_best_first_and_leaves_the_users_own(tmp_path, model_cache):
    """top_k checkpoints stay, best first; a checkpoint the user asked for at a step no evaluation scored
    (trainer.save_steps=3: step 3) is not keep's to delete."""
    args = [*HACKED, "output.keep=top_k", "output.top_k=2", "trainer.save_strategy=steps", "trainer.save_steps=3"]
    proc = run_cli(args, tmp_path, model_cache, PYTHONPATH=str(REPO / "tests"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    record = json.loads((run_dir / "metrics.json").read_text())
    scores = {int(k): v for k, v in record["keep"]["scores"].items()}
    ranked = sorted(scores, key=lambda s: (-scores[s], s))[:2]
    assert record["keep"]["steps"] == ranked and record["metrics"]["keep/step"] == ranked[0]
    left = sorted(p.name for p in (run_dir / "trainer").glob("checkpoint-*"))
    assert left == sorted({"checkpoint-3", *(f"checkpoint-{s}" for s in ranked)}), left


def test_a_run_recorded_before_the_test_part_existed_is_refused_in_one_line_on_resume(tmp_path, model_cache):
    """A job.json written by an earlier release (no test part, no output.keep): resuming it is one line, not a
    validation traceback, and nothing is written into its folder."""
    args = ["experiment=smoke", "trainer.save_strategy=steps", "trainer.save_steps=2", "output.save_model=false"]
    assert run_cli(args, tmp_path, model_cache).returncode == 0
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    spec = json.loads((run_dir / "job.json").read_text())
    del spec["run"]["data"]["test_size"], spec["run"]["eval"]["test"], spec["run"]["output"]["keep"]
    (run_dir / "job.json").write_text(json.dumps(spec))
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    proc = run_cli([f"resume={run_dir}", "max_steps=6"], tmp_path, model_cache)
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("Error") or "ERROR" in x]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    one_line_naming(lines[0], "earlier grpo_lab", "`data.test_size`", "Run it again")
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before
