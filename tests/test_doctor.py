"""`python -m grpo_lab.doctor`: a truthful report of this machine, blockers that exit 1, and the GPU rules.

The GPU rows cannot run on this CPU machine; they are pure functions of what torch reports, so their tests
give them device lists as torch would report them for real GPUs (named in each case), not a fake torch.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from grpo_lab.config import LauncherConfig
from grpo_lab.doctor import environment as env
from grpo_lab.doctor import footprint, peers
from grpo_lab.net import free_port

from conftest import cli_env, compose, run_cli

SMOKE = ["experiment=smoke"]


def doctor(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    return run_cli(args, cwd, cache, timeout=120, module="grpo_lab.doctor")


def test_doctor_reports_this_machine_and_leaves_nothing_behind(tmp_path, model_cache):
    import optuna

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(study_name="mine", storage=url).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    sweep = ["sweep=lr_beta", f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=mine"]
    done = doctor([*SMOKE, *sweep, "--json"], tmp_path, model_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    rows = {r["name"]: r for r in report["checks"]}
    assert report["ok"] is True and report["blockers"] == []
    for name in ("python", "torch", "trl", "transformers", "accelerate", "peft", "wandb", "optuna", "hydra-core"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["torch"]["detail"].startswith(torch.__version__)
    assert rows["python"]["detail"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")
    if torch.cuda.is_available():
        assert rows["GPU 0"]["status"] in ("ok", "fail")
    else:  # this machine: the report must say CPU-only, not invent a GPU
        assert "CPU build" in rows["torch build"]["detail"] or torch.version.cuda
        assert rows["GPU"]["detail"].startswith(("no GPU visible", "torch has CUDA but sees no GPU"))
    # The tiny model's real size (107k parameters), counted from its config on the meta device.
    assert rows["model"]["detail"].startswith("0.1M parameters, all weights trained")
    assert rows["config"]["detail"].startswith("smoke: builtin:tiny-llama on arithmetic, 4 steps")
    assert rows["data"]["detail"].startswith("16 training, 20 validation and 20 test prompts")
    assert rows["memory"]["status"] == "ok" and "host memory available" in rows["memory"]["detail"]
    assert rows["W&B"]["status"] == "info" and rows["W&B"]["detail"].startswith("offline (not logged in")
    assert rows["Hugging Face Hub"]["detail"].startswith("not needed")
    assert rows["Optuna storage"]["detail"].endswith("1 study; study 'mine' has 3 trials")
    # No outputs/ folder, no W&B files, the study untouched: the doctor only reads.
    assert [p.name for p in tmp_path.iterdir()] == ["optuna.db"]
    assert len(optuna.load_study(study_name="mine", storage=url).trials) == 3


def test_doctor_names_each_blocker_and_exits_1(tmp_path, model_cache):
    (tmp_path / "a_file").write_text("")
    done = doctor(
        [
            *SMOKE,
            "sweep=lr_beta",
            "hydra.sweeper.storage=sqlite:///a_file/optuna.db",  # a folder that is a file
            "trainer.max_completion_length=100000000",  # logits of 10^8 tokens x the vocabulary: terabytes
        ],
        tmp_path,
        model_cache,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    memory = next(line for line in done.stdout.splitlines() if line.startswith("memory"))
    storage = next(line for line in done.stdout.splitlines() if line.startswith("Optuna storage"))
    assert "FAIL" in memory and "needs ≈" in memory
    assert "FAIL" in storage and "a_file is a file, not a folder" in storage
    assert done.stdout.rstrip().endswith("2 blocker(s): memory, Optuna storage")
    assert "memory: lower trainer.per_device_train_batch_size" in done.stdout


def test_doctor_reports_a_config_error_as_a_blocker(tmp_path, model_cache):
    done = doctor([*SMOKE, "lr=-1"], tmp_path, model_cache)
    assert done.returncode == 1
    config_line = next(line for line in done.stdout.splitlines() if line.startswith("config"))
    assert "FAIL" in config_line and "lr" in config_line
    assert "torch build" in done.stdout  # the machine's rows are still there


# ------------------------------------------------------------------------- GPU rules (no GPU needed)
# arch lists as torch.cuda.get_arch_list() reports them for real builds (torch 2.13 on CUDA 12.x)
CUDA_126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
CUDA_128 = (*CUDA_126, "sm_100", "sm_120", "compute_120")


def _gpu(name: str, capability: tuple[int, int], bf16: bool = True) -> env.Gpu:
    return env.Gpu(0, name, capability, total_bytes=80 * 2**30, free_bytes=79 * 2**30, bf16=bf16)


def test_kernels_follow_cudas_compatibility_rules():
    assert env.runs_on((9, 0), CUDA_126)  # H100: sm_90 machine code
    assert env.runs_on((8, 9), ("sm_80", "sm_86"))  # L4 runs sm_86 code (same major, lower minor)
    assert not env.runs_on((12, 0), CUDA_126)  # RTX 5090 on a CUDA 12.6 build: "no kernel image"
    assert env.runs_on((12, 0), CUDA_128)
    assert env.runs_on((12, 1), ("sm_90", "compute_90"))  # PTX is compiled by the driver for newer GPUs
    assert not env.runs_on((8, 0), ("sm_86", "sm_90"))  # machine code never runs on an older minor


def test_gpu_rows_say_what_blocks_and_why():
    build = env.TorchBuild("2.13.0+cu126", "12.6", CUDA_126)
    rows = env.accelerator_checks(build, [_gpu("NVIDIA GeForce RTX 5090", (12, 0))], wants_bf16=True, wants_fp16=False)
    gpu = next(r for r in rows if r.name == "GPU 0")
    assert gpu.status == "fail" and "no kernels for sm_120" in gpu.detail and "no kernel image" in gpu.detail
    rows = env.accelerator_checks(build, [_gpu("Tesla T4", (7, 5), bf16=False)], wants_bf16=True, wants_fp16=False)
    assert [(r.name, r.status) for r in rows] == [("torch build", "ok"), ("GPU 0", "ok"), ("GPU 0 bf16", "fail")]
    rows = env.accelerator_checks(build, [_gpu("NVIDIA H100 80GB HBM3", (9, 0))], wants_bf16=True, wants_fp16=False)
    assert [r.status for r in rows] == ["ok", "ok"] and "sm_90, 79 of 80 GiB free" in rows[1].detail


def test_memory_estimate_by_hand():
    shape = footprint.Shape(
        params=1000, trainable=1000, layers=2, hidden=10, kv_width=4, vocab=50, param_bytes=4, file_bytes=2
    )
    batch = footprint.Batch(
        generation=8,
        train=4,
        prompt_tokens=6,
        completion_tokens=4,
        activation_bytes=4,
        gradient_checkpointing=False,
        reference_model=True,
        optimizer_state_bytes=8,
    )
    parts = footprint.memory(shape, batch)
    assert parts["weights"] == parts["reference model"] == parts["gradients"] == 4000
    assert parts["optimizer"] == 8000
    assert parts["KV cache"] == 8 * 10 * 2 * 2 * 4 * 4  # sequences x tokens x layers x (k, v) x width x bytes
    assert parts["activations"] == 4 * 10 * (34 * 10 * 4 / 2) * 2  # sequences x tokens x per layer x layers
    assert parts["logits"] == 4 * 4 * 50 * 4 * 3  # sequences x completion tokens x vocab x fp32 x 3 copies
    assert footprint.optimizer_state_bytes("adamw_torch", 4) == 8
    assert footprint.optimizer_state_bytes("adamw_bnb_8bit", 4) == 2


def test_vllms_cpu_build_needs_avx2_or_better():
    assert env.cpu_isa_check({"sse4_2", "avx2"}).status == "ok"
    assert "AVX-512" in env.cpu_isa_check({"avx2", "avx512f"}).detail
    assert env.cpu_isa_check({"sse4_2"}).status == "fail"
    assert env.cpu_isa_check(set()).status == "info"  # no /proc/cpuinfo: unknown, not a blocker


# -------------------------------------------------- vLLM's share of the memory (no vLLM and no GPU needed)
# The composed configs are real (`trainer=grpo_vllm_colocate` / `grpo_vllm_server`) and so is TRL's GRPOConfig;
# grpo_lab's rule that refuses use_vllm where vLLM is not installed is the only step skipped. The GPU is an H100
# as torch reports it, and host memory is psutil's answer with chosen sizes, so each row's estimate is pinned to
# the byte: the row passes with exactly that much free and fails with one byte less.
GiB = 2**30
PROMPT = 30  # tokens
H100 = 80 * GiB
FRAMEWORK = int(0.6 * GiB)  # footprint's allowance for a process


def _run(*overrides: str):
    from grpo_lab import config as config_mod

    return config_mod.check_all(compose(["experiment=smoke", "model=tiny_vllm", *overrides]))


def _shape(run, cache: Path) -> footprint.Shape:
    from grpo_lab import models

    return footprint.model_shape(models.architecture(run.model, cache), dtype=run.model.dtype, lora=run.model.lora)


def _training(args, shape: footprint.Shape, *, vllm: bool) -> int:
    """One training process's terms for the smoke config (fp32, AdamW, a reference model), as the doctor adds them."""
    batch = footprint.Batch(
        generation=args.generation_batch_size,
        train=args.per_device_train_batch_size,
        prompt_tokens=PROMPT,
        completion_tokens=args.max_completion_length,
        activation_bytes=4,
        gradient_checkpointing=False,
        reference_model=True,
        optimizer_state_bytes=8,
        vllm_generates=vllm,
    )
    return sum(footprint.memory(shape, batch).values())


