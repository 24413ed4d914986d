"""vLLM generation for real, on vLLM's CPU build: `make test-vllm` runs these in .venv-vllm; elsewhere they skip,
naming that command."""

from __future__ import annotations

import json

import pytest

from wandb_files import find_runs, read_run

from conftest import run_cli

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm")
pytestmark = pytest.mark.vllm

# The tiny model with a head size vLLM takes; a learning rate that moves the policy a lot every step, so that
# a generator left with old weights shows at once in vLLM's and the trainer's log-probs of the same tokens.
COLOCATE = [
    "experiment=smoke",
    "model=tiny_vllm",
    "trainer=grpo_vllm_colocate",
    "max_steps=4",
    "lr=0.02",
    "eval.before=false",
    "output.save_model=false",
]
SAMPLING = ("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean")


def test_colocate_trains_with_the_trained_weights_and_records_vllms_sampling_metrics(tmp_path, model_cache):
    proc = run_cli(COLOCATE, tmp_path, model_cache, timeout=900, VLLM_CPU_KVCACHE_SPACE="1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(key in row for row in rows for key in SAMPLING)
    # Every step's completions come from the weights trained so far: vLLM's log-probs match the trainer's. With
    # the first weights kept (no or a partial sync), the gap is ~0.3 from step 2 on at this learning rate.
    gaps = [r["sampling/sampling_logp_difference/mean"] for r in rows]
    assert max(gaps) < 0.01, gaps
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "finished" and all(f"train/{key}" in metrics["metrics"] for key in SAMPLING)
    assert "eval_after/accuracy_ci_low" in metrics["metrics"]  # the held-out evaluation after a vLLM run
    (wandb_run,) = find_runs(run_dir)
    logged = {key for row in read_run(wandb_run).history for key in row}
    assert {f"train/{key}" for key in SAMPLING} <= logged


def test_doctor_reports_vllm_against_trls_range_and_the_cpus_vector_isa(tmp_path, model_cache):
    args = ["--json", "experiment=smoke", "model=tiny_vllm", "trainer=grpo_vllm_colocate"]
    proc = run_cli(args, tmp_path, model_cache, timeout=300, module="grpo_lab.doctor")
    rows = {row["name"]: row for row in json.loads(proc.stdout)["checks"]}
    assert rows["config"]["status"] == "ok", rows["config"]
    assert rows["vLLM"]["status"] == "ok" and "0.31.0" in rows["vLLM"]["detail"], rows["vLLM"]
    assert rows["CPU vector ISA"]["status"] == "ok", rows["CPU vector ISA"]
