"""How much memory and disk a run will take, estimated from the model's shape and the run's batch.

The model is built on torch's meta device from its config (no weights are read), so the parameter count
is exact; the memory terms are the usual first-order ones and are labelled estimates:

- weights (and a second copy for the reference model when beta > 0 and the model is not a LoRA adapter:
  TRL then drops it, or disables the adapter instead);
- gradients and AdamW's two moments for the trainable parameters (1 byte each for 8-bit optimizers);
- the KV cache while sampling the generation batch (prompt + completion tokens);
- activations kept for the backward pass, ~34 bytes x hidden per token and layer at 16 bits
  (Korthikanti et al., 2022), or one per layer with gradient checkpointing;
- the completion logits over the vocabulary in fp32 (logits, log-softmax, their gradient);
- a fixed allowance for the framework itself (CUDA context, or the Python process on a CPU).

When vLLM generates (`trainer.use_vllm=true`), the training process samples nothing itself (no KV cache term)
and vLLM's own memory is counted apart (`Vllm`, `vllm_gpu`, `vllm_cpu`, `peak`), from the rules of vLLM 0.31
as TRL 1.16 starts it (`LLM(gpu_memory_utilization=vllm_gpu_memory_utilization, ...)`, dtype left to vLLM):

- on a GPU, colocated: vLLM reserves `ceil(vllm_gpu_memory_utilization x the GPU's total memory)` on each
  training GPU (its weights copy and KV cache live inside that slice), on top of the training footprint
  (vllm/v1/worker/utils.py, request_memory); with `vllm_enable_sleep_mode` that slice is freed while training
  steps, so it only has to fit beside what stays resident (weights, reference model, gradients, optimizer);
- on a GPU, as a server (`vllm_mode=server`): on its own GPUs, nothing on the training ones;
- on vLLM's CPU build, in host memory: a second copy of the weights (16-bit: vLLM's dtype "auto" downcasts
  float32 checkpoints to bfloat16), split over tensor-parallel ranks, and a KV cache of
  `VLLM_CPU_KVCACHE_SPACE` GiB when that variable is set (vllm/platforms/cpu.py). Unset or empty, vLLM sizes
  it itself: `ceil(gpu_memory_utilization x the memory node's total) - the process's RSS` when vLLM starts
  (vllm/v1/worker/cpu_worker.py; <= 0 and vLLM refuses to start). Colocated, vLLM lives in each training
  process, whose RSS then holds the framework, the weights, the reference model and vLLM's weights; a server
  on the same host is one more process on the same memory. Sleep mode does nothing on the CPU build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_FRAMEWORK = int(0.6 * GiB)  # measured: a bare TRL process on the CPU peaks at ~530 MiB with a tiny model
_ACTIVATION_BYTES_PER_HIDDEN = 34  # per token, layer and hidden unit at 16 bits (Korthikanti et al.)
_LOGIT_COPIES = 3  # logits, their log-softmax and the gradient flowing back, fp32
_VLLM_WEIGHT_BYTES = 2  # vLLM's dtype "auto": the checkpoint's 16-bit dtype, float32 downcast to bfloat16
VLLM_CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's CPU build: its KV cache in GiB (an integer)
TRL_SERVE_UTILIZATION = 0.9  # `trl vllm-serve --gpu_memory_utilization`'s default (not in the run's config)


@dataclass(frozen=True)
class Shape:
    params: int
    trainable: int
    layers: int
    hidden: int
    kv_width: int  # key/value width per layer: kv heads x head size
    vocab: int
    param_bytes: int  # bytes per parameter as loaded (model.dtype)
    file_bytes: int  # bytes per parameter of the checkpoint as published (its config's dtype)


@dataclass(frozen=True)
class Batch:
    generation: int  # sequences sampled at once per process (TRL's generation batch)
    train: int  # sequences per forward/backward (per_device_train_batch_size)
    prompt_tokens: int
    completion_tokens: int
    activation_bytes: int  # 2 with bf16/fp16 training, else the parameters' bytes
    gradient_checkpointing: bool
    reference_model: bool
    optimizer_state_bytes: int  # per trainable parameter, both moments together
    vllm_generates: bool = False  # vLLM samples the completions: no KV cache in the training process


@dataclass(frozen=True)
class Vllm:
    """How a run generates with vLLM: TRL's GRPOConfig `vllm_*` fields."""

    colocate: bool  # vllm_mode=colocate: inside each training process; else a separate server
    utilization: float  # the fraction of the device's memory vLLM takes (vllm_gpu_memory_utilization)
    tensor_parallel: int = 1  # vllm_tensor_parallel_size (colocated: the weights are split over its ranks)
    sleep: bool = False  # vllm_enable_sleep_mode: weights and KV cache freed while training steps (GPU only)


def dtype_bytes(name: Any, default: int = 4) -> int:
    return _DTYPE_BYTES.get(str(name).removeprefix("torch."), default)


def model_shape(arch: Any, *, dtype: str, lora: Any) -> Shape:
    """Count the parameters of a model built from `arch` (a transformers config) on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(arch)
    params = sum(p.numel() for p in model.parameters())
    text = arch.get_text_config() if hasattr(arch, "get_text_config") else arch
    hidden = int(text.hidden_size)
    heads = int(getattr(text, "num_attention_heads", 1))
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    published = getattr(arch, "dtype", None) or getattr(arch, "torch_dtype", None)
    return Shape(
        params=params,
        trainable=lora_parameters(model, lora) if lora.enabled else params,
        layers=int(text.num_hidden_layers),
        hidden=hidden,
        kv_width=kv_heads * head_dim,
        vocab=int(text.vocab_size),
        param_bytes=dtype_bytes(published if dtype == "auto" else dtype),
        file_bytes=dtype_bytes(published),
    )


def lora_parameters(model: Any, lora: Any) -> int:
    """r x (in + out) per adapted linear layer: peft's count for `target_modules` (all-linear skips the head)."""
    import torch

    targets = lora.target_modules
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        chosen = leaf != "lm_head" if targets == "all-linear" else leaf in targets
        if chosen:
            count += lora.r * (module.in_features + module.out_features)
    return count


