"""Typed run configuration: the one boundary between Hydra's DictConfig and the rest of grpo_lab.

``load(cfg)`` turns the composed config into frozen pydantic models and rejects, before any model is
loaded: unknown keys (naming the nearest valid one), wrong types, out-of-range values and batch shapes
that TRL's divisibility rule refuses. pydantic does the type, range, choice and unknown-key checks from
the declarations below; this module only turns its errors into our words (the nearest valid name, the
aliases other libraries use, how to fix it) and adds the rules that span fields. Past this module no
code calls ``cfg.get``.

Defaults live in YAML (``conf/``), never here: every field below is required, so a preset that forgets
one fails loudly instead of silently picking a value. TRL's own defaults stay TRL's: ``trainer`` holds
only the GRPOConfig fields our YAML or the user sets.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import grpo_config_fields, trl_default, trl_version


# --------------------------------------------------------------------------------------------- schema
class _Schema(BaseModel):
    # strict: `lr=abc` or `max_steps=2.5` is an error, never a silent coercion (an int is still a valid
    # float); frozen: a run's config is a value that nothing downstream edits.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(gt=0)]


class LoraConfig(_Schema):
    # Ranges are peft's, checked only when enabled (trl_checks): a disabled adapter's values are inert.
    enabled: bool
    r: int
    alpha: int
    dropout: float
    target_modules: str | list[str]


class ModelConfig(_Schema):
    # builtin:<name>, package:<pkg>/<file>.gguf, a local dir or .gguf file, or a Hugging Face Hub id.
    name_or_path: str
    dtype: Literal["float32", "bfloat16", "float16", "auto"]
    attn_implementation: str | None
    gradient_checkpointing: bool
    trust_remote_code: bool
    lora: LoraConfig


class _DataBase(_Schema):
    system_prompt: str
    # Worked examples put before the question as earlier user/assistant turns.
    num_shots: int = Field(ge=0)
    train_size: PositiveInt | None
    eval_size: PositiveInt | None
    # Seeds the data (generation, shuffling, train/eval split) separately from training, so that a
    # sweep over `seed` keeps the same prompts.
    seed: int


class ArithmeticData(_DataBase):
    kind: Literal["arithmetic"]
    max_number: PositiveInt
    operations: list[str]


class Gsm8kData(_DataBase):
    kind: Literal["gsm8k"]
    hub_id: str
    hub_config: str
    path: str | None
    eval_path: str | None
    eval_fraction: float = Field(gt=0, lt=1)


class JsonlData(_DataBase):
    kind: Literal["jsonl"]
    path: str
    eval_path: str | None
    eval_fraction: float = Field(gt=0, lt=1)


DataConfig = Annotated[Union[ArithmeticData, Gsm8kData, JsonlData], Field(discriminator="kind")]  # noqa: UP007
_DATA_KINDS: dict[str, type[_DataBase]] = {"arithmetic": ArithmeticData, "gsm8k": Gsm8kData, "jsonl": JsonlData}


class RewardFunction(_Schema):
    model_config = ConfigDict(validate_by_name=True)
    # A built-in reward name or the dotted path of a callable `(completions, **kwargs) -> list[float | None]`.
    target: str = Field(alias="_target_", min_length=1, description="a built-in reward name or `my_pkg.rewards.fn`")
    kwargs: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _from_hydra(cls, value: Any) -> Any:
        """Hydra's spelling: `_target_` beside the function's own keyword arguments."""
        if not isinstance(value, Mapping) or "target" in value:
            return value
        if "_target_" not in value:
            raise PydanticCustomError("no_target", "must be a mapping with a `_target_` (dotted path of the function)")
        return {"_target_": value["_target_"], "kwargs": {str(k): v for k, v in value.items() if k != "_target_"}}


class RewardConfig(_Schema):
    # Ordered name -> function; the name is the W&B key (`rewards/<name>/mean`).
    functions: dict[str, RewardFunction] = Field(
        min_length=1, description="name at least one reward function, e.g. `reward=gsm8k`"
    )
    weights: dict[str, float]

    def ordered_weights(self) -> list[float]:
        """TRL's `reward_weights`: one weight per function, in the functions' order."""
        return [self.weights[name] for name in self.functions]


class OptimizerConfig(_Schema):
    optim: str
    weight_decay: float = Field(ge=0)
    warmup_ratio: float = Field(ge=0, lt=1)
    scheduler: Literal["cosine", "constant", "linear", "constant_with_warmup", "cosine_with_restarts"]
    max_grad_norm: float = Field(gt=0)
    gradient_accumulation_steps: PositiveInt


class EvalConfig(_Schema):
    before: bool
    after: bool
    # Also evaluate every N training steps (for curves and for pruning sweep trials); null = never.
    every_n_steps: PositiveInt | None
    max_new_tokens: PositiveInt
    batch_size: PositiveInt


class ObjectiveConfig(_Schema):
    metric: str
    direction: Literal["maximize", "minimize"]


class LoggerConfig(_Schema):
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


class LauncherConfig(_Schema):
    # local: train in the Hydra job; accelerate: `accelerate launch` children run the resolved config.
    kind: Literal["local", "accelerate"]
    num_processes: PositiveInt
    config_file: str | None
    gpus_per_job: PositiveInt | None
    main_process_port: int | None
    extra_args: list[str]


Action = Literal["warn", "stop", "ignore"]


class HealthConfig(_Schema):
    """The live health rules (grpo_lab.health; conf/health/default.yaml says what each one means)."""

    patience: PositiveInt
    nonfinite: Action
    kl: Action
    kl_max: float = Field(gt=0)
    no_signal: Action
    reward_std_min: float = Field(ge=0)
    frac_zero_std_max: float = Field(ge=0, le=1)
    length: Action
    length_ratio: float = Field(gt=1)
    clipped: Action
    clipped_max: float = Field(gt=0, le=1)


class OutputConfig(_Schema):
    save_model: bool


class TrialConfig(_Schema):
    """Set by the Optuna sweeper for a trial's job: where to report intermediate values."""

    study: str
    storage: str
    number: int
    id: int
    # The sweep's pruner settings (hydra.sweeper.pruner); null: this trial is not pruned.
    pruner: dict[str, Any] | None


