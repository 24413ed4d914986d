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
        "KV cache": batch.generation * tokens * shape.layers * 2 * shape.kv_width * act,
        "activations": int(activations),
        "logits": batch.train * batch.completion_tokens * shape.vocab * 4 * _LOGIT_COPIES,
        "framework": _FRAMEWORK,
    }


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