def memory(shape: Shape, batch: Batch) -> dict[str, int]:
    """Bytes per process, term by term (the module docstring says what each is)."""
    tokens = batch.prompt_tokens + batch.completion_tokens
    act = batch.activation_bytes
    per_layer = _ACTIVATION_BYTES_PER_HIDDEN * shape.hidden * act / 2
    if batch.gradient_checkpointing:  # the layer inputs, plus one layer recomputed at a time
        activations = batch.train * tokens * shape.hidden * act * shape.layers + batch.train * tokens * per_layer
    else:
        activations = batch.train * tokens * per_layer * shape.layers
    weights = shape.params * shape.param_bytes
    return {
        "weights": weights,
        "reference model": weights if batch.reference_model else 0,
        "gradients": shape.trainable * shape.param_bytes,
        "optimizer": shape.trainable * batch.optimizer_state_bytes,
        "KV cache": 0 if batch.vllm_generates else batch.generation * tokens * shape.layers * 2 * shape.kv_width * act,
        "activations": int(activations),
        "logits": batch.train * batch.completion_tokens * shape.vocab * 4 * _LOGIT_COPIES,
        "framework": _FRAMEWORK,
    }


def vllm_gpu(vllm: Vllm, gpu_total: int) -> int:
    """vLLM's share of one training GPU: colocated, its slice of the GPU's memory; a server, nothing."""
    return math.ceil(gpu_total * vllm.utilization) if vllm.colocate else 0


def cpu_kv_space(value: str | None) -> int | None:
    """`VLLM_CPU_KVCACHE_SPACE` in bytes, None when unset or empty (vLLM then sizes the KV cache itself).

    Raises ValueError for what vLLM's own `int(...)` refuses (it stops at start-up the same way)."""
    if value is None or value == "":
        return None
    return int(value) * GiB


def vllm_cpu(
    shape: Shape, training: dict[str, int], vllm: Vllm, *, host_total: int, kv_space: int | None
) -> dict[str, int]:
    """vLLM's CPU build in host memory, term by term: per training process when colocated, once for a server.

    `training`: memory()'s terms; `host_total`: the memory node's total bytes; `kv_space`: cpu_kv_space().
    The KV cache term is <= 0 when vLLM's own sizing leaves nothing (it then refuses to start)."""
    weights = math.ceil(shape.params * _VLLM_WEIGHT_BYTES / max(1, vllm.tensor_parallel))
    if vllm.colocate:  # the training process's RSS when TRL starts vLLM in it (no optimizer yet)
        parts = {"vLLM weights": weights}
        held = training["framework"] + training["weights"] + training["reference model"] + weights
    else:  # its own process
        parts = {"vLLM framework": _FRAMEWORK, "vLLM weights": weights}
        held = _FRAMEWORK + weights
    auto = math.ceil(host_total * vllm.utilization) - held
    parts["vLLM KV cache"] = kv_space if kv_space is not None else auto
    return parts


def peak(training: dict[str, int], vllm_parts: dict[str, int], *, sleep: bool = False) -> int:
    """Bytes at the peak: both together, or with sleep mode (on a GPU) the larger of the training step
    (vLLM asleep) and generation (vLLM awake beside the weights, reference model, gradients and optimizer)."""
    train, both = sum(training.values()), sum(training.values()) + sum(vllm_parts.values())
    if not sleep:
        return both
    return max(train, both - training["activations"] - training["logits"])


def optimizer_state_bytes(optim: str, param_bytes: int) -> int:
    name = optim.lower()
    if "8bit" in name:
        return 2
    if name.startswith("sgd"):
        return param_bytes  # momentum only
    if "adafactor" in name:
        return 0  # factored second moments: a few rows and columns per matrix
    return 2 * param_bytes


def disk(shape: Shape, *, download: bool, convert: bool, save_model: bool, checkpoints: int) -> dict[str, int]:
    """Bytes a run writes: the model download or conversion, the final save, the kept checkpoints."""
    saved = shape.trainable * shape.param_bytes  # a LoRA run saves its adapter only
    return {
        "model download": shape.params * shape.file_bytes if download else 0,
        "model conversion": shape.params * 4 if convert else 0,
        "final model": saved if save_model else 0,
        "checkpoints": checkpoints * (saved + shape.trainable * 2 * shape.param_bytes),
    }


def checkpoints_kept(args: Any, max_steps: int) -> int:
    """How many checkpoints GRPOConfig `args` keeps on disk at once."""
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    if strategy == "no":
        return 0
    steps = args.save_steps if strategy == "steps" else max_steps
    every = steps if steps >= 1 else max(1, math.ceil(steps * max_steps))  # a float < 1 is a fraction
    written = max(1, max_steps // max(1, int(every)))
    return min(written, args.save_total_limit) if args.save_total_limit else written


def size(n: float) -> str:
    """Bytes for a reader: 512 MiB, 1.25 GiB, 80 GiB."""
    if n < GiB:
        return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"
    return f"{n / GiB:.2f} GiB" if n < 10 * GiB else f"{n / GiB:.0f} GiB"
