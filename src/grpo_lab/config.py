"""Typed run configuration: the one boundary between Hydra's DictConfig and the rest of grpo_lab.

``load(cfg)`` turns the composed config into frozen dataclasses and rejects, before any model is loaded:
unknown keys (naming the nearest valid one), wrong types, out-of-range values and batch shapes that
TRL's divisibility rule refuses. Past this module no code calls ``cfg.get``.

Defaults live in YAML (``conf/``), never here: every field below is required, so a preset that forgets
one fails loudly instead of silently picking a value. TRL's own defaults stay TRL's: ``trainer`` holds
only the GRPOConfig fields our YAML or the user sets.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import grpo_config_fields, trl_default, trl_version


# --------------------------------------------------------------------------------------------- schema
@dataclass(frozen=True)
class LoraConfig:
    enabled: bool
    r: int
    alpha: int
    dropout: float
    target_modules: str | list[str]


@dataclass(frozen=True)
class ModelConfig:
    # builtin:<name>, package:<pkg>/<file>.gguf, a local dir or .gguf file, or a Hugging Face Hub id.
    name_or_path: str
    dtype: Literal["float32", "bfloat16", "float16", "auto"]
    attn_implementation: str | None
    gradient_checkpointing: bool
    trust_remote_code: bool
    lora: LoraConfig


@dataclass(frozen=True)
class _DataBase:
    system_prompt: str
    # Worked examples put before the question as earlier user/assistant turns.
    num_shots: int
    train_size: int | None
    eval_size: int | None
    # Seeds the data (generation, shuffling, train/eval split) separately from training, so that a
    # sweep over `seed` keeps the same prompts.
    seed: int


@dataclass(frozen=True)
class ArithmeticData(_DataBase):
    kind: Literal["arithmetic"]
    max_number: int
    operations: list[str]


@dataclass(frozen=True)
class Gsm8kData(_DataBase):
    kind: Literal["gsm8k"]
    hub_id: str
    hub_config: str
    path: str | None
    eval_path: str | None
    eval_fraction: float


@dataclass(frozen=True)
class JsonlData(_DataBase):
    kind: Literal["jsonl"]
    path: str
    eval_path: str | None
    eval_fraction: float


DataConfig = Union[ArithmeticData, Gsm8kData, JsonlData]  # noqa: UP007 (runtime union used for dispatch)
_DATA_KINDS: dict[str, type] = {"arithmetic": ArithmeticData, "gsm8k": Gsm8kData, "jsonl": JsonlData}


@dataclass(frozen=True)
class RewardFunction:
    # Dotted path of a callable `(completions, **kwargs) -> list[float | None]`.
    target: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class RewardConfig:
    # Ordered name -> function; the name is the W&B key (`rewards/<name>/mean`).
    functions: dict[str, RewardFunction]
    weights: dict[str, float]

    def ordered_weights(self) -> list[float]:
        """TRL's `reward_weights`: one weight per function, in the functions' order."""
        return [self.weights[name] for name in self.functions]


@dataclass(frozen=True)
class OptimizerConfig:
    optim: str
    weight_decay: float
    warmup_ratio: float
    scheduler: Literal["cosine", "constant", "linear", "constant_with_warmup", "cosine_with_restarts"]
    max_grad_norm: float
    gradient_accumulation_steps: int


@dataclass(frozen=True)
class EvalConfig:
    before: bool
    after: bool
    # Also evaluate every N training steps (for curves and for pruning sweep trials); null = never.
    every_n_steps: int | None
    max_new_tokens: int
    batch_size: int


@dataclass(frozen=True)
class ObjectiveConfig:
    metric: str
    direction: Literal["maximize", "minimize"]


@dataclass(frozen=True)
class LoggerConfig:
    backend: Literal["wandb", "none"]
    # auto: online when logged in (WANDB_API_KEY or netrc), else offline.
    mode: Literal["auto", "online", "offline", "disabled"]
    project: str
    entity: str | None
    group: str | None
    name: str | None
    job_type: str
    tags: list[str]
    # W&B's own console blocks (run history and summary, "Find logs at"): off, our run summary says it all.
    quiet: bool


@dataclass(frozen=True)
class LauncherConfig:
    # local: train in the Hydra job; accelerate: `accelerate launch` children run the resolved config.
    kind: Literal["local", "accelerate"]
    num_processes: int
    config_file: str | None
    gpus_per_job: int | None
    main_process_port: int | None
    extra_args: list[str]


@dataclass(frozen=True)
class OutputConfig:
    save_model: bool


@dataclass(frozen=True)
class TrialConfig:
    """Set by the Optuna sweeper for a trial's job: where to report intermediate values."""

    study: str
    storage: str
    number: int
    id: int
    # The sweep's pruner settings (hydra.sweeper.pruner); null: this trial is not pruned.
    pruner: dict[str, Any] | None