def _on_gpu(run, args, shape, free: int):
    from grpo_lab import doctor

    gpu = env.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), total_bytes=H100, free_bytes=free, bf16=True)
    return doctor.memory_check(run, args, shape, PROMPT, [gpu])


def _on_host(monkeypatch, run, args, shape, *, total: int, available: int):
    import psutil

    from grpo_lab import doctor

    memory = type("svmem", (), {"total": total, "available": available})
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    return doctor.memory_check(run, args, shape, PROMPT, [])


def _pinned(row_for, need: int):
    """The row for exactly `need` bytes free (a warning: within 20%), after checking one byte less fails."""
    short = row_for(need - 1)
    assert short.status == "fail", short
    row = row_for(need)
    assert row.status == "warn", row
    return short, row


def test_vllms_share_by_hand():
    shape = footprint.Shape(
        params=1000, trainable=1000, layers=2, hidden=10, kv_width=4, vocab=50, param_bytes=4, file_bytes=4
    )
    batch = footprint.Batch(8, 4, 6, 4, 4, False, True, 8, vllm_generates=True)
    training = footprint.memory(shape, batch)
    assert training["KV cache"] == 0  # vLLM samples: the training process holds no KV cache
    assert training["weights"] == training["reference model"] == 4000 and training["framework"] == FRAMEWORK
    colocate, server = footprint.Vllm(colocate=True, utilization=0.3), footprint.Vllm(colocate=False, utilization=0.3)
    # GPU, colocated: 30% of an 80 GiB GPU (24 GiB), whatever the model; a server: nothing on the training GPU
    assert footprint.vllm_gpu(colocate, H100) == 24 * GiB
    assert footprint.vllm_gpu(server, H100) == 0
    trained = sum(training.values())
    assert footprint.peak(training, {"vLLM": 24 * GiB}) == trained + 24 * GiB
    # sleep mode: generation holds vLLM beside everything but the activations and logits (the training step's)
    resident = trained - training["activations"] - training["logits"]
    assert footprint.peak(training, {"vLLM": 24 * GiB}, sleep=True) == resident + 24 * GiB
    assert footprint.peak(training, {"vLLM": 1}, sleep=True) == trained  # then the training step is the peak
    # CPU: VLLM_CPU_KVCACHE_SPACE is whole GiB; a 16-bit copy of the weights, split over tensor-parallel ranks
    assert footprint.cpu_kv_space("3") == 3 * GiB
    assert footprint.cpu_kv_space(None) is footprint.cpu_kv_space("") is None
    for bad in ("1.5", "4GiB"):
        with pytest.raises(ValueError):
            footprint.cpu_kv_space(bad)
    kw = {"host_total": 10 * GiB, "kv_space": 3 * GiB}
    assert footprint.vllm_cpu(shape, training, colocate, **kw) == {"vLLM weights": 2000, "vLLM KV cache": 3 * GiB}
    two = footprint.Vllm(colocate=True, utilization=0.3, tensor_parallel=2)
    assert footprint.vllm_cpu(shape, training, two, **kw)["vLLM weights"] == 1000
    # vLLM's own rule: 50% of 10 GiB, less the process's RSS when vLLM starts in it (framework, weights, reference
    # model, vLLM's weights); a server's RSS is its own framework and weights, so it takes the 5 GiB in all
    half = footprint.Vllm(colocate=True, utilization=0.5)
    auto = footprint.vllm_cpu(shape, training, half, host_total=10 * GiB, kv_space=None)
    assert auto == {"vLLM weights": 2000, "vLLM KV cache": 5 * GiB - (FRAMEWORK + 4000 + 4000 + 2000)}
    served = footprint.vllm_cpu(shape, training, footprint.Vllm(False, 0.5), host_total=10 * GiB, kv_space=None)
    assert served == {"vLLM framework": FRAMEWORK, "vLLM weights": 2000, "vLLM KV cache": 5 * GiB - FRAMEWORK - 2000}


