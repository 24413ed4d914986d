"""`python -m grpo_lab.compare`: leaderboards from real run folders and studies, plots, health flags, export."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from PIL import Image

from grpo_lab.compare.leaderboard import health
from grpo_lab.compare.sources import RunRecord

from conftest import FAST, REPO, run_cli

# One worker runs this module: its module-scoped run is made once, not once per pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("compare")


def compare(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    return run_cli(args, cwd, cache, module="grpo_lab.compare")


@pytest.fixture(scope="module")
def grid(tmp_path_factory, model_cache):
    """A two-job grid whose objective differs between the jobs."""
    cwd = tmp_path_factory.mktemp("grid")
    args = ["-m", *FAST, "output.save_model=true", "lr=1e-5,5e-3", "objective.metric=train/reward_end"]
    proc = run_cli(args, cwd, model_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = {p.parent.parent for p in (cwd / "outputs" / "multirun").rglob("metrics.json")}
    (folder / "answer.txt").write_text(proc.stdout)  # for the tests of the answer itself
    return cwd, folder


def test_leaderboard_of_a_grid_matches_the_runs_files(grid, model_cache):
    cwd, folder = grid
    proc = compare([str(folder)], cwd, model_cache)
    assert proc.returncode == 0, proc.stderr
    with (folder / "leaderboard.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    truth = {}
    for metrics_file in folder.rglob("metrics.json"):
        data = json.loads(metrics_file.read_text())
        truth[data["run_name"]] = data
    assert {r["run"] for r in rows} == set(truth) == {"lr=1e-05", "lr=0.005"}
    values = [float(r["train/reward_end"]) for r in rows]
    assert values == sorted(values, reverse=True)  # maximize: best first
    for row in rows:
        data = truth[row["run"]]
        assert float(row["train/reward_end"]) == pytest.approx(data["objective"]["value"])
        assert float(row["kl"]) == pytest.approx(data["metrics"]["train/kl"])
        assert float(row["reward"]) == pytest.approx(data["metrics"]["train/reward"])
        assert row["state"] == "finished" and row["lr"] in ("1e-05", "0.005")
    assert "| rank | run | state |" in (folder / "leaderboard.md").read_text()
    with Image.open(folder / "curves.png") as image:
        assert image.size == (1200, 800)
        assert len(image.convert("L").getcolors(256)) > 20  # drawn, not blank
    assert (folder / "curves.html").stat().st_size > 1000
    assert "wandb sync " in proc.stdout


def test_a_grid_on_one_seed_names_no_winner_and_leaves_the_test_part_ungraded(grid):
    """No job of a grid grades the test part: the choice among them cannot lean on it, while each job's validation is
    graded as in a single run. With one seed per config nothing is chosen (a seed moves a score as much as a config
    does), so no test part is graded at all, and the answer gives the grid again with seeds."""
    _, folder = grid
    for metrics_file in folder.rglob("metrics.json"):
        metrics = json.loads(metrics_file.read_text())["metrics"]
        assert "eval_after/accuracy" in metrics
        assert not [k for k in metrics if k.startswith("test_")], metrics_file
        assert not (metrics_file.parent / "test_before.jsonl").exists()
        assert json.loads((metrics_file.parent / "job.json").read_text())["in_multirun"] is True
    answer = (folder / "answer.txt").read_text()
    assert "No winner: one seed per config cannot tell configs apart" in answer
    assert "Test part not graded: nothing was chosen (one seed per config)." in answer
    assert not (folder / "test.json").exists() and not list(folder.rglob("test_after.jsonl"))
    again = next(line.strip() for line in answer.splitlines() if line.strip().startswith("python -m grpo_lab -m "))
    assert "lr=1e-5,5e-3" in again and again.endswith(" seed=1,2,3") and "experiment=smoke" in again


def test_a_grid_with_seeds_chooses_a_config_and_grades_each_of_its_seeds_on_the_test_part(tmp_path, model_cache):
    """Jobs that differ only in `seed` are one config's seeds: Welch's test across them tells the configs apart, and
    the chosen config's every seed is graded on the test part after choosing (mean and interval over seeds)."""
    args = ["-m", *FAST, "output.save_model=true", "eval.max_new_tokens=4,16", "seed=1,2"]
    args += ["objective.metric=eval_after/mean_length", "objective.direction=minimize"]  # what the config sets
    proc = run_cli(args, tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = {p.parent.parent for p in (tmp_path / "outputs" / "multirun").rglob("metrics.json")}
    assert "Winner: eval.max_new_tokens=4 (eval_after/mean_length mean " in proc.stdout, proc.stdout
    assert "over 2 seeds" in proc.stdout
    chosen = sorted(
        p.parent for p in folder.glob("*/config.yaml") if yaml.safe_load(p.read_text())["eval"]["max_new_tokens"] == 4
    )
    report = json.loads((folder / "test.json").read_text())
    assert report["chosen_by"] == "eval_after/mean_length" and sorted(report["graded"]) == [str(p) for p in chosen]
    for run in chosen:
        graded = report["graded"][str(run)]
        assert graded["test_after/num_samples"] == 20
        tested = [json.loads(line)["question"] for line in (run / "test_after.jsonl").open()]
        validated = {json.loads(line)["question"] for line in (run / "eval_after.jsonl").open()}
        assert len(tested) == 20 and not set(tested) & validated
    assert sorted(p.parent for p in folder.rglob("test_after.jsonl")) == chosen
    assert "Test part, graded after choosing (the choice read eval_after/mean_length" in proc.stdout


def test_export_the_best_and_run_it_again(grid, model_cache):
    cwd, folder = grid
    name = f"best_{uuid.uuid4().hex[:8]}"
    # Into the user's config folder ($GRPO_LAB_CONFIG, else ./conf), never into grpo_lab's own conf/.
    preset = cwd / "conf" / "experiment" / f"{name}.yaml"
    proc = compare([str(folder), "--export", name, "--no-plots"], cwd, model_cache)
    assert proc.returncode == 0, proc.stderr
    assert f"python -m grpo_lab --config-dir conf experiment={name}" in proc.stdout
    assert not (REPO / "conf" / "experiment" / f"{name}.yaml").exists()
    text = preset.read_text()
    assert text.startswith("# @package _global_") and "Exported by" in text and "  - smoke" in text
    best = next(csv.DictReader((folder / "leaderboard.csv").open()))
    rerun_dir = cwd / "rerun"
    rerun_dir.mkdir()
    rerun = run_cli(["--config-dir", str(cwd / "conf"), f"experiment={name}"], rerun_dir, model_cache)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (metrics_file,) = (rerun_dir / "outputs").rglob("metrics.json")
    config = yaml.safe_load((metrics_file.parent / "config.yaml").read_text())
    assert config["lr"] == pytest.approx(float(best["lr"]))
    assert config["name"] == name and config["max_steps"] == 2 and config["objective"]["metric"] == "train/reward_end"
    # A second export under the same name does not overwrite silently.
    again = compare([str(folder), "--export", name, "--no-plots"], cwd, model_cache)
    assert again.returncode == 2 and "exists already" in again.stderr


def test_a_sweep_folder_compares_its_study(tmp_path, model_cache):
    proc = run_cli(["-m", "sweep=lr_beta", *FAST, "hydra.sweeper.n_trials=2"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "outputs" / "sweeps" / "lr_beta"
    out = compare([str(folder)], tmp_path, model_cache)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader((folder / "leaderboard.csv").open()))
    assert sorted(r["run"] for r in rows) == ["trial_0", "trial_1"]
    assert {"lr", "beta", "eval_after/accuracy"} <= set(rows[0])
    for stem in ("optimization_history", "parallel_coordinates"):
        with Image.open(folder / f"{stem}.png") as image:
            assert image.size == (1000, 600)
    assert "Dashboard: optuna-dashboard sqlite:///" in out.stdout
    # The same study straight from its storage.
    direct = compare(
        [f"sqlite:///{tmp_path / 'outputs' / 'sweeps' / 'optuna.db'}", "--study", "lr_beta", "--no-plots"],
        tmp_path,
        model_cache,
    )
    assert direct.returncode == 0 and "trial_1" in direct.stdout
    missing = compare(
        [f"sqlite:///{tmp_path / 'outputs' / 'sweeps' / 'optuna.db'}", "--study", "nope"], tmp_path, model_cache
    )
    assert missing.returncode == 2 and "No study 'nope'" in missing.stderr and "lr_beta" in missing.stderr


def test_clear_errors_for_bad_sources(tmp_path, model_cache):
    gone = compare([str(tmp_path / "no_such_folder")], tmp_path, model_cache)
    assert gone.returncode == 2 and "does not exist" in gone.stderr
    (tmp_path / "empty_sweep").mkdir()
    empty = compare([str(tmp_path / "empty_sweep")], tmp_path, model_cache)
    assert empty.returncode == 2 and "holds no runs" in empty.stderr
    wandb = compare(["me/project", "--group", "g"], tmp_path, model_cache)
    assert wandb.returncode == 2 and "needs a W&B login" in wandb.stderr
    # A leaderboard chooses: ranking W&B runs by a test metric is refused, naming the validation metric.
    for metric in ("test_after/accuracy", "test_change/format"):
        by_test = compare(["me/project", "--group", "g", "--metric", metric], tmp_path, model_cache)
        assert by_test.returncode == 2 and "eval_" + metric.removeprefix("test_") in by_test.stderr


def _run(**series: list[float]) -> RunRecord:
    steps = max(len(v) for v in series.values())
    history = [{"step": i + 1, **{k: v[i] for k, v in series.items() if i < len(v)}} for i in range(steps)]
    return RunRecord(name="r", state="finished", objective=None, history=history)


def test_health_flags_replay_the_live_rules_for_old_runs_and_read_recorded_events():
    healthy = _run(
        reward=[0.4, 0.5, 0.5, 0.6],
        reward_std=[0.5, 0.4, 0.45, 0.5],
        kl=[0.0, 0.05, 0.1, 0.1, 0.12, 0.11],
        **{"completions/mean_length": [40, 42, 38, 41]},
        loss=[0.1, 0.2, 0.1],
    )
    assert health(healthy) == []
    assert health(_run(reward=[0.2, 0.0, 0.0, 0.0], reward_std=[0.3, 0.0, 0.0, 0.0])) == ["no-signal"]
    assert health(_run(kl=[0.01, 0.02, 0.05, 0.1, 0.8, 1.5, 3.0, 6.0])) == ["kl-high"]
    assert health(_run(**{"completions/mean_length": [40, 41, 40, 150]})) == ["length-jump"]
    assert health(_run(loss=[0.1, math.nan])) == ["nan"]
    # A run recorded with events: those, not a second opinion computed here (one owner of the rules).
    recorded = _run(loss=[0.1, math.nan])
    recorded.health = [{"rule": "kl", "step": 3, "action": "warn", "message": "m", "values": {}}]
    assert health(recorded) == ["kl-high"]
    recorded.health = []
    assert health(recorded) == []
