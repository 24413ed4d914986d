"""Can this machine run this config? Versions, GPUs, memory, disk, W&B, the Hub and a sweep's storage.

`python -m grpo_lab.doctor [--json] [the run's overrides]` composes the run exactly as `python -m grpo_lab`
would, checks it without loading any weights, prints one row per check and exits 1 when a row is a
blocker (`fail`). Each check's rules live in environment.py (what the machine has), footprint.py (what the
run will take) and here (what the config asks for).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from grpo_lab import config as config_mod
from grpo_lab.doctor import environment, footprint, peers
from grpo_lab.doctor.checks import Check
from grpo_lab.errors import ConfigError, describe, one_line
from grpo_lab.launch import machines
from grpo_lab.redact import redact
from grpo_lab.vllm_engine import server as vllm_server

__all__ = ["Check", "collect", "render", "to_json"]

_TIMEOUT = 2.0  # seconds for each network probe
_PROMPT_SAMPLE = 64  # prompts measured for the prompt-length estimate
_CHARS_PER_TOKEN = 4  # a BPE rule of thumb for English text; the estimate says "≈"
_TEMPLATE_TOKENS = 8  # chat-template tokens per message


def collect(cfg: Any, *, sweeper: Any, cache_dir: Path, wait_s: float = peers.WAIT_S) -> list[Check]:
    """Every check, for a composed Hydra config `cfg` and its `hydra.sweeper` node; on a job across machines, waits
    up to `wait_s` for the other machines' doctors."""
    from grpo_lab.run import tracking

    rows = [environment.python_row(), *environment.version_checks()]
    run, args, problem = _validated(cfg)
    rows.append(Check("config", "fail", problem) if run is None else Check("config", "ok", _describe_run(run)))
    build, gpus = environment.detect()
    rows += environment.accelerator_checks(
        build, gpus, wants_bf16=bool(args and args.bf16), wants_fp16=bool(args and args.fp16)
    )
    if run is not None:
        rows += environment.hub_checks(_hub_repos(run), timeout=_TIMEOUT)
        rows += _run_checks(run, args, gpus, cache_dir)
        if args.use_vllm:
            rows += environment.vllm_checks(on_gpu=bool(gpus))
        mode, logged_in = tracking.choose_mode(run.logger), tracking.wandb_logged_in()
        rows += environment.wandb_checks(mode, logged_in, tracking.wandb_base_url(), timeout=_TIMEOUT)
        rows += peers.peer_checks(run.launcher, os.environ, wait_s=wait_s)  # last: it may wait for the others
    if sweeper is not None and "storage" in sweeper:
        rows.append(storage_check(sweeper.storage, sweeper.get("study_name")))
    return rows


def _validated(cfg: Any) -> tuple[Any, Any, str]:
    """(RunConfig, TRL's GRPOConfig, "") or (None, None, the problem) when the run would be refused."""

    try:
        run, args = config_mod.check_all(cfg)
    except Exception as e:
        line = describe(e)
        if line is None:
            raise
        return None, None, line
    return run, args, ""


def _describe_run(run: Any) -> str:
    return (
        f"{run.name}: {run.model.name_or_path} on {run.data.kind}, {run.max_steps} steps, "
        f"{run.num_generations} completions per prompt, {run.launcher.num_processes} process(es)"
    )


def _hub_repos(run: Any) -> list[tuple[str, str, bool]]:
    from grpo_lab import models

    repos = []
    source = models.resolve_source(run.model.name_or_path)
    if source.kind == "hub":
        repos.append(("model", source.location, models.in_hf_cache(source.location)))
    if run.data.kind == "gsm8k" and run.data.path is None:
        repos.append(("data", run.data.hub_id, _dataset_cached(run.data.hub_id)))
    return repos


def _dataset_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "README.md", repo_type="dataset"), str)
    except ValueError:
        return False


# --------------------------------------------------------------------------------- data, memory, disk
def _run_checks(run: Any, args: Any, gpus: list[environment.Gpu], cache_dir: Path) -> list[Check]:
    data_row, prompt_tokens = _data_check(run)
    rows = [data_row]
    try:
        from grpo_lab import models

        shape = footprint.model_shape(
            models.architecture(run.model, cache_dir), dtype=run.model.dtype, lora=run.model.lora
        )
    except Exception as e:
        reason = _reason(e)
        return [*rows, Check("memory", "warn", f"not estimated: the model's config cannot be read ({reason})")]
    trained = "LoRA adapter" if run.model.lora.enabled else "all weights"
    rows.append(
        Check(
            "model", "info", f"{shape.params / 1e6:,.1f}M parameters, {trained} trained ({shape.trainable / 1e6:,.2f}M)"
        )
    )
    rows.append(memory_check(run, args, shape, prompt_tokens, gpus))
    rows.append(_disk_check(run, args, shape, cache_dir))
    return rows