def test_memory_row_without_vllm_is_unchanged_on_a_gpu(model_cache):
    run, args = _run()
    assert not args.use_vllm
    shape = _shape(run, model_cache)
    kv = args.generation_batch_size * (PROMPT + args.max_completion_length) * shape.layers * 2 * shape.kv_width * 4
    need = _training(args, shape, vllm=False)
    assert need == _training(args, shape, vllm=True) + kv  # HF generate's KV cache is in the training process
    short, row = _pinned(lambda free: _on_gpu(run, args, shape, free), need)
    assert "vLLM" not in row.detail and "KV cache" in row.detail
    assert short.fix.startswith("lower trainer.per_device_train_batch_size")


def test_memory_row_adds_vllms_slice_of_each_gpu_when_colocated(model_cache):
    from grpo_lab import doctor

    run, args = _run("trainer=grpo_vllm_colocate")
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.3)
    shape = _shape(run, model_cache)
    need = _training(args, shape, vllm=True) + 24 * GiB  # 30% of the H100's 80 GiB
    short, row = _pinned(lambda free: _on_gpu(run, args, shape, free), need)
    assert "vLLM 24 GiB: trainer.vllm_gpu_memory_utilization=0.3 x the GPU's 80 GiB" in row.detail
    assert "KV cache" not in row.detail.split("; vLLM")[0]  # the training process samples nothing itself
    assert short.fix.startswith("lower trainer.vllm_gpu_memory_utilization (vLLM's 24 GiB)")
    # two GPUs: the one with less room decides
    h100 = env.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), total_bytes=H100, free_bytes=need, bf16=True)
    fuller = env.Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0), total_bytes=H100, free_bytes=need - 1, bf16=True)
    assert doctor.memory_check(run, args, shape, PROMPT, [h100, fuller]).status == "fail"
    assert doctor.memory_check(run, args, shape, PROMPT, [h100, h100]).status == "warn"
    # the knob moves the estimate: 10% of the GPU (8 GiB)
    run, args = _run("trainer=grpo_vllm_colocate", "trainer.vllm_gpu_memory_utilization=0.1")
    _pinned(lambda free: _on_gpu(run, args, shape, free), need - 24 * GiB + 8 * GiB)
    # sleep mode: vLLM's slice is freed while training steps, so it only sits beside what stays resident
    run, args = _run("trainer=grpo_vllm_colocate", "+trainer.vllm_enable_sleep_mode=true")
    parts = footprint.memory(
        shape, footprint.Batch(8, 8, PROMPT, args.max_completion_length, 4, False, True, 8, vllm_generates=True)
    )
    resident = sum(parts.values()) - parts["activations"] - parts["logits"]
    _pinned(lambda free: _on_gpu(run, args, shape, free), resident + 24 * GiB)