@dataclass(frozen=True)
class RunConfig:
    name: str
    lr: float
    beta: float
    num_generations: int
    seed: int
    max_steps: int
    model: ModelConfig
    data: DataConfig
    reward: RewardConfig
    optimizer: OptimizerConfig
    trainer: dict[str, Any]
    eval: EvalConfig
    objective: ObjectiveConfig
    logger: LoggerConfig
    launcher: LauncherConfig
    output: OutputConfig
    trial: TrialConfig | None
    # A run folder to continue from its last trainer/checkpoint-* (see conf/config.yaml).
    resume: str | None


# Keys that users of other libraries type, mapped onto ours.
_ALIASES = {
    "kl_coeff": "beta",
    "kl_coef": "beta",
    "kl_coefficient": "beta",
    "init_kl_coef": "beta",
    "learning_rate": "lr",
    "num_generation": "num_generations",
    "group_size": "num_generations",
    "steps": "max_steps",
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
}
# GRPOConfig fields that grpo_lab sets from elsewhere: one place per setting.
_OWNED_TRAINER_FIELDS = {
    "learning_rate": "the top-level `lr`",
    "beta": "the top-level `beta`",
    "num_generations": "the top-level `num_generations`",
    "seed": "the top-level `seed`",
    "max_steps": "the top-level `max_steps`",
    "optim": "`optimizer.optim`",
    "weight_decay": "`optimizer.weight_decay`",
    "warmup_steps": "`optimizer.warmup_ratio`",
    "lr_scheduler_type": "`optimizer.scheduler`",
    "max_grad_norm": "`optimizer.max_grad_norm`",
    "gradient_accumulation_steps": "`optimizer.gradient_accumulation_steps`",
    "gradient_checkpointing": "`model.gradient_checkpointing`",
    "activation_checkpointing": "`model.gradient_checkpointing`",
    "reward_weights": "`reward.weights.<name>`",
    "output_dir": "the run folder (Hydra's `hydra.run.dir`)",
    "run_name": "`logger.name`",
    "report_to": "the logger group (`logger=wandb` or `logger=none`)",
}
# Names from PPO or older TRL releases that are not GRPO settings at all.
_NOT_GRPO = {
    "use_score_scaling",
    "use_score_norm",
    "score_clip",
    "ppo_epochs",
    "mini_batch_size",
    "kl_coeff",
    "kl_coef",
    "kl_penalty",
    "init_kl_coef",
    "adap_kl_ctrl",
    "target_kl",
    "vf_coef",
    "cliprange",
    "cliprange_value",
    "gamma",
    "lam",
    "whiten_rewards",
    "max_prompt_length",
}