class RunConfig(_Schema):
    name: str
    lr: float = Field(gt=0)
    beta: float = Field(ge=0)
    num_generations: int = Field(ge=2, description="GRPO compares completions within a group")
    seed: int
    max_steps: PositiveInt
    model: ModelConfig
    data: DataConfig
    reward: RewardConfig
    optimizer: OptimizerConfig
    trainer: dict[str, Any]
    eval: EvalConfig
    objective: ObjectiveConfig
    logger: LoggerConfig
    launcher: LauncherConfig
    health: HealthConfig
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
def _nearest(key: str, candidates: Iterable[str]) -> str | None:
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


def _members(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union (Annotated wrappers removed), or () if ``tp`` is not one."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return ()
    return tuple(typing.get_args(a)[0] if typing.get_origin(a) is Annotated else a for a in typing.get_args(tp))


def _type_name(tp: Any) -> str:
    if members := _members(tp):
        return " | ".join(_type_name(a) for a in members)
    if typing.get_origin(tp) is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "a mapping"
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


class _Where(typing.NamedTuple):
    """A pydantic error location in our words: the dotted key a user types and what is declared there."""

    path: str
    parent: str
    holder: type[BaseModel] | None  # the model whose key the location ends in
    field: Any  # its FieldInfo (None inside dicts and lists)
    declared: Any  # the declared type; a union when pydantic tried several alternatives


def _locate(loc: tuple[Any, ...], root: type[BaseModel]) -> _Where:
    path, parent, holder, field, tp = "", "", None, None, root
    parts = list(loc)
    while parts:
        members = _members(tp)
        if members:
            tag = parts[0]
            chosen = [m for m in members if m is _DATA_KINDS.get(str(tag))]
            models = [m for m in members if m is not type(None)]
            if chosen:  # a discriminated union names the tag it picked
                parts.pop(0)
                tp = chosen[0]
            elif len(models) == 1:  # `X | None`: pydantic reports inside X directly
                tp = models[0]
            else:  # several alternatives were tried: the error is about the whole union
                break
            continue
        part = parts.pop(0)
        parent = path
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            holder = tp
            field = tp.model_fields.get(str(part)) or next(
                (f for f in tp.model_fields.values() if f.alias == part), None
            )
            path, tp = _join(path, str(part)), (field.annotation if field else None)
        elif typing.get_origin(tp) is dict:
            path, tp, field = _join(path, str(part)), typing.get_args(tp)[1], None
        elif typing.get_origin(tp) is list:
            path, tp, field = f"{path}[{part}]", typing.get_args(tp)[0], None
        else:
            path = _join(path, str(part))
    return _Where(path, parent, holder, field, tp)


# What each pydantic type error means, in a user's words.
_EXPECTED = {
    "bool_type": "true or false",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _message(error: Any, where: _Where) -> str:
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    path = f"`{where.path or 'config'}`"
    why = f" ({where.field.description})" if where.field is not None and where.field.description else ""
    if kind == "extra_forbidden":
        valid = [f.alias or n for n, f in where.holder.model_fields.items()] if where.holder else []
        return str(_unknown_key(where.parent, where.path.rpartition(".")[2], valid))
    if kind == "union_tag_invalid":
        near = _nearest(str(ctx.get("tag")), _DATA_KINDS)
        tip = f" Did you mean {near!r}?" if near else ""
        return f"{path[:-1]}.kind` must be one of {', '.join(_DATA_KINDS)}, got {ctx.get('tag')!r}.{tip}"
    if kind == "union_tag_not_found":
        return f"{path} must be a mapping with a `kind` ({', '.join(_DATA_KINDS)})."
    if kind == "literal_error":
        choices = typing.get_args(where.declared)
        near = _nearest(str(value), [str(c) for c in choices])
        tip = f" Did you mean {near!r}?" if near else ""
        return f"{path} must be one of {', '.join(map(repr, choices))}, got {value!r}.{tip}"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        return f"{path} must be {sign} {ctx[key]}{why}, got {value!r}."
    if kind == "too_short":
        return f"{path} must not be empty{why}."
    if _members(where.declared):
        return f"{path} must be {_type_name(where.declared)}, got {value!r}."
    if kind in _EXPECTED:
        example = f" (e.g. {path[:-1]}=1e-5`)" if kind == "float_type" else ""
        return f"{path} must be {_EXPECTED[kind]}{why}, got {value!r}{example}."
    return f"{path}: {error['msg']}{why}, got {value!r}."


def _config_error(error: ValidationError) -> ConfigError:
    """One ConfigError for all that pydantic found, each problem in our words."""
    missing: list[str] = []
    problems: list[str] = []
    for item in error.errors(include_url=False):
        where = _locate(item["loc"], RunConfig)
        if item["type"] == "missing":
            missing.append(f"`{where.path}`")
        elif (message := _message(item, where)) not in problems:
            problems.append(message)
    if missing:
        problems.append(
            f"Missing config key(s) {', '.join(missing)}: every key needs a value in conf/ (YAML holds the defaults)."
        )
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems))