def test_memory_row_adds_nothing_to_the_training_gpus_for_a_vllm_server(model_cache):
    run, args = _run("trainer=grpo_vllm_server")
    assert (args.use_vllm, args.vllm_mode) == (True, "server")
    shape = _shape(run, model_cache)
    _, row = _pinned(lambda free: _on_gpu(run, args, shape, free), _training(args, shape, vllm=True))
    assert "vLLM server: on its own GPUs, nothing on the training ones" in row.detail


def test_memory_row_counts_vllms_cpu_build_in_host_memory(monkeypatch, model_cache):
    # two processes, each with its own vLLM: a 16-bit copy of the weights and the KV cache VLLM_CPU_KVCACHE_SPACE says
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    run, args = _run("trainer=grpo_vllm_colocate", "launcher=ddp", "launcher.num_processes=2")
    shape = _shape(run, model_cache)
    need = 2 * (_training(args, shape, vllm=True) + shape.params * 2 + 3 * GiB)
    short, row = _pinned(lambda free: _on_host(monkeypatch, run, args, shape, total=64 * GiB, available=free), need)
    assert "vLLM in each process: weights 209 KiB, KV cache 3.00 GiB (VLLM_CPU_KVCACHE_SPACE=3)" in row.detail
    assert "2 process(es)" in row.detail
    assert short.fix.startswith("lower VLLM_CPU_KVCACHE_SPACE")


