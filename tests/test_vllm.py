"""vLLM generation for real, on vLLM's CPU build: `make test-vllm` runs these in .venv-vllm; elsewhere they skip,
naming that command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from grpo_lab.net import free_port
from wandb_files import find_runs, read_run

from conftest import cli_env, error_line, run_cli

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


# ------------------------------------------------------------------------------------------- server
SERVER = [*(a for a in COLOCATE if not a.startswith("trainer=")), "trainer=grpo_vllm_server", "vllm_server.start=true"]


def _servers(model_cache) -> list[psutil.Process]:
    """vLLM server processes serving a model of this test session's cache (only grpo_lab starts those)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "vllm.entrypoints" in cmdline and str(model_cache) in cmdline:
            found.append(process)
    return found


def _in_group(group: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group:
                found.append(process)
    return found


def test_server_started_for_the_job_trains_with_the_trained_weights_and_is_gone_after(tmp_path, model_cache):
    proc = run_cli(SERVER, tmp_path, model_cache, timeout=900, VLLM_CPU_KVCACHE_SPACE="1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("outputs/runs/*/*/metrics.json")}
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    # The server generated every step's completions with the weights trained so far (sent through grpo_lab's
    # loader: TRL's NCCL transfer needs CUDA); with its first weights kept the gap is ~0.3 from step 2 on.
    gaps = [r["sampling/sampling_logp_difference/mean"] for r in rows]
    assert len(gaps) == 4 and max(gaps) < 0.01, gaps
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "finished" and metrics["durations_s"]["vllm_server_start"] > 0
    assert "Application startup complete" in (run_dir / "vllm_server.log").read_text()
    assert _servers(model_cache) == []


def test_a_server_that_is_not_there_fails_in_seconds_with_one_line_and_a_failed_run(tmp_path, model_cache):
    port = free_port()  # and nothing will listen there
    args = [*SERVER[:-1], "trainer.vllm_server_host=127.0.0.1", f"trainer.vllm_server_port={port}"]
    args.append("vllm_server.connect_timeout=3")
    started = time.monotonic()
    proc = run_cli(args, tmp_path, model_cache, timeout=300)
    # TRL's own client would wait 240 s; the check gives up after connect_timeout (plus start-up imports).
    assert proc.returncode == 1 and time.monotonic() - started < 120
    url = f"http://127.0.0.1:{port}"
    error_line(proc, url, "connection refused", "vllm_server.start=true", "python -m grpo_lab.vllm_server")
    (metrics_file,) = tmp_path.glob("outputs/runs/*/*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "failed" and url in metrics["error"]


def _popen(args: list[str], cwd, model_cache, **more) -> subprocess.Popen:
    env = cli_env(model_cache, VLLM_CPU_KVCACHE_SPACE="1")
    return subprocess.Popen(
        [sys.executable, "-m", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        **more,
    )  # fmt: skip


def _wait_for(ready, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(1)


def test_a_user_started_server_that_dies_mid_run_stops_the_run_in_seconds_with_one_line(tmp_path, model_cache):
    """The README's way: `python -m grpo_lab.vllm_server <overrides>` in one shell, the run in another; the server
    goes away during training (killed), and the run says so within seconds instead of retrying for a minute."""
    port = free_port()
    server = _popen(
        ["grpo_lab.vllm_server", "experiment=smoke", "model=tiny_vllm", f"--port={port}"], tmp_path, model_cache,
        start_new_session=True,
    )  # fmt: skip
    args = [*(a for a in SERVER if a.split("=")[0] not in ("max_steps", "vllm_server.start")), "max_steps=400"]
    args += ["trainer.vllm_server_host=127.0.0.1", f"trainer.vllm_server_port={port}"]
    args.append("vllm_server.connect_timeout=600")  # the run waits for the server's start-up
    job = None
    try:
        job = _popen(["grpo_lab", *args, "eval.after=false", "objective.metric=train/reward"], tmp_path, model_cache)
        _wait_for(lambda: any(p.stat().st_size for p in tmp_path.glob("outputs/runs/*/*/history.jsonl")), job)
        os.killpg(server.pid, signal.SIGKILL)  # the server and its engine process
        killed = time.monotonic()
        _, stderr = job.communicate(timeout=300)
    finally:
        for process in (job, server):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL) if process is server else process.kill()
    # The watcher sees it within seconds; TRL's client alone retries for about a minute, then prints a traceback.
    assert job.returncode == 1 and time.monotonic() - killed < 60, stderr[-3000:]
    ended = subprocess.CompletedProcess(args, job.returncode, "", stderr)
    error_line(ended, f"http://127.0.0.1:{port}", "during training", "connection refused")
    (metrics_file,) = tmp_path.glob("outputs/runs/*/*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["status"] == "failed" and "during training" in metrics["error"]
    assert _servers(model_cache) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_started_server_ends_with_its_job_when_the_job_is_stopped_or_killed(tmp_path, model_cache, sig):
    """SIGTERM: the job records itself interrupted and stops the server on its way out. SIGKILL (no way out): the
    server's own watchdog sees its job gone and stops it. Either way no vLLM process is left."""
    args = [*(a for a in SERVER if not a.startswith("max_steps=")), "max_steps=400", "eval.after=false"]
    job = _popen(["grpo_lab", *args, "objective.metric=train/reward"], tmp_path, model_cache)
    try:
        _wait_for(lambda: any(p.stat().st_size for p in tmp_path.glob("outputs/runs/*/*/history.jsonl")), job)
        # The server's process group: its API server and vLLM's engine process (whose command line is Python's).
        (group,) = {os.getpgid(server.pid) for server in _servers(model_cache)}
        job.send_signal(sig)
        job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 60  # the watchdog's SIGTERM, then vLLM's own shutdown
    while _in_group(group) and time.monotonic() < deadline:
        time.sleep(1)
    assert _in_group(group) == []
    if sig == signal.SIGTERM:
        (metrics_file,) = tmp_path.glob("outputs/runs/*/*/metrics.json")
        assert json.loads(metrics_file.read_text())["status"] == "interrupted"


# ------------------------------------------------------------------------------------ grids and sweeps
def _memory(tmp_path) -> list[dict]:
    """The two jobs' memory, in their order: a grid's folders are 0 and 1, a sweep's trial_0 and trial_1."""
    found = [*tmp_path.glob("outputs/multirun/*/*/*/metrics.json"), *tmp_path.glob("outputs/sweeps/*/*/metrics.json")]
    files = sorted(found, key=lambda p: int(p.parent.name.removeprefix("trial_")))
    found = [json.loads(path.read_text()) for path in files]
    assert [m["status"] for m in found] == ["finished"] * len(found) and len(found) == 2, found
    return [m["memory_mb"] for m in found]


@pytest.mark.parametrize(
    "multirun",
    [["lr=0.01,0.02"], ["sweep=lr_beta", "hydra.sweeper.n_trials=2"]],
    ids=["grid", "sweep"],
)
def test_each_job_of_a_grid_or_sweep_releases_its_colocated_engine(tmp_path, model_cache, multirun):
    args = ["-m", *COLOCATE[:-2], "max_steps=2", *multirun]
    if multirun[0].startswith("sweep="):
        args = [a for a in args if not a.startswith("lr=")] + ["hydra/sweeper/pruner=none"]
    proc = run_cli(args, tmp_path, model_cache, timeout=900, VLLM_CPU_KVCACHE_SPACE="1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second = _memory(tmp_path)
    # The engine's KV cache alone is 1 GiB (VLLM_CPU_KVCACHE_SPACE=1): kept past its job, the second job would
    # end ~1 GiB above where it started. Measured: within ~20 MB.
    assert second["rss_end"] - second["rss_start"] < 300, (first, second)


def test_a_head_size_vllms_cpu_attention_lacks_is_refused_naming_tiny_vllm(tmp_path, model_cache):
    """The tiny model's heads (size 16) are not among vLLM's CPU attention sizes: without the rule, the engine
    starts and the first generation fails (`Unsupported CPU attention configuration`)."""
    started = time.monotonic()
    proc = run_cli(["experiment=smoke", "trainer=grpo_vllm_colocate"], tmp_path, model_cache, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    error_line(proc, "`model.name_or_path", "head", "model=tiny_vllm", "trainer=grpo")
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 120  # refused before vLLM starts
    assert not list(tmp_path.glob("outputs/runs/*/*/metrics.json"))  # no run started, none recorded