# ------------------------------------------------------------------------------------------ converting
def _nearest(key: str, candidates: typing.Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unknown_key(path: str, key: str, valid: list[str]) -> ConfigError:
    full = f"{path}.{key}" if path else key
    alias = _ALIASES.get(key)
    if alias in valid:
        hint = f"Did you mean `{_join(path, alias)}`? (`{alias}` is TRL's / grpo_lab's name for it.)"
    elif (near := _nearest(key, valid)) is not None:
        hint = f"Did you mean `{_join(path, near)}`?"
    else:
        hint = f"Valid keys here: {', '.join(sorted(valid))}."
    return ConfigError(f"Unknown config key `{full}`. {hint}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return str(tp).replace("typing.", "")
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        schema = [a for a in args if dataclasses.is_dataclass(a)]
        if isinstance(value, Mapping) and len(schema) == 1:
            return _convert_dataclass(value, schema[0], path)  # its errors name the exact key
        for arg in args:
            try:
                return _convert(value, arg, path)
            except ConfigError:
                pass
        raise ConfigError(f"`{path}` must be {_type_name(tp)}, got {value!r}.")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            near = _nearest(str(value), [str(c) for c in choices])
            tip = f" Did you mean {near!r}?" if near else ""
            raise ConfigError(f"`{path}` must be one of {', '.join(map(repr, choices))}, got {value!r}.{tip}")
        return value
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"`{path}` must be null, got {value!r}.")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{path}` must be true or false, got {value!r}.")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{path}` must be an integer, got {value!r}.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"`{path}` must be a number, got {value!r} (e.g. `{path}=1e-5`).")
        if not math.isfinite(value):
            raise ConfigError(f"`{path}` must be a finite number, got {value!r}.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{path}` must be a string, got {value!r}.")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"`{path}` must be a list, got {value!r}.")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"`{path}` must be a mapping, got {value!r}.")
        _, item = typing.get_args(tp)
        return {str(k): _convert(v, item, _join(path, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(value, tp, path)
    raise TypeError(f"unsupported schema type {tp!r} at {path}")  # a bug in the schema, not user input


def _convert_dataclass(value: Any, cls: type, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"`{path or 'config'}` must be a mapping, got {value!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in value:
        if key not in names:
            raise _unknown_key(path, str(key), names)
    missing = [n for n in names if n not in value]
    if missing:
        keys = ", ".join(f"`{_join(path, m)}`" for m in missing)
        raise ConfigError(f"Missing config key(s) {keys}: every key needs a value in conf/ (YAML holds the defaults).")
    return cls(**{n: _convert(value[n], hints[n], _join(path, n)) for n in names})


def _convert_data(value: Any, path: str) -> Any:
    if not isinstance(value, Mapping) or "kind" not in value:
        raise ConfigError(f"`{path}` must be a mapping with a `kind` ({', '.join(_DATA_KINDS)}).")
    kind = value["kind"]
    if kind not in _DATA_KINDS:
        near = _nearest(str(kind), _DATA_KINDS)
        tip = f" Did you mean {near!r}?" if near else ""
        raise ConfigError(f"`{path}.kind` must be one of {', '.join(_DATA_KINDS)}, got {kind!r}.{tip}")
    return _convert_dataclass(value, _DATA_KINDS[kind], path)


def _convert_reward(value: Any) -> RewardConfig:
    if not isinstance(value, Mapping):
        raise ConfigError("`reward` must be a mapping with `functions` and `weights`.")
    for key in value:
        if key not in ("functions", "weights"):
            raise _unknown_key("reward", str(key), ["functions", "weights"])
    functions: dict[str, RewardFunction] = {}
    raw_functions = value.get("functions") or {}
    if not isinstance(raw_functions, Mapping) or not raw_functions:
        raise ConfigError("`reward.functions` must name at least one reward function (e.g. `reward=gsm8k`).")
    for name, spec in raw_functions.items():
        where = f"reward.functions.{name}"
        if not isinstance(spec, Mapping) or "_target_" not in spec:
            raise ConfigError(
                f"`{where}` must be a mapping with a `_target_` (dotted path of the function), got {spec!r}."
            )
        target = spec["_target_"]
        if not isinstance(target, str) or not target:
            raise ConfigError(
                f"`{where}._target_` must be a built-in reward name or a dotted path like `my_pkg.rewards.fn`, "
                f"got {target!r}."
            )
        kwargs = {str(k): v for k, v in spec.items() if k != "_target_"}
        functions[str(name)] = RewardFunction(target=target, kwargs=kwargs)
    raw_weights = value.get("weights") or {}
    if not isinstance(raw_weights, Mapping):
        raise ConfigError(f"`reward.weights` must map reward names to numbers, got {raw_weights!r}.")
    weights: dict[str, float] = {}
    for name, weight in raw_weights.items():
        if name not in functions:
            raise _unknown_key("reward.weights", str(name), list(functions))
        weights[str(name)] = _convert(weight, float, f"reward.weights.{name}")
    missing = [n for n in functions if n not in weights]
    if missing:
        raise ConfigError(
            "Every reward needs a weight; missing: "
            + ", ".join(f"`reward.weights.{n}`" for n in missing)
            + " (add e.g. `+reward.weights.NAME=1.0`)."
        )
    return RewardConfig(functions=functions, weights=weights)


def _check_trainer_keys(trainer: Mapping[str, Any]) -> dict[str, Any]:
    fields = grpo_config_fields()
    for key in trainer:
        if key in _OWNED_TRAINER_FIELDS:
            raise ConfigError(
                f"`trainer.{key}` is set through {_OWNED_TRAINER_FIELDS[key]} in grpo_lab; set it there instead."
            )
        if key in _NOT_GRPO and key not in fields:
            owner = _ALIASES.get(key)
            tip = f" Use {_OWNED_TRAINER_FIELDS[owner]} instead." if owner in _OWNED_TRAINER_FIELDS else ""
            raise ConfigError(
                f"`trainer.{key}` is not a GRPO setting: TRL {trl_version()}'s GRPOConfig has no `{key}` "
                f"(it comes from PPO or an older TRL).{tip}"
            )
        if key not in fields:
            raise _unknown_key("trainer", str(key), list(fields))
    return dict(trainer)


# ------------------------------------------------------------------------------------------ checking
def _positive(value: float, path: str, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"`{path}` must be {bound}, got {value}.")


def _trainer_value(run: RunConfig, name: str) -> Any:
    return run.trainer[name] if name in run.trainer else trl_default(name)


def check_batch_shape(run: RunConfig, num_processes: int) -> None:
    """TRL's rule, in our words: each generation batch must hold whole groups of completions."""
    per_device = _trainer_value(run, "per_device_train_batch_size")
    steps_per_gen = run.trainer.get("steps_per_generation")
    gen_batch = run.trainer.get("generation_batch_size")
    g = run.num_generations
    if gen_batch is not None and steps_per_gen is not None:
        raise ConfigError("Set `trainer.generation_batch_size` or `trainer.steps_per_generation`, not both.")
    if gen_batch is None:
        steps = steps_per_gen if steps_per_gen is not None else run.optimizer.gradient_accumulation_steps
        gen_batch = per_device * num_processes * steps
        how = (
            f"per_device_train_batch_size {per_device} x {num_processes} process(es) x "
            f"{'steps_per_generation' if steps_per_gen is not None else 'gradient_accumulation_steps'} {steps}"
        )
    else:
        how = "trainer.generation_batch_size"
        if gen_batch % (per_device * num_processes):
            raise ConfigError(
                f"`trainer.generation_batch_size={gen_batch}` must be a multiple of the global batch "
                f"(per_device_train_batch_size {per_device} x {num_processes} process(es))."
            )
    if gen_batch % g:
        # Smallest per-device batch >= the current one that makes whole groups.
        step = g // math.gcd(g, gen_batch // per_device)
        fixed = -(-per_device // step) * step
        raise ConfigError(
            f"Batch shape: {how} = {gen_batch} completions per generation batch, which is not a multiple of "
            f"num_generations={g} (GRPO needs whole groups of {g} completions per prompt). "
            f"Use `trainer.per_device_train_batch_size={fixed}`, or a num_generations that divides {gen_batch} "
            f"({_divisors(gen_batch)})."
        )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(2, n + 1) if n % d == 0) or "none >= 2"


def validate(run: RunConfig) -> RunConfig:
    if run.num_generations < 2:
        raise ConfigError(
            f"`num_generations` must be >= 2 (GRPO compares completions within a group), got {run.num_generations}."
        )
    _positive(run.lr, "lr")
    _positive(run.beta, "beta", allow_zero=True)
    _positive(run.max_steps, "max_steps")
    _positive(run.optimizer.weight_decay, "optimizer.weight_decay", allow_zero=True)
    _positive(run.optimizer.max_grad_norm, "optimizer.max_grad_norm")
    _positive(run.optimizer.gradient_accumulation_steps, "optimizer.gradient_accumulation_steps")
    if not 0 <= run.optimizer.warmup_ratio < 1:
        raise ConfigError(f"`optimizer.warmup_ratio` must be in [0, 1), got {run.optimizer.warmup_ratio}.")
    _positive(run.launcher.num_processes, "launcher.num_processes")
    if run.launcher.kind == "local" and run.launcher.num_processes != 1:
        raise ConfigError(
            "`launcher=local` trains in one process; for several use "
            f"`launcher=ddp launcher.num_processes={run.launcher.num_processes}`."
        )
    if run.launcher.kind == "accelerate" and run.launcher.config_file is None:
        raise ConfigError("`launcher.config_file` must name an accelerate config file (e.g. ddp.yaml).")
    if run.launcher.gpus_per_job is not None:
        _positive(run.launcher.gpus_per_job, "launcher.gpus_per_job")
    _positive(run.eval.max_new_tokens, "eval.max_new_tokens")
    _positive(run.eval.batch_size, "eval.batch_size")
    if run.eval.every_n_steps is not None:
        _positive(run.eval.every_n_steps, "eval.every_n_steps")
    _positive(run.data.num_shots, "data.num_shots", allow_zero=True)
    for name in ("train_size", "eval_size"):
        size = getattr(run.data, name)
        if size is not None:
            _positive(size, f"data.{name}")
    if isinstance(run.data, Gsm8kData | JsonlData) and not 0 < run.data.eval_fraction < 1:
        raise ConfigError(f"`data.eval_fraction` must be in (0, 1), got {run.data.eval_fraction}.")
    _check_objective(run)
    check_batch_shape(run, run.launcher.num_processes)
    return run


EVAL_METRICS = ("accuracy", "format", "mean_length")


def check_metric_name(metric: str) -> None:
    """A metric a run produces: eval_before/eval_after + one of EVAL_METRICS, or train/<logged key>."""
    prefix, _, name = metric.partition("/")
    if prefix in ("eval_before", "eval_after"):
        if name not in EVAL_METRICS:
            near = _nearest(name, EVAL_METRICS)
            tip = f" Did you mean `{prefix}/{near}`?" if near else ""
            raise ConfigError(f"Metric `{metric}`: {prefix} has {', '.join(EVAL_METRICS)}.{tip}")
    elif prefix != "train" or not name:
        raise ConfigError(
            f"Metric `{metric}` must be `eval_after/<{'|'.join(EVAL_METRICS)}>`, `eval_before/...`, "
            "or `train/<logged key>` (e.g. `train/reward_end`, `train/kl`)."
        )


def _check_objective(run: RunConfig) -> None:
    """The objective must be a metric the run will produce (see train.training_metrics / evaluate)."""
    metric = run.objective.metric
    check_metric_name(metric)
    prefix = metric.partition("/")[0]
    if prefix.startswith("eval_") and not getattr(run.eval, prefix.removeprefix("eval_")):
        raise ConfigError(f"`objective.metric={metric}` needs `eval.{prefix.removeprefix('eval_')}=true`.")


def load(cfg: Any) -> RunConfig:
    """Convert a composed Hydra config (DictConfig or plain mapping) into a validated RunConfig."""
    from omegaconf import DictConfig, OmegaConf

    try:
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except Exception as e:  # an interpolation that does not resolve
        raise ConfigError(f"The config does not resolve: {e}") from e
    raw = {k: v for k, v in raw.items() if k != "hydra"}
    names = [f.name for f in dataclasses.fields(RunConfig)]
    for key in raw:
        if key not in names:
            raise _unknown_key("", str(key), names)
    if "reward" not in raw or "trainer" not in raw:
        raise ConfigError("The config needs `reward` and `trainer` groups (see conf/config.yaml).")
    missing = [n for n in names if n not in raw]
    if missing:
        raise ConfigError(f"Missing config key(s): {', '.join(missing)} (see conf/config.yaml).")
    # Three nodes need more than type conversion: data picks its schema by `kind`, reward functions
    # carry free-form kwargs, and trainer keys are checked against TRL's GRPOConfig.
    special = {
        "data": _convert_data(raw["data"], "data"),
        "reward": _convert_reward(raw["reward"]),
        "trainer": _check_trainer_keys(raw["trainer"] or {}),
    }
    hints = typing.get_type_hints(RunConfig)
    values = {n: _convert(raw[n], hints[n], n) for n in names if n not in special}
    return validate(RunConfig(**values, **special))


# --------------------------------------------------------------------------------------- TRL mapping
def grpo_kwargs(run: RunConfig, *, output_dir: str, report_to: list[str], run_name: str | None) -> dict[str, Any]:
    """Keyword arguments for ``trl.GRPOConfig``: the user's `trainer.*` plus the keys grpo_lab owns."""
    opt = run.optimizer
    return {
        **run.trainer,
        "output_dir": output_dir,
        "report_to": report_to,
        "run_name": run_name,
        "learning_rate": run.lr,
        "beta": run.beta,
        "num_generations": run.num_generations,
        "seed": run.seed,
        "max_steps": run.max_steps,
        "optim": opt.optim,
        "weight_decay": opt.weight_decay,
        # transformers 5 reads a float in [0, 1) as a fraction of the total steps.
        "warmup_steps": opt.warmup_ratio,
        "lr_scheduler_type": opt.scheduler,
        "max_grad_norm": opt.max_grad_norm,
        "gradient_accumulation_steps": opt.gradient_accumulation_steps,
        # transformers 5 renamed it (the old name warns on every run); older releases have only the old one.
        _checkpointing_field(): run.model.gradient_checkpointing,
        "reward_weights": run.reward.ordered_weights(),
    }


def user_key(field: str) -> str:
    """The key a user types for GRPOConfig field ``field``: ``lr`` for ``learning_rate``, else ``trainer.<field>``."""
    owner = _OWNED_TRAINER_FIELDS.get(field, "")
    quoted = owner.split("`")
    return quoted[1] if len(quoted) > 2 else f"trainer.{field}"


def _checkpointing_field() -> str:
    return (
        "activation_checkpointing" if "activation_checkpointing" in grpo_config_fields() else "gradient_checkpointing"
    )


def to_grpo_config(run: RunConfig, *, output_dir: str, report_to: list[str], run_name: str | None) -> Any:
    """Build TRL's GRPOConfig (imports trl); TRL's own checks become ConfigErrors."""
    import torch
    from trl import GRPOConfig

    kwargs = grpo_kwargs(run, output_dir=output_dir, report_to=report_to, run_name=run_name)
    if "use_cpu" not in kwargs and not torch.cuda.is_available():
        # Without it, transformers sets up its device state without cpu=True and, under `accelerate
        # launch`, sees one process instead of the world size; with it, CPU ranks use gloo (MULTI_CPU).
        kwargs["use_cpu"] = True
    # `trainer.temperature=2` arrives as an int; transformers' sampling warpers refuse a non-float.
    for name, annotation in vars(GRPOConfig).get("__annotations__", {}).items():
        value = kwargs.get(name)
        if type(value) is int and annotation in (float, float | None, "float", "float | None"):
            kwargs[name] = float(value)
    try:
        return GRPOConfig(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"TRL rejected the trainer settings: {e}") from e