def test_memory_row_follows_vllms_own_kv_cache_rule_on_the_cpu(monkeypatch, model_cache):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    run, args = _run("trainer=grpo_vllm_colocate")
    shape = _shape(run, model_cache)
    training = _training(args, shape, vllm=True)
    # 30% of 20 GiB (6 GiB) for vLLM's process, less what it holds when vLLM starts: framework, weights,
    # reference model and vLLM's copy; so the process ends at 6 GiB plus what training adds after
    held = FRAMEWORK + 2 * shape.params * 4 + shape.params * 2
    need = training + shape.params * 2 + (6 * GiB - held)
    assert need == 6 * GiB + training - FRAMEWORK - 2 * shape.params * 4
    short, row = _pinned(lambda free: _on_host(monkeypatch, run, args, shape, total=20 * GiB, available=free), need)
    assert (
        "(VLLM_CPU_KVCACHE_SPACE unset, so vLLM's own rule: trainer.vllm_gpu_memory_utilization=0.3 x 20 GiB"
        in row.detail
    )
    assert short.fix.startswith("set VLLM_CPU_KVCACHE_SPACE=<GiB> or lower trainer.vllm_gpu_memory_utilization")
    # 30% of 2 GiB is less than the process already holds: vLLM refuses to start, whatever memory is free
    small = _on_host(monkeypatch, run, args, shape, total=2 * GiB, available=2 * GiB)
    assert small.status == "fail" and "vLLM's CPU build would refuse to start" in small.detail, small
    assert "raise trainer.vllm_gpu_memory_utilization" in small.fix
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1.5")  # vLLM's int() refuses it
    bad = _on_host(monkeypatch, run, args, shape, total=20 * GiB, available=20 * GiB)
    assert bad.status == "fail" and "VLLM_CPU_KVCACHE_SPACE='1.5' is not a whole number of GiB" in bad.detail
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")  # no KV cache at all: vLLM stops at start-up
    none = _on_host(monkeypatch, run, args, shape, total=20 * GiB, available=20 * GiB)
    assert none.status == "fail" and "No available memory for the cache blocks" in none.detail


def test_memory_row_counts_a_vllm_server_on_this_host_once(monkeypatch, model_cache):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    run, args = _run("trainer=grpo_vllm_server", "launcher=ddp", "launcher.num_processes=2")
    shape = _shape(run, model_cache)
    training = _training(args, shape, vllm=True)
    # TRL's default host 0.0.0.0 is this machine: the server's process (framework, weights, 2 GiB KV cache), once
    need = 2 * training + FRAMEWORK + shape.params * 2 + 2 * GiB
    _, row = _pinned(lambda free: _on_host(monkeypatch, run, args, shape, total=64 * GiB, available=free), need)
    assert "vLLM server on this host (0.0.0.0), same memory, counted once" in row.detail
    # a server on another machine takes none of this one's memory
    run, args = _run(
        "trainer=grpo_vllm_server", "launcher=ddp", "launcher.num_processes=2", "+trainer.vllm_server_host=10.1.2.3"
    )
    _, row = _pinned(lambda free: _on_host(monkeypatch, run, args, shape, total=64 * GiB, available=free), 2 * training)
    assert "vLLM server at 10.1.2.3: its memory is that machine's" in row.detail


