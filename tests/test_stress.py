"""CI's short run of benchmarks/sweep_stress.py: the sweep's promise (n workers, exactly n_trials, nothing lost)
on SQLite and PostgreSQL, with a CPU hog beside the workers and one of them `kill -9`ed in every other
repetition, then resumed. CI runs the killed repetitions only (the clean case is the two-worker tests of
test_sweeps.py). The full table (>= 60 sweeps, journal files too, 4 workers) is in the README."""

from __future__ import annotations

import json
import random
import subprocess
import sys

from conftest import REPO, postgres_url


def test_short_stress_check_finds_no_duplicate_overshoot_loss_or_leftover(tmp_path, model_cache):
    postgres_url()  # the script reads GRPO_LAB_TEST_POSTGRES_URL itself
    seed = random.randrange(10_000)  # where the kills land; printed on failure to replay it
    out = tmp_path / "stress.json"
    args = ["--storages", "sqlite,postgresql", "--workers", "2", "--reps", "1", "--only-kills"]
    args += ["--trials-per-worker", "1"]
    args += ["--check", "--seed", str(seed), "--out", str(out), "--work", str(tmp_path), "--cache", str(model_cache)]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "sweep_stress.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    assert proc.returncode == 0, f"seed {seed}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert [(r["storage"], r["kill"]) for r in rows] == [("sqlite", True), ("postgresql", True)]
    assert all(r["got"] == r["expected"] == 2 and r["exit_codes_ok"] for r in rows), rows
