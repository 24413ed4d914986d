"""`python -m grpo_lab.doctor`: a truthful report of this machine, blockers that exit 1, and the GPU rules.

The GPU rows cannot run on this CPU machine; they are pure functions of what torch reports, so their tests
give them device lists as torch would report them for real GPUs (named in each case), not a fake torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from grpo_lab.doctor import environment as env
from grpo_lab.doctor import footprint

from conftest import run_cli

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
    assert rows["data"]["detail"].startswith("16 training and 8 held-out prompts")
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