# ------------------------------------------------------------------ a job across machines (loopback stands in)
DDP_LAUNCHER = dict(
    kind="accelerate", num_processes=2, config_file="ddp.yaml", gpus_per_job=None, main_process_port=None,
    num_machines=None, machine_rank=None, main_process_ip=None, extra_args=[],
)  # fmt: skip


def _machine(rank: int, port: int, ip: str = "127.0.0.1", num_processes: int = 2) -> LauncherConfig:
    return LauncherConfig(
        **{**DDP_LAUNCHER, "num_machines": 2, "machine_rank": rank, "main_process_ip": ip, "main_process_port": port,
           "num_processes": num_processes}
    )  # fmt: skip


def test_versions_compare_package_by_package():
    mine = peers.local_versions()
    assert list(mine) == ["python", "grpo_lab", "torch", "transformers", "trl", "accelerate"]
    assert mine["torch"] == torch.__version__
    same = peers.compare_versions(mine, dict(mine), "machine 1", host="gpu08")
    assert same == peers.Check(
        "machine 1", "ok", "machine 1 (gpu08): same python/grpo_lab/torch/transformers/trl/accelerate"
    )
    older = peers.compare_versions({**mine, "torch": "2.13.0"}, {**mine, "torch": "2.12.0"}, "machine 1")
    assert older.status == "fail" and older.fix.startswith("install the same versions on every machine")
    assert older.detail == "machine 1 runs other versions: torch 2.13.0 here, 2.12.0 on machine 1"


def test_one_machine_has_no_peer_rows_and_a_wrong_topology_is_a_blocker():
    assert peers.peer_checks(LauncherConfig(**DDP_LAUNCHER), {}, wait_s=0) == []
    no_ip = LauncherConfig(**{**DDP_LAUNCHER, "num_machines": 2, "machine_rank": 1})
    [row] = peers.peer_checks(no_ip, {}, wait_s=0)
    assert (row.name, row.status) == ("machines", "fail") and "needs `launcher.main_process_ip`" in row.detail


def test_two_machines_meet_on_loopback_and_compare_versions():
    port = free_port()
    with ThreadPoolExecutor(2) as pool:  # machine 1 starts first: it retries until machine 0 listens
        joined = pool.submit(peers.peer_checks, _machine(1, port), {}, wait_s=10)
        time.sleep(0.6)
        hosted = pool.submit(peers.peer_checks, _machine(0, port), {}, wait_s=10)
        host_rows, peer_rows = hosted.result(), joined.result()
    same = "same python/grpo_lab/torch/transformers/trl/accelerate"
    assert [(r.name, r.status) for r in host_rows] == [("machines", "ok"), ("machine 1", "ok")], host_rows
    assert host_rows[0].detail == f"machine 0 of 2: 127.0.0.1:{port} free here; 1 of 1 other machines reported"
    assert host_rows[1].detail == f"machine 1 ({socket.gethostname()}): {same}"
    assert [(r.name, r.status) for r in peer_rows] == [("machines", "ok"), ("machine 0", "ok")], peer_rows
    assert peer_rows[0].detail == f"machine 1 of 2: reached machine 0 at 127.0.0.1:{port}"
    assert peer_rows[1].detail.endswith(same)
    with socket.create_server(("127.0.0.1", port)):  # machine 0 let the port go: the real launch can bind it
        pass


def test_machines_started_with_another_job_shape_are_a_blocker():
    """num_processes differs between the two commands: each side says so (the launch would hang at rendezvous)."""
    port = free_port()
    with ThreadPoolExecutor(2) as pool:
        joined = pool.submit(peers.peer_checks, _machine(1, port, num_processes=4), {}, wait_s=10)
        hosted = pool.submit(peers.peer_checks, _machine(0, port), {}, wait_s=10)
        host_rows, peer_rows = hosted.result(), joined.result()
    (host_fail,) = [r for r in host_rows if r.status == "fail"]
    assert host_fail.name == "machine 1" and "launcher.num_processes=2 here, 4 on machine 1" in host_fail.detail
    (peer_fail,) = [r for r in peer_rows if r.status == "fail"]
    assert "launcher.num_processes=4 here, 2 on machine 0" in peer_fail.detail
    assert peers.compare_jobs({"a": "1"}, None, "machine 0") == []  # an older doctor sends no job: no verdict