def _data_check(run: Any) -> tuple[Check, int]:
    from grpo_lab import data as data_mod

    try:
        pair = data_mod.load_datasets(run.data)
    except Exception as e:
        reason = _reason(e)
        return Check("data", "fail", reason), 256
    prompts = pair.train.select(range(min(_PROMPT_SAMPLE, len(pair.train))))["prompt"]
    tokens = max(sum(len(m["content"]) for m in p) // _CHARS_PER_TOKEN + _TEMPLATE_TOKENS * len(p) for p in prompts)
    sizes = f"{len(pair.train):,} training, {len(pair.eval):,} validation and {len(pair.test):,} test prompts"
    detail = f"{sizes}; longest prompt ≈{tokens} tokens"
    return Check("data", "ok", detail), tokens


def memory_check(run: Any, args: Any, shape: footprint.Shape, prompt_tokens: int, gpus: list[Any]) -> Check:
    vllm = _vllm(args)
    batch = footprint.Batch(
        generation=args.generation_batch_size or args.per_device_train_batch_size * (args.steps_per_generation or 1),
        train=args.per_device_train_batch_size,
        prompt_tokens=prompt_tokens,
        completion_tokens=args.max_completion_length,
        activation_bytes=2 if (args.bf16 or args.fp16) else shape.param_bytes,
        gradient_checkpointing=bool(args.gradient_checkpointing),
        reference_model=run.beta > 0 and not run.model.lora.enabled,
        optimizer_state_bytes=footprint.optimizer_state_bytes(str(args.optim), shape.param_bytes),
        vllm_generates=vllm is not None,
    )
    parts = footprint.memory(shape, batch)
    procs, share = _processes_here(run.launcher)
    fix = "lower trainer.per_device_train_batch_size or max_completion_length, or model.lora.enabled=true"
    if gpus:
        if procs > len(gpus):
            return Check("memory", "fail", f"{share} but {len(gpus)} GPU(s) visible", "fewer processes")
        return _gpu_memory(parts, vllm, gpus, fix)
    return _host_memory(shape, parts, vllm, args, procs, fix)


def _processes_here(launcher: Any) -> tuple[int, str]:
    """This machine's training processes, and how the config says so: launcher.num_processes counts every machine's
    (as accelerate's --num_processes does). A wrong topology is the "machines" row's to report."""
    total = launcher.num_processes
    try:
        n = machines.resolve(launcher, os.environ).num_machines
    except ConfigError:
        n = 1
    if n == 1:
        return total, f"launcher.num_processes={total}"
    return total // n, f"launcher.num_processes={total} on {n} machines, {total // n} on this one,"


def _vllm(args: Any) -> footprint.Vllm | None:
    if not args.use_vllm:
        return None
    return footprint.Vllm(
        colocate=args.vllm_mode == "colocate",
        utilization=float(args.vllm_gpu_memory_utilization),
        tensor_parallel=int(args.vllm_tensor_parallel_size or 1),
        sleep=bool(args.vllm_enable_sleep_mode),
    )


def _terms(parts: dict[str, int], prefix: str = "") -> str:
    return ", ".join(f"{k.removeprefix(prefix)} {footprint.size(v)}" for k, v in parts.items() if v)


def _gpu_memory(parts: dict[str, int], vllm: footprint.Vllm | None, gpus: list[Any], fix: str) -> Check:
    """Per process, against one GPU's free memory: the fullest, or with vLLM colocated the one with least room."""
    need, free = sum(parts.values()), min(g.free_bytes for g in gpus)
    where, shown = f"free on the fullest GPU ({len(gpus)} visible), per process", _terms(parts)
    if vllm is not None and not vllm.colocate:
        shown += "; vLLM server: on its own GPUs, nothing on the training ones"
    elif vllm is not None:
        gpu = min(gpus, key=lambda g: g.free_bytes - footprint.vllm_gpu(vllm, g.total_bytes))
        share = footprint.vllm_gpu(vllm, gpu.total_bytes)
        need, free = footprint.peak(parts, {"vLLM": share}, sleep=vllm.sleep), gpu.free_bytes
        where = f"free on the GPU with the least room ({len(gpus)} visible), per process"
        shown += (
            f"; vLLM {footprint.size(share)}: trainer.vllm_gpu_memory_utilization={vllm.utilization:g} x the GPU's "
            f"{footprint.size(gpu.total_bytes)}, its weights copy and KV cache inside"
        )
        if vllm.sleep:
            shown += (
                ", freed while training steps (vllm_enable_sleep_mode): counted beside all but activations and logits"
            )
        fix = f"lower trainer.vllm_gpu_memory_utilization (vLLM's {footprint.size(share)}), " + fix
    detail = f"needs ≈{footprint.size(need)} of {footprint.size(free)} {where} ({shown}; an estimate)"
    return _budget("memory", need, free, detail, fix)


def _host_memory(
    shape: footprint.Shape, parts: dict[str, int], vllm: footprint.Vllm | None, args: Any, procs: int, fix: str
) -> Check:
    """Every training process together, plus vLLM's CPU build (in each process, or once as a server on this
    host), against the host memory available."""
    import psutil

    host = psutil.virtual_memory()
    need, shown = sum(parts.values()) * procs, _terms(parts)
    base_url = None if vllm is None or vllm.colocate else vllm_server.base_url_of(args)
    server = vllm_server.host_of(base_url) if base_url is not None else None
    if base_url is not None and not vllm_server.is_local(base_url):
        shown += f"; vLLM server at {server}: its memory is that machine's"
    elif vllm is not None:
        found = _vllm_on_host(shape, parts, vllm, host.total)
        if isinstance(found, Check):
            return found
        vparts, how, lower = found
        if vllm.colocate:
            need += procs * sum(vparts.values())
            shown += f"; vLLM in each process: {_terms(vparts, 'vLLM ')} ({how})"
            if vllm.sleep:
                shown += "; vllm_enable_sleep_mode does nothing on vLLM's CPU build"
        else:
            need += sum(vparts.values())
            shown += (
                f"; vLLM server on this host ({server}), same memory, counted once: {_terms(vparts, 'vLLM ')} "
                f"({how}; if it is already running, this counts it twice)"
            )
        fix = f"{lower}, or " + fix
    where = f"host memory available, {procs} process(es)"
    detail = f"needs ≈{footprint.size(need)} of {footprint.size(host.available)} {where} ({shown}; an estimate)"
    return _budget("memory", need, host.available, detail, fix)


def _vllm_on_host(
    shape: footprint.Shape, parts: dict[str, int], vllm: footprint.Vllm, host_total: int
) -> tuple[dict[str, int], str, str] | Check:
    """vLLM's CPU build's terms, where its KV cache size comes from and how to lower it; or the row saying
    why vLLM would not start."""
    env = footprint.VLLM_CPU_KV_ENV
    value = os.environ.get(env)
    try:
        kv_space = footprint.cpu_kv_space(value)
    except ValueError:
        return Check(
            "memory",
            "fail",
            f"{env}={value!r} is not a whole number of GiB: vLLM's CPU build stops at start-up (ValueError)",
            f"{env}=<GiB> (vLLM's KV cache), e.g. {env}=4, or unset it",
        )
    if vllm.colocate:
        knob, used = "trainer.vllm_gpu_memory_utilization", vllm
    else:  # the server's own flag, not in this config: trl vllm-serve's default
        knob = "the server's --gpu_memory_utilization"
        used = footprint.Vllm(colocate=False, utilization=footprint.TRL_SERVE_UTILIZATION)
    vparts = footprint.vllm_cpu(shape, parts, used, host_total=host_total, kv_space=kv_space)
    kv = vparts["vLLM KV cache"]
    if kv_space is not None:
        if kv <= 0:
            return Check(
                "memory",
                "fail",
                f"{env}={value} leaves vLLM no KV cache: it stops with 'No available memory for the cache blocks'",
                f"{env}=<GiB>, e.g. {env}=4, or unset it",
            )
        return vparts, f"{env}={value}", f"lower {env} (vLLM's KV cache, GiB)"
    asked = math.ceil(host_total * used.utilization)
    default = "" if vllm.colocate else " (trl vllm-serve's default)"
    rule = f"{knob}={used.utilization:g}{default} x {footprint.size(host_total)} host memory = {footprint.size(asked)}"
    if kv <= 0:
        return Check(
            "memory",
            "fail",
            f"vLLM's CPU build would refuse to start: with {env} unset, its KV cache is {rule}, less the "
            f"{footprint.size(asked - kv)} its process holds by then (weights and framework): nothing left",
            f"set {env}=<GiB> (vLLM's KV cache on the CPU), or raise {knob}",
        )
    return (
        vparts,
        f"{env} unset, so vLLM's own rule: {rule}, less its process's RSS",
        f"set {env}=<GiB> or lower {knob}",
    )


def _disk_check(run: Any, args: Any, shape: footprint.Shape, cache_dir: Path) -> Check:
    from grpo_lab import models

    source = models.resolve_source(run.model.name_or_path)
    converted = source.cache_name is not None and (cache_dir / "models" / source.cache_name).is_dir()
    parts = footprint.disk(
        shape,
        download=source.kind == "hub" and not models.in_hf_cache(source.location),
        convert=source.kind == "package" and not converted,
        save_model=run.output.save_model,
        checkpoints=footprint.checkpoints_kept(args, run.max_steps),
    )
    need = sum(parts.values())
    free = shutil.disk_usage(_existing(Path("outputs"))).free
    shown = ", ".join(f"{k} {footprint.size(v)}" for k, v in parts.items() if v) or "nothing large"
    detail = f"needs ≈{footprint.size(need)} of {footprint.size(free)} free ({shown})"
    fix = "free some disk, set GRPO_LAB_CACHE elsewhere, or keep fewer checkpoints (trainer.save_total_limit)"
    return _budget("disk", need, free, detail, fix)


def _budget(name: str, need: float, free: float, detail: str, fix: str) -> Check:
    """fail above what is free, warn above 80% of it (estimates are rough), else ok."""
    if need > free:
        return Check(name, "fail", detail, fix)
    return Check(name, "warn", detail, fix) if need > 0.8 * free else Check(name, "ok", detail)


def _reason(error: Exception) -> str:
    return describe(error) or f"{type(error).__name__}: {one_line(error)}"


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


# ----------------------------------------------------------------------------------- Optuna storage
def storage_check(url: str | None, study_name: str | None) -> Check:
    """Can the sweep's storage be opened, and what does it hold? Opens nothing that does not exist yet."""
    from grpo_lab.config.sweep import DEFAULT_STORAGE
    from grpo_lab.sweep import storage as st

    url = url or DEFAULT_STORAGE
    shown = redact(url)
    file = st.storage_file(url)
    if file is not None and not file.exists():
        folder = _existing(file.parent)
        if folder.is_dir() and os.access(folder, os.W_OK):
            return Check("Optuna storage", "ok", f"{shown}: new, will be created by the first sweep")
        why = "is not writable" if folder.is_dir() else "is a file, not a folder"
        return Check("Optuna storage", "fail", f"{shown}: {folder} {why}", "hydra.sweeper.storage=<a writable path>")
    try:
        studies = st.study_sizes(url)
    except Exception as e:
        reason = _reason(e)
        return Check(
            "Optuna storage",
            "fail",
            f"{shown} cannot be opened: {redact(reason)}",
            "check the URL, the server and the password",
        )
    mine = f"; study {study_name!r} has {studies[study_name]} trials" if study_name in studies else ""
    return Check("Optuna storage", "ok", f"{shown}: {len(studies)} stud{'y' if len(studies) == 1 else 'ies'}{mine}")


# --------------------------------------------------------------------------------------------- output
_MARK = {"ok": "ok", "info": "info", "warn": "WARN", "fail": "FAIL"}


def render(rows: list[Check]) -> str:
    width = max(len(r.name) for r in rows)
    lines = [f"{r.name:<{width}}  {_MARK[r.status]:<4}  {r.detail}" for r in rows]
    fixes = [f"  {r.name}: {r.fix}" for r in rows if r.fix and r.status in ("warn", "fail")]
    if fixes:
        lines += ["", "To fix:", *fixes]
    blockers = [r.name for r in rows if r.status == "fail"]
    lines += ["", f"{len(blockers)} blocker(s): {', '.join(blockers)}" if blockers else "No blockers."]
    return "\n".join(lines)


def to_json(rows: list[Check]) -> str:
    blockers = [r.name for r in rows if r.status == "fail"]
    return json.dumps({"checks": [r.__dict__ for r in rows], "blockers": blockers, "ok": not blockers}, indent=2)
