"""TRL's, transformers' and peft's checks run right after composing: bad settings fail in one line, before W&B."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from grpo_lab import config, trl_checks
from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import grpo_config_fields

from conftest import EXPERIMENTS, compose, run_cli


def check(*overrides: str, num_processes: int = 1) -> None:
    trl_checks.check(config.load(compose(["experiment=smoke", *overrides])), num_processes=num_processes)


# (overrides, what the one-line message must contain: the key and value, then what is allowed)
BAD = [
    # sampling: TRL accepts these, then generate() or the logits scaling fails (or cannot sample)
    (["trainer.temperature=-1"], "`trainer.temperature=-1`: must be a number > 0"),
    (["trainer.temperature=0"], "`trainer.temperature=0`: must be a number > 0"),
    (["trainer.temperature=abc"], "`trainer.temperature=abc`: must be a number > 0"),
    (["trainer.top_p=1.5"], "`trainer.top_p=1.5`: must be a number in (0, 1]"),
    (["trainer.top_p=0"], "`trainer.top_p=0`: must be a number in (0, 1]"),
    (["trainer.top_k=-1"], "`trainer.top_k=-1`: must be null or an integer >= 0"),
    (["trainer.min_p=2"], "`trainer.min_p=2`: must be null or a number in [0, 1]"),
    (["trainer.repetition_penalty=0"], "`trainer.repetition_penalty=0`: must be a number > 0"),
    (["trainer.max_completion_length=-5"], "`trainer.max_completion_length=-5`: must be an integer >= 1"),
    (["trainer.max_completion_length=0"], "`trainer.max_completion_length=0`: must be an integer >= 1"),
    # the loss
    (["trainer.num_iterations=0"], "`trainer.num_iterations=0`: must be an integer >= 1"),
    (["trainer.epsilon=-0.1"], "`trainer.epsilon=-0.1`: must be a number >= 0"),
    (["trainer.epsilon_high=0.1"], "`trainer.epsilon_high=0.1`: must be >= trainer.epsilon=0.2"),
    (["trainer.delta=0.5"], "`trainer.delta=0.5`: must be null or a number > 1"),
    (["trainer.top_entropy_quantile=1.5"], "`trainer.top_entropy_quantile=1.5`: must be a number in [0, 1]"),
    (["trainer.sapo_temperature_neg=0"], "`trainer.sapo_temperature_neg=0`: must be a number > 0"),
    (["trainer.loss_type=nosuch"], "`trainer.loss_type=nosuch`: must be one of grpo, dr_grpo, dapo, bnpo, cispo"),
    (["trainer.loss_type=dr_grop"], "Did you mean `dr_grpo`?"),
    (["trainer.scale_rewards=nosuch"], "`trainer.scale_rewards=nosuch`: must be one of group, batch, none"),
    (["trainer.scale_rewards=grup"], "Did you mean `group`?"),
    (["trainer.importance_sampling_level=tokens"], "must be one of token, sequence. Did you mean `token`?"),
    # batches and logging
    (["trainer.steps_per_generation=0"], "`trainer.steps_per_generation=0`: must be null or an integer >= 1"),
    (["trainer.per_device_train_batch_size=0"], "`trainer.per_device_train_batch_size=0`: must be an integer >= 1"),
    (["trainer.logging_steps=0"], "`trainer.logging_steps=0`: must be a whole number >= 1"),
    (["trainer.logging_steps=-1"], "`trainer.logging_steps=-1`: must be a whole number >= 1"),
    (["trainer.logging_steps=2.5"], "`trainer.logging_steps=2.5`: must be a whole number >= 1"),
    (
        ["trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=3"],
        "`trainer.per_device_eval_batch_size=3`: 3 x 1 process(es) must be a multiple",
    ),
    # vLLM
    (["trainer.vllm_mode=nosuch"], "`trainer.vllm_mode=nosuch`: must be one of colocate, server"),
    (["trainer.vllm_gpu_memory_utilization=1.5"], "`trainer.vllm_gpu_memory_utilization=1.5`: must be a number in"),
    # LoRA (peft)
    (["model.lora.enabled=true", "model.lora.r=0"], "`model.lora.r=0`: must be an integer >= 1"),
    (["model.lora.enabled=true", "model.lora.alpha=0"], "`model.lora.alpha=0`: must be a number > 0"),
    (["model.lora.enabled=true", "model.lora.dropout=1.0"], "`model.lora.dropout=1.0`: must be a number in [0, 1)"),
    # TRL's GRPOConfig itself (field types, transformers' enums, __post_init__)
    (["trainer.save_steps=abc"], "`trainer.save_steps=abc`: must be float"),
    (["trainer.save_strategy=nosuch"], "`trainer.save_strategy=nosuch`: must be one of no, steps, epoch, best"),
    (["optimizer.optim=adamw_torh"], "`optimizer.optim=adamw_torh`: must be one of adamw_torch"),
    (["optimizer.optim=adamw_torh"], "Did you mean `adamw_torch`?"),
    (
        ["trainer.vllm_importance_sampling_clip_min=2", "trainer.vllm_importance_sampling_clip_max=1"],
        "`trainer.vllm_importance_sampling_clip_min=2`: TRL",
    ),
    # transformers' generation (GenerationConfig.validate and the logits processors generate() builds)
    (["trainer.generation_kwargs={temperature:-1}"], "`trainer.generation_kwargs.temperature=-1`: transformers'"),
    (["trainer.generation_kwargs={top_k:-2}"], "`trainer.generation_kwargs.top_k=-2`: transformers'"),
    (["trainer.cache_implementation=nosuch"], "`trainer.cache_implementation=nosuch`: transformers'"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_setting_is_one_line_naming_key_value_and_allowed(overrides, expected):
    with pytest.raises(ConfigError) as info:
        check(*overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_use_vllm_without_vllm_fails_now():
    with pytest.raises(ConfigError, match=r"`trainer.use_vllm=true`: needs the `vllm` package"):
        check("trainer=grpo_vllm_colocate")


def test_eval_batch_counts_every_process():
    # 4 per device: fine in one process; fine with 2 (8 % 4); a group of 8 needs 2 processes.
    check("trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=4")
    with pytest.raises(ConfigError, match="4 x 1 process"):
        check("trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=4", "trainer.num_generations_eval=8")
    check(
        "trainer.eval_strategy=steps",
        "trainer.per_device_eval_batch_size=4",
        "trainer.num_generations_eval=8",
        num_processes=2,
    )


GOOD = [
    [],
    ["trainer.temperature=2"],  # an int: passed on as 2.0 (transformers' warper refuses an int)
    ["trainer.temperature=0.7", "trainer.top_p=0.9", "trainer.top_k=50", "trainer.min_p=0.05"],
    ["trainer.top_k=0"],
    ["trainer.top_k=null"],
    ["trainer.repetition_penalty=1.1"],
    ["trainer.scale_rewards=false"],  # TRL maps True/False to group/none
    ["trainer.scale_rewards=batch", "trainer.loss_type=dr_grpo"],
    ["trainer.logging_steps=0.5"],
    ["trainer.epsilon_high=0.28", "trainer.delta=1.5", "trainer.num_iterations=2"],
    ["trainer.steps_per_generation=2"],
    ["model.lora.enabled=true"],
]


@pytest.mark.parametrize("overrides", GOOD, ids=[" ".join(o) or "smoke" for o in GOOD])
def test_valid_settings_pass(overrides):
    check(*overrides)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_shipped_experiment_passes(experiment):
    # GPU presets (bf16) are checked with use_cpu, which is how TRL accepts bf16 on a CPU.
    gpu = compose([f"experiment={experiment}"]).trainer.get("bf16", False)
    run = config.load(compose([f"experiment={experiment}", *(["trainer.use_cpu=true"] if gpu else [])]))
    trl_checks.check(run, num_processes=run.launcher.num_processes)


def test_an_int_temperature_reaches_trl_as_a_float(tmp_path):
    run = config.load(compose(["experiment=smoke", "trainer.temperature=2", "trainer.repetition_penalty=1"]))
    args = config.to_grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert type(args.temperature) is float and type(args.repetition_penalty) is float


def test_the_check_leaves_no_trace():
    before = dict(os.environ)
    check()
    assert not Path(trl_checks._UNUSED_DIR).exists()
    assert dict(os.environ) == before


def test_every_rule_names_a_real_setting():
    fields = grpo_config_fields()
    lora = set(config.LoraConfig.model_fields)
    for rule in trl_checks.RULES:
        prefix, _, name = rule.key.rpartition(".")
        assert (prefix == "trainer" and name in fields) or (prefix == "model.lora" and name in lora), rule.key


def test_every_choice_is_a_value_trl_handles():
    """The choices are TRL 1.16's; a release that renames one fails here rather than in a user's run."""
    trl_dir = Path(importlib.util.find_spec("trl").origin).parent
    source = "".join((trl_dir / "trainer" / name).read_text() for name in ("grpo_trainer.py", "grpo_config.py"))
    for rule in trl_checks.RULES:
        for choice in rule.choices:
            if isinstance(choice, str):
                assert re.search(rf"[\"']{choice}[\"']", source), (rule.key, choice)


# ------------------------------------------------------------------------------ the real CLI, end to end
CLI = [
    (["trainer.temperature=-1"], "`trainer.temperature=-1`: must be a number > 0", False),
    (["trainer.loss_type=dr_grop"], "`trainer.loss_type=dr_grop`: must be one of", False),
    (["trainer.max_completion_length=-5"], "`trainer.max_completion_length=-5`: must be an integer >= 1", False),
    # Caught by TRL's own GRPOConfig: needs the import, still before W&B and the model.
    (["optimizer.optim=adamw_torh"], "Did you mean `adamw_torch`?", True),
]


@pytest.mark.parametrize(("overrides", "expected", "imports_torch"), CLI, ids=[" ".join(o) for o, _, _ in CLI])
def test_cli_fails_before_wandb_and_model(overrides, expected, imports_torch, tmp_path):
    cache = tmp_path / "cache"
    proc = run_cli(["experiment=smoke", *overrides], tmp_path, cache, timeout=120, PYTHONPROFILEIMPORTTIME="1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("wandb")) and not list(tmp_path.rglob("*.wandb"))
    assert not (cache / "models").exists()
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    # Our own rules fail before torch is imported (~1 s); TRL's checks need it (~5 s).
    assert ("torch" in imported) is imports_torch
