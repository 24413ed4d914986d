"""CI's short run of benchmarks/sweep_stress.py: the sweep's promise (n workers, exactly n_trials, nothing lost)
with a CPU hog beside the workers and one of them `kill -9`ed, then resumed. To keep CI under 20 minutes it
runs the killed repetition on PostgreSQL only, the storage of multi-machine sweeps and the only one whose
workers share no file; the same on SQLite and journal files is `make test-all`
(test_sweeps.test_resume_after_a_killed_worker) and the full table (>= 60 sweeps, 4 workers) in the README."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from conftest import REPO, postgres_url


@pytest.mark.parametrize(
    ("storage", "workers"),
    [
        pytest.param("postgresql", 2, marks=pytest.mark.heavy),
        # 4 workers through Optuna's gRPC proxy in front of PostgreSQL (~1 min more). In CI the proxy's claims are
        # checked by tests/test_storage.py (8 workers); the README's table has the full run.
        pytest.param("grpc", 4, marks=pytest.mark.slow),
    ],
)
def test_short_stress_check_finds_no_duplicate_overshoot_loss_or_leftover(tmp_path, model_cache, storage, workers):
    postgres_url()  # the script reads GRPO_LAB_TEST_POSTGRES_URL itself
    seed = random.randrange(10_000)  # where the kills land; printed on failure to replay it
    out = tmp_path / "stress.json"
    args = ["--storages", storage, "--workers", str(workers), "--reps", "1", "--only-kills"]
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
    assert [(r["storage"], r["kill"]) for r in rows] == [(storage, True)]
    assert all(r["got"] == r["expected"] == workers and r["exit_codes_ok"] for r in rows), rows