def _check_reward_names(reward: RewardConfig) -> None:
    for name in reward.weights:
        if name not in reward.functions:
            raise _unknown_key("reward.weights", name, list(reward.functions))
    missing = [n for n in reward.functions if n not in reward.weights]
    if missing:
        raise ConfigError(
            "Every reward needs a weight; missing: "
            + ", ".join(f"`reward.weights.{n}`" for n in missing)
            + " (add e.g. `+reward.weights.NAME=1.0`)."
        )


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
    """The rules that span fields (each field's own type and range are declared in the schema)."""
    if run.launcher.kind == "local" and run.launcher.num_processes != 1:
        raise ConfigError(
            "`launcher=local` trains in one process; for several use "
            f"`launcher=ddp launcher.num_processes={run.launcher.num_processes}`."
        )
    if run.launcher.kind == "accelerate" and run.launcher.config_file is None:
        raise ConfigError("`launcher.config_file` must name an accelerate config file (e.g. ddp.yaml).")
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
    if "reward" not in raw or "trainer" not in raw:
        raise ConfigError("The config needs `reward` and `trainer` groups (see conf/config.yaml).")
    raw["trainer"] = raw["trainer"] or {}  # `trainer:` with every key left to TRL's defaults
    try:
        run = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise _config_error(e) from None
    _check_reward_names(run.reward)
    _check_trainer_keys(run.trainer)
    return validate(run)


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
