"""TRL's, transformers' and peft's checks run right after composing: bad settings fail in one line, before W&B."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_lab import config
from grpo_lab.config import limits, rules, trl
from grpo_lab.config import trl_fields as grpo_fields
from grpo_lab.errors import ConfigError

from conftest import EXPERIMENTS, REPO, compose, one_line_naming, run_cli


def check(*overrides: str, num_processes: int = 1) -> None:
    run = config.parse(compose(["experiment=smoke", *overrides]))
    rules.check(rules.Checking(run, num_processes), rules.JOB)


# (overrides, the key the error names, its kind)
BAD = [
    # sampling: TRL accepts these, then generate() or the logits scaling fails (or cannot sample)
    (["trainer.temperature=-1"], "trainer.temperature", "range"),
    (["trainer.temperature=0"], "trainer.temperature", "range"),
    (["trainer.temperature=abc"], "trainer.temperature", "type"),
    (["trainer.top_p=1.5"], "trainer.top_p", "range"),
    (["trainer.top_p=0"], "trainer.top_p", "range"),
    (["trainer.top_k=-1"], "trainer.top_k", "range"),
    (["trainer.min_p=2"], "trainer.min_p", "range"),
    (["trainer.repetition_penalty=0"], "trainer.repetition_penalty", "range"),
    (["trainer.max_completion_length=-5"], "trainer.max_completion_length", "range"),
    (["trainer.max_completion_length=0"], "trainer.max_completion_length", "range"),
    # the loss
    (["trainer.num_iterations=0"], "trainer.num_iterations", "range"),
    (["trainer.epsilon=-0.1"], "trainer.epsilon", "range"),
    (["trainer.epsilon_high=0.1"], "trainer.epsilon_high", "range"),
    (["trainer.delta=0.5"], "trainer.delta", "range"),
    (["trainer.top_entropy_quantile=1.5"], "trainer.top_entropy_quantile", "range"),
    (["trainer.sapo_temperature_neg=0"], "trainer.sapo_temperature_neg", "range"),
    (["trainer.loss_type=nosuch"], "trainer.loss_type", "choice"),
    (["trainer.loss_type=5"], "trainer.loss_type", "choice"),
    (["trainer.scale_rewards=nosuch"], "trainer.scale_rewards", "choice"),
    (["trainer.importance_sampling_level=tokens"], "trainer.importance_sampling_level", "choice"),
    # batches and logging
    (["trainer.steps_per_generation=0"], "trainer.steps_per_generation", "range"),
    (["trainer.per_device_train_batch_size=0"], "trainer.per_device_train_batch_size", "range"),
    (["trainer.logging_steps=0"], "trainer.logging_steps", "range"),
    (["trainer.logging_steps=-1"], "trainer.logging_steps", "range"),
    (["trainer.logging_steps=2.5"], "trainer.logging_steps", "range"),
    (
        ["trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=3"],
        "trainer.per_device_eval_batch_size",
        "rule",
    ),
    # vLLM
    (["trainer.vllm_mode=nosuch"], "trainer.vllm_mode", "choice"),
    (["trainer.vllm_gpu_memory_utilization=1.5"], "trainer.vllm_gpu_memory_utilization", "range"),
    # LoRA (peft)
    (["model.lora.enabled=true", "model.lora.r=0"], "model.lora.r", "range"),
    (["model.lora.enabled=true", "model.lora.alpha=0"], "model.lora.alpha", "range"),
    (["model.lora.enabled=true", "model.lora.dropout=1.0"], "model.lora.dropout", "range"),
    # TRL's GRPOConfig itself: its field types and transformers' enums, then __post_init__
    (["trainer.save_steps=abc"], "trainer.save_steps", "type"),
    (["trainer.save_strategy=nosuch"], "trainer.save_strategy", "choice"),
    (["optimizer.optim=adamw_torh"], "optimizer.optim", "choice"),
    (
        ["trainer.vllm_importance_sampling_clip_min=2", "trainer.vllm_importance_sampling_clip_max=1"],
        "trainer.vllm_importance_sampling_clip_min",
        "rejected",
    ),
    # transformers' generation (GenerationConfig.validate and the logits processors generate() builds)
    (["trainer.generation_kwargs={temperature:-1}"], "trainer.generation_kwargs.temperature", "rejected"),
    (["trainer.generation_kwargs={top_k:-2}"], "trainer.generation_kwargs.top_k", "rejected"),
    (["trainer.cache_implementation=nosuch"], "trainer.cache_implementation", "rejected"),
]


@pytest.mark.parametrize(("overrides", "key", "kind"), BAD, ids=[" ".join(o) for o, _, _ in BAD])
def test_bad_setting_is_one_line_naming_its_key(overrides, key, kind):
    with pytest.raises(ConfigError) as info:
        check(*overrides)
    assert (info.value.key, info.value.kind) == (key, kind)
    one_line_naming(info.value, f"`{key}")


@pytest.mark.parametrize("metric", ["test_after/accuracy", "test_before/format", "test_change/accuracy"])
def test_an_objective_on_the_test_part_is_refused_naming_the_validation_metric(metric):
    """Test items report and never choose: every test_* metric is refused as the objective (and so as a sweep's
    objective and what its pruner reads), pointing at the validation metric of the same name."""
    with pytest.raises(ConfigError) as info:
        check(f"objective.metric={metric}")
    assert (info.value.key, info.value.kind) == ("objective.metric", "rule")
    one_line_naming(info.value, metric, "eval_" + metric.removeprefix("test_"), "never chooses")


@pytest.mark.parametrize(
    ("override", "nearest"),
    [
        ("trainer.loss_type=dr_grop", "dr_grpo"),
        ("trainer.scale_rewards=grup", "group"),
        ("trainer.importance_sampling_level=tokens", "token"),
        ("optimizer.optim=adamw_torh", "adamw_torch"),
    ],
)
def test_a_typo_in_a_choice_names_the_nearest(override, nearest):
    with pytest.raises(ConfigError) as info:
        config.load(compose(["experiment=smoke", override]))
    assert info.value.kind == "choice" and info.value.problems[0].near == nearest


def _trl_loss_types() -> list[str]:
    """The loss types the installed TRL names in its own GRPOConfig.loss_type help."""
    import trl

    help_text = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}["loss_type"].metadata["help"]
    return re.findall(r"'(\w+)'", help_text.split("Supported values are", 1)[1].split(".", 1)[0])


def test_every_loss_type_of_the_installed_trl_is_accepted_though_grpo_lab_names_none():
    source = "\n".join(p.read_text() for p in (REPO / "src" / "grpo_lab").rglob("*.py"))
    loss_types = _trl_loss_types()
    assert len(loss_types) >= 2
    for loss_type in loss_types:
        assert f'"{loss_type}"' not in source and f"'{loss_type}'" not in source, loss_type
        check(f"trainer.loss_type={loss_type}")


def test_a_loss_type_a_newer_trl_adds_is_accepted(monkeypatch):
    import trl

    trl_field = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}["loss_type"]
    help_text = trl_field.metadata["help"].replace("and 'vespo'.", "'vespo', and 'my_new_loss'.")

    @dataclasses.dataclass
    class NewerGRPOConfig(trl.GRPOConfig):
        loss_type: str = dataclasses.field(default=trl_field.default, metadata={"help": help_text})

    monkeypatch.setattr(grpo_fields, "grpo_config_fields", lambda: grpo_fields.from_class(NewerGRPOConfig))
    assert config.load(compose(["experiment=smoke", "trainer.loss_type=my_new_loss"])).trainer["loss_type"]
    with pytest.raises(ConfigError) as info:
        config.load(compose(["experiment=smoke", "trainer.loss_type=my_new_los"]))
    assert info.value.problems[0].near == "my_new_loss"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_use_vllm_without_vllm_fails_now():
    with pytest.raises(ConfigError) as info:
        check("trainer=grpo_vllm_colocate")
    assert (info.value.key, info.value.kind) == ("trainer.use_vllm", "rule")
    assert "make vllm" in str(info.value)  # the install command, for a CPU machine as for a GPU one


def test_eval_batch_counts_every_process():
    # 4 per device: fine in one process; fine with 2 (8 % 4); a group of 8 needs 2 processes.
    check("trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=4")
    with pytest.raises(ConfigError) as info:
        check("trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=4", "trainer.num_generations_eval=8")
    assert info.value.key == "trainer.per_device_eval_batch_size"
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
    config.load(compose([f"experiment={experiment}", *(["trainer.use_cpu=true"] if gpu else [])]), libraries=True)


def test_an_int_temperature_reaches_trl_as_a_float(tmp_path):
    run = config.load(compose(["experiment=smoke", "trainer.temperature=2", "trainer.repetition_penalty=1"]))
    args = config.grpo_config(run, output_dir=str(tmp_path), report_to=[], run_name=None)
    assert type(args.temperature) is float and type(args.repetition_penalty) is float


def test_the_check_leaves_no_trace():
    before = dict(os.environ)
    check()
    assert not Path(trl.UNUSED_DIR).exists()
    assert dict(os.environ) == before


def test_every_limit_names_a_real_setting():
    fields = grpo_fields.grpo_config_fields()
    lora = set(config.LoraConfig.model_fields)
    for key in limits.LIMITS:
        prefix, _, name = key.rpartition(".")
        assert (prefix == "trainer" and name in fields) or (prefix == "model.lora" and name in lora), key
    for name in limits.NAMED_CHOICES:
        assert limits.choices(fields[name]), name  # TRL's help still names the values


# ------------------------------------------------------------------------------ the real CLI, end to end
CLI = [
    (["trainer.temperature=-1"], "trainer.temperature", False),
    (["trainer.loss_type=dr_grop"], "trainer.loss_type", False),
    (["trainer.loss_typ=grpo"], "trainer.loss_typ", False),
    (["optimizer.optim=adamw_torh"], "optimizer.optim", False),
    # TRL's own GRPOConfig.__post_init__: needs the import, still before W&B and the model.
    (
        ["trainer.vllm_importance_sampling_clip_min=2", "trainer.vllm_importance_sampling_clip_max=1"],
        "trainer.vllm_importance_sampling_clip_min",
        True,
    ),
]


def _fails_early(overrides: list[str], key: str, tmp_path: Path, cache: Path) -> set[str]:
    """Run the CLI: one error line naming `key`, no W&B run, no model; the modules it imported."""
    proc = run_cli(["experiment=smoke", *overrides], tmp_path, cache, timeout=120, PYTHONPROFILEIMPORTTIME="1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("ERROR ")]
    one_line_naming(line, f"`{key}")
    assert not list(tmp_path.rglob("wandb")) and not list(tmp_path.rglob("*.wandb"))
    assert not (cache / "models").exists()
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(("overrides", "key", "imports_torch"), CLI, ids=[" ".join(o) for o, _, _ in CLI])
def test_cli_fails_before_wandb_and_model(overrides, key, imports_torch, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_LAB_CACHE", str(cache))
    grpo_fields.grpo_config_fields.cache_clear()
    grpo_fields.grpo_config_fields()  # TRL's field list in this cache, as any earlier run leaves it
    grpo_fields.grpo_config_fields.cache_clear()
    # grpo_lab's own checks fail before torch is imported (~1 s); TRL's __post_init__ needs it (~5 s).
    assert ("torch" in _fails_early(overrides, key, tmp_path, cache)) is imports_torch


def test_cli_with_no_cached_field_list_fails_the_same_way(tmp_path):
    # The first process to validate imports TRL to learn its fields (and leaves them in the cache).
    cache = tmp_path / "cache"
    _fails_early(["trainer.loss_type=dr_grop"], "trainer.loss_type", tmp_path, cache)
    assert list((cache / "trl").glob("*.json"))


# The next job's GRPOConfig, built in the process a colocated-vLLM job ran in, while another program holds the port
# TRL had picked for that job's vLLM rendezvous (two colocated grids on one machine; seen in CI as EADDRINUSE).
_NEXT_JOB = """
import contextlib, os, socket, sys
from trl import GRPOConfig
from trl.trainer.utils import ensure_master_addr_port
from grpo_lab.vllm_engine.sync import rendezvous_env_kept

