"""User and environment errors end in one clear line and a non-zero exit, without a traceback; tracebacks only
with HYDRA_FULL_ERROR=1 or --verbose. Every case runs the real CLI, as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_lab import config
from grpo_lab import data as data_mod
from grpo_lab.errors import DataError, describe

from conftest import FAST, REPO, compose, error_line, load_study, one_line_naming, postgres_url, run_cli, skip_here

TESTS = str(REPO / "tests")
SMOKE_SWEEP = ["-m", "sweep=lr_beta", *FAST, "hydra.sweeper.n_trials=1"]


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at `path` (root only): a read-only folder or a disk that fills up, for real."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        skip_here("mounting a tmpfs needs root")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if mount.returncode != 0:
        skip_here(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# ------------------------------------------------------------------------------------------- storage
def test_unreachable_storage_is_one_line_without_the_password(tmp_path, model_cache):
    url = "postgresql+psycopg2://u:secretpw@127.0.0.1:1/db"  # a closed port on loopback
    proc = run_cli([*SMOKE_SWEEP, f"hydra.sweeper.storage={url}"], tmp_path, model_cache, timeout=120)
    line = error_line(proc, "Cannot open the Optuna storage", "postgresql+psycopg2://u:***@127.0.0.1:1/db")
    assert "Connection refused" in line
    assert "secretpw" not in proc.stdout + proc.stderr


def test_wrong_password_storage_is_one_line(tmp_path, model_cache):
    url = postgres_url()
    from sqlalchemy.engine import make_url

    wrong = make_url(url).set(password="not-the-password-42").render_as_string(hide_password=False)
    proc = run_cli([*SMOKE_SWEEP, f"hydra.sweeper.storage={wrong}"], tmp_path, model_cache, timeout=120)
    error_line(proc, "Cannot open the Optuna storage", "password authentication failed")
    assert "not-the-password-42" not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------- outputs
def test_output_folder_that_cannot_be_created(tmp_path, model_cache):
    proc = run_cli([*FAST, "hydra.run.dir=/proc/grpo_lab/run"], tmp_path, model_cache, timeout=120)
    error_line(proc, "No such file or directory", "/proc/grpo_lab")


def test_read_only_output_folder(tmp_path, model_cache):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        proc = run_cli([*FAST, f"hydra.run.dir={ro}/run"], tmp_path, model_cache, timeout=120)
    error_line(proc, "Read-only file system", f"{ro}/run")


def test_full_disk_while_saving_the_model(tmp_path, model_cache):
    # 300 KiB: room for the run's records, not for the tiny model's weights (~430 KB).
    with mounted_tmpfs(tmp_path / "full", "size=300k") as full:
        proc = run_cli(
            [*FAST, "output.save_model=true", "logger=none", f"hydra.run.dir={full}/run"],
            tmp_path,
            model_cache,
            timeout=300,
        )
        metrics = json.loads((full / "run" / "metrics.json").read_text())
    error_line(proc, "No space left on the device")
    assert metrics["status"] == "failed"


# ------------------------------------------------------------------------------------------- rewards
def test_a_reward_that_raises_fails_the_run_naming_it_and_the_completion(tmp_path, model_cache):
    proc = run_cli(
        [*FAST, "+reward.functions.boom._target_=failing_rewards.explode", "+reward.weights.boom=1.0"],
        tmp_path,
        model_cache,
        PYTHONPATH=TESTS,
    )
    # the reward's name, the exception, its own message and which completion
    line = error_line(proc, "`boom`", "RuntimeError", "this reward fails on purpose", "#0")
    (metrics_file,) = (tmp_path / "outputs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "failed" and "`boom`" in metrics["error"] and "#0" in metrics["error"], line


def test_a_reward_that_raises_fails_the_sweep_trials(tmp_path, model_cache):
    # FAILed trials do not count towards n_trials: the sweep stops when most trials fail (3 of 3 here).
    proc = run_cli(
        [*SMOKE_SWEEP, "+reward.functions.boom._target_=failing_rewards.explode", "+reward.weights.boom=1.0"],
        tmp_path,
        model_cache,
        PYTHONPATH=TESTS,
    )
    error_line(proc, "3 of 3", "`boom`", "RuntimeError", "this reward fails on purpose", "#0")
    trials = load_study(tmp_path, "lr_beta").trials
    assert [t.state.name for t in trials] == ["FAIL"] * 3
    assert all("`boom`" in t.user_attrs["error"] and "#0" in t.user_attrs["error"] for t in trials)


# ---------------------------------------------------------------------------------------------- data
def test_missing_dataset_file(tmp_path, model_cache):
    missing = tmp_path / "gone.jsonl"
    proc = run_cli(["experiment=smoke", "data=jsonl", f"data.path={missing}"], tmp_path, model_cache, timeout=120)
    error_line(proc, f"data.path={missing}")


def test_a_dataset_file_that_disappears_after_the_check(tmp_path, monkeypatch):
    path = tmp_path / "train.jsonl"  # passes the existence check, then is gone when it is read
    monkeypatch.setattr(Path, "is_file", lambda self: self == path or os.path.isfile(self))
    cfg = config.load(compose(["experiment=smoke", "data=jsonl", f"data.path={path}"])).data
    with pytest.raises(DataError) as info:
        data_mod.load_datasets(cfg)
    one_line_naming(info.value, str(path), "No such file or directory")


def test_environment_errors_are_described_and_bugs_are_not():
    assert describe(PermissionError(13, "Permission denied", "/data/outputs")) == (
        "Permission denied: '/data/outputs': choose a folder you can write (e.g. hydra.run.dir=DIR)."
    )
    assert describe(OSError(28, "No space left on device", "/x/model.safetensors")).startswith("No space left")
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(28, "No space left on device")
    assert describe(wrapped).startswith("No space left")
    assert describe(KeyError("a bug")) is None


# ------------------------------------------------------------------------------------ full tracebacks
@pytest.mark.parametrize("how", ["HYDRA_FULL_ERROR", "--verbose"])
def test_tracebacks_on_request(tmp_path, model_cache, how):
    missing = tmp_path / "gone.jsonl"
    args = ["experiment=smoke", "data=jsonl", f"data.path={missing}"]
    if how == "--verbose":
        proc = run_cli(["--verbose", *args], tmp_path, model_cache, timeout=120)
    else:
        proc = run_cli(args, tmp_path, model_cache, timeout=120, HYDRA_FULL_ERROR="1")
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "grpo_lab.errors.DataError" in proc.stderr or "DataError" in proc.stderr
    assert "does not exist" in proc.stderr