def test_each_side_says_what_is_wrong_with_the_address(monkeypatch):
    port = free_port()
    started = time.monotonic()
    [alone] = peers.peer_checks(_machine(1, port), {}, wait_s=1.5)  # machine 0's doctor never started
    assert time.monotonic() - started < 5
    assert alone.status == "warn" and alone.detail.startswith(f"127.0.0.1 is reachable but nothing listens on {port}")
    assert "run the doctor on machine 0 at the same time" in alone.fix
    [nowhere] = peers.peer_checks(_machine(1, port, ip="no-such-host.invalid"), {}, wait_s=1.5)
    assert nowhere.status == "fail" and nowhere.detail == "main_process_ip no-such-host.invalid does not resolve"
    with socket.create_server(("127.0.0.1", port)):  # something else holds the port on machine 0
        [taken] = peers.peer_checks(_machine(0, port), {}, wait_s=1)
    assert taken.status == "fail" and taken.detail == f"port {port} is in use on machine 0"
    [elsewhere] = peers.peer_checks(_machine(0, port, ip="192.0.2.1"), {}, wait_s=1)  # TEST-NET-1: not this host
    assert elsewhere.status == "fail" and elsewhere.detail.startswith(
        "main_process_ip 192.0.2.1 is not an address of this machine: machine 0 must be the host at main_process_ip"
    )
    # machine 0 alone: the port is free, and the row for machine 1 says where to start it
    rows = peers.peer_checks(_machine(0, port), {}, wait_s=0.5)
    assert [(r.name, r.status) for r in rows] == [("machines", "ok"), ("machine 1", "warn")]
    assert rows[1].detail == "machine 1 did not report within 0.5 s"
    assert "launcher.machine_rank=1" in rows[1].fix


def test_memory_row_counts_this_machines_share_of_the_processes(model_cache):
    several = ["launcher=ddp", "launcher.num_processes=4", "launcher.num_machines=2"]
    run, args = _run(*several, "launcher.main_process_ip=10.0.0.5")
    shape = _shape(run, model_cache)
    gpu = env.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), total_bytes=H100, free_bytes=H100, bf16=True)
    from grpo_lab import doctor

    one = doctor.memory_check(run, args, shape, PROMPT, [gpu])
    assert one.status == "fail" and one.detail == (
        "launcher.num_processes=4 on 2 machines, 2 on this one, but 1 GPU(s) visible"
    )
    assert doctor.memory_check(run, args, shape, PROMPT, [gpu, gpu]).status == "ok"


@pytest.mark.heavy
def test_doctor_on_two_machines_at_once(tmp_path, model_cache):
    port = free_port()
    several = ["launcher=ddp", "launcher.num_processes=2", "launcher.num_machines=2"]
    several += ["launcher.main_process_ip=127.0.0.1", f"launcher.main_process_port={port}", "--wait", "30"]
    started = []
    for rank in (0, 1):
        (tmp_path / f"m{rank}").mkdir()
        started.append(
            subprocess.Popen(
                [sys.executable, "-m", "grpo_lab.doctor", *SMOKE, *several, f"launcher.machine_rank={rank}", "--json"],
                cwd=tmp_path / f"m{rank}",
                env=cli_env(model_cache),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = [p.communicate(timeout=120) for p in started]
    for p, (out, err) in zip(started, done, strict=True):
        assert p.returncode == 0, out + err[-3000:]
    host, peer = ({r["name"]: r for r in json.loads(out)["checks"]} for out, _ in done)
    assert host["machines"]["detail"] == f"machine 0 of 2: 127.0.0.1:{port} free here; 1 of 1 other machines reported"
    assert host["machine 1"]["status"] == peer["machine 0"]["status"] == "ok"
    assert peer["machines"]["detail"] == f"machine 1 of 2: reached machine 0 at 127.0.0.1:{port}"
    if not torch.cuda.is_available():  # each machine runs its share of the 2 processes
        assert "host memory available, 1 process(es)" in host["memory"]["detail"]