with rendezvous_env_kept() if sys.argv[1] == "kept" else contextlib.nullcontext():
    # what TRL's VLLMGeneration sets for a colocated engine, with its own port choice
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    ensure_master_addr_port()
    port = int(os.environ["MASTER_PORT"])
try:
    held = socket.create_server(("127.0.0.1", port))
except OSError:  # another program took it first (the other arm, on the other xdist worker): the same hazard
    pass
GRPOConfig(output_dir=sys.argv[2], use_cpu=True, report_to=[])
import torch.distributed
print("distributed:", torch.distributed.is_initialized())
"""


@pytest.mark.parametrize("arm", ["kept", "left"])
def test_a_colocated_engines_rendezvous_variables_do_not_reach_the_next_job(tmp_path, arm):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-c", _NEXT_JOB, arm, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    if arm == "kept":  # grpo_lab's job: the next one starts as the one-process job it is
        assert proc.returncode == 0 and "distributed: False" in proc.stdout, proc.stderr[-3000:]
    else:  # the hazard itself, so this test would see it come back: a stale port, now someone else's
        assert proc.returncode != 0 and "EADDRINUSE" in proc.stderr, (proc.stdout, proc.stderr[-3000:])


def test_a_colocated_job_alone_in_its_process_rendezvous_on_a_port_the_os_picks(monkeypatch):
    """TRL picks the first free one of its fixed candidates (29500 first): two colocated jobs starting at once both
    took 29500 and one failed to bind it. grpo_lab hands a lone colocated job an OS-picked port, which TRL keeps,
    and takes it back after; a launcher's own port is left as it is."""
    from trl.trainer.utils import ensure_master_addr_port

    from grpo_lab.vllm_engine.sync import rendezvous_env_kept

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    picked = set()
    for _ in range(3):
        with rendezvous_env_kept(colocated=True):
            ensure_master_addr_port()  # what TRL's colocated engine calls
            picked.add(int(os.environ["MASTER_PORT"]))
        assert "MASTER_PORT" not in os.environ
    assert not picked & {29500, 23456, 12355, 12345} and len(picked) > 1, picked
    monkeypatch.setenv("MASTER_PORT", "29555")  # a launcher's (a DDP child's)
    with rendezvous_env_kept(colocated=True):
        ensure_master_addr_port()
        assert os.environ["MASTER_PORT"] == "29555"
    with rendezvous_env_kept(colocated=False):
        monkeypatch.delenv("MASTER_PORT")
    assert os.environ["MASTER_PORT"] == "29555"
