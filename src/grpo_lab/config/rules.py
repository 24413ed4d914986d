"""Every check of a run's settings, as one ordered list of rules: our keys, values and the rules that span them,
schedules, TRL's own checks, and a sweep's.

Each setting's type, range and choices are declared once, on its field (grpo_lab.config.schema; TRL's fields are
TRL's, read from the installed GRPOConfig, with the ranges TRL does not declare in grpo_lab.config.limits); a rule
here is only what a declaration cannot say. :data:`RULES` runs in order and stops at the first rule that finds a
problem (its problems are one ConfigError, one line); the rules that import TRL, transformers or peft (``libraries``)
run only when asked, after the others, and the sweep's (``sweep``) only for a sweep. A rule is a function of a
:class:`Checking` that returns the problems it finds.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from grpo_lab.config import limits, trl_fields
from grpo_lab.config.metrics import eval_metric_names, metric_problem
from grpo_lab.config.problems import ALIASES, Problem, fail, show, unknown_key
from grpo_lab.config.schedule import build as build_schedule
from grpo_lab.config.schema import RunConfig
from grpo_lab.config.trl import TRAINER_FIELDS, grpo_kwargs, user_key
from grpo_lab.config.trl_fields import NO_DEFAULT, trl_default, trl_version


@dataclass(frozen=True)
class Checking:
    """What the rules read: the run's settings, how it runs, what the user gave, and (for a sweep) its plan."""

    run: RunConfig
    num_processes: int
    # The keys the user typed or a sweep varies (`reward.weights.tests`, `reward.schedule.tests`...): a rule that
    # weighs a user's value against a preset's reads them.
    given: frozenset[str] = frozenset()
    # The model's architecture (transformers' config), read on demand: only a rule about the model asks for it.
    architecture: Callable[[], Any] | None = None
    # A sweep's plan: its settings (grpo_lab.config.sweep.SweeperSettings), objective metrics, searched parameters.
    sweep: SweepPlan | None = None
    # Builds the job's own GRPOConfig (grpo_lab.config.job: once a process, kept for training); None: one for the
    # check alone.
    build: Callable[[RunConfig], Any] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)  # GRPOConfig's keyword arguments, as grpo_lab sets them
    _built: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.kwargs:
            self.kwargs.update(grpo_kwargs(self.run, output_dir="", report_to=[], run_name=None))

    def grpo_config(self) -> Any:
        """TRL's GRPOConfig of the run, built once."""
        if not self._built:
            from grpo_lab.config import trl

            run = self.run
            if self.build is not None:
                self._built.append(self.build(run))
            else:
                if self.num_processes > 1 and "eval_strategy" in run.trainer:  # one process of one: see _eval_batch
                    run = run.model_copy(update={"trainer": {**run.trainer, "eval_strategy": "no"}})
                self._built.append(trl.grpo_config(run, output_dir=trl.UNUSED_DIR, report_to=[], run_name=None))
        return self._built[0]


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep's rules read besides the run: its settings, its objectives' metrics, the parameters it varies."""

    settings: Any  # grpo_lab.config.sweep.SweeperSettings
    metrics: tuple[str, ...]
    varied: frozenset[str]


# settings: our keys alone; installed: the packages a switch needs; libraries: TRL, transformers and peft read them
# (a GRPOConfig is built); sweep: a sweep's own settings against the run's.
Scope = Literal["settings", "installed", "libraries", "sweep"]
JOB: tuple[Scope, ...] = ("settings", "installed", "libraries")  # every rule a job must pass before it starts


@dataclass(frozen=True)
class Rule:
    name: str  # what must hold, in a few words
    check: Callable[[Checking], Iterable[Problem]]
    scope: Scope = "settings"


# ----------------------------------------------------------------------------------------------- our keys
# Names from PPO or older TRL releases that are not GRPO settings at all.
_NOT_GRPO = frozenset(
    [
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
    ]
)


def _reward_keys(c: Checking) -> list[Problem]:
    reward = c.run.reward
    found = [
        unknown_key("reward.weights", n, list(reward.functions)) for n in reward.weights if n not in reward.functions
    ]
    note = "every reward needs a weight (e.g. `+reward.weights.NAME=1.0`)"
    return found + [
        Problem(f"reward.weights.{n}", "missing", note=note) for n in reward.functions if n not in reward.weights
    ]


def _trainer_keys(c: Checking) -> list[Problem]:
    fields = trl_fields.grpo_config_fields()
    found = []
    for key in map(str, c.run.trainer):
        if key in TRAINER_FIELDS:
            owner = user_key(key)
            note = f"(grpo_lab sets GRPOConfig.{key} from `{owner}`: set it there.)"
            found.append(Problem(f"trainer.{key}", "unknown_key", near=owner, note=note))
        elif key in _NOT_GRPO and key not in fields:
            owner = ALIASES.get(key)
            note = f"(not a GRPO setting: TRL {trl_version()}'s GRPOConfig has no `{key}`; PPO or an old TRL has it.)"
            found.append(Problem(f"trainer.{key}", "unknown_key", near=owner, note=note))
        elif key not in fields:
            found.append(unknown_key("trainer", key, list(fields)))
    return found


def _trainer_values(c: Checking) -> list[Problem]:
    return limits.trainer_problems(c.kwargs, user_key)


# ------------------------------------------------------------------------------------ rules across fields
def _launcher(c: Checking) -> list[Problem]:
    launcher, n = c.run.launcher, c.run.launcher.num_processes
    if launcher.kind == "local" and n != 1:
        must = f"`launcher=local` trains in one process; for several use `launcher=ddp launcher.num_processes={n}`."
        return [Problem("launcher.num_processes", "rule", n, must)]
    if launcher.kind == "accelerate" and launcher.config_file is None:
        return [Problem("launcher.config_file", "missing", note="name an accelerate config file (e.g. ddp.yaml)")]
    return []


def _objective(c: Checking) -> list[Problem]:
    """The objective must be a metric the run will produce (train.training_metrics, the evaluations)."""
    run, metric = c.run, c.run.objective.metric
    if problem := metric_problem(metric, eval_metric_names(list(run.eval.graders), run.eval.samples, run.eval.pass_k)):
        return [problem]
    prefix = metric.partition("/")[0]
    if prefix.startswith("eval_") and not getattr(run.eval, prefix.removeprefix("eval_")):
        return [Problem("objective.metric", "rule", metric, f"needs `eval.{prefix.removeprefix('eval_')}=true`.")]
    return []


def _keep(c: Checking) -> list[Problem]:
    """`output.keep=best|top_k` chooses a step by the validation objective over the evaluations during training."""
    run = c.run
    keep = run.output.keep
    if keep == "last":
        return []
    if not run.eval.every_n_steps:
        must = "chooses a step by the evaluations during training: set `eval.every_n_steps=N` too (or keep=last)."
        return [Problem("output.keep", "rule", keep, must)]
    metric = run.objective.metric
    if not _periodic_grader(metric, run):
        must = (
            f"chooses a step by the validation objective, a greedy `eval_after/<grader>`; the objective is {metric}: "
            "set `objective.metric=eval_after/<grader>` (or keep=last)."
        )
        return [Problem("output.keep", "rule", keep, must)]
    if run.launcher.num_processes > 1 or run.launcher.kind == "accelerate":
        must = (
            "is not supported with a launched job yet (several processes, DeepSpeed or FSDP: its checkpoint choice "
            "is the main process's): keep=last."
        )
        return [Problem("output.keep", "rule", keep, must)]
    limit = run.trainer.get("save_total_limit")
    if isinstance(limit, int) and limit < (1 if keep == "best" else run.output.top_k) + 1:
        must = (
            f"keeps {'1' if keep == 'best' else run.output.top_k} checkpoint(s) and the latest, more than "
            f"trainer.save_total_limit={limit} lets the Trainer keep: raise it or leave it unset."
        )
        return [Problem("output.keep", "rule", keep, must)]
    return []


def _periodic_grader(metric: str, run: RunConfig) -> bool:
    """`eval_after/<grader>` of a greedy grader: what the evaluations during training score, so keep can rank by it."""
    prefix, _, name = metric.partition("/")
    return prefix == "eval_after" and name in run.eval.graders


def _keep_one_objective(c: Checking) -> list[Problem]:
    """A sweep's trials choose their step by the sweep's objective (it replaces the run's): one greedy grader."""
    keep, metrics = c.run.output.keep, c.sweep.metrics
    if keep == "last":
        return []
    if len(metrics) != 1:
        must = f"chooses a step by one objective; this sweep has {len(metrics)} (a front, not a best): keep=last."
        return [Problem("output.keep", "rule", keep, must)]
    if not _periodic_grader(metrics[0], c.run):
        must = f"chooses a step by a greedy `eval_after/<grader>`; the sweep's objective is {metrics[0]}: keep=last."
        return [Problem("output.keep", "rule", keep, must)]
    return []


def _value(kwargs: Mapping[str, Any], name: str) -> Any:
    """The field as GRPOConfig will see it: set by the user or grpo_lab, else TRL's literal default."""
    if name in kwargs:
        return kwargs[name]
    default = trl_fields.grpo_config_fields()[name].default
    return None if default == NO_DEFAULT else default


def _batch_shape(c: Checking) -> list[Problem]:
    """TRL's rule, in our words: each generation batch must hold whole groups of completions."""
    run, n = c.run, c.num_processes
    per_device = run.trainer.get("per_device_train_batch_size", trl_default("per_device_train_batch_size"))
    steps_per_gen, gen_batch, g = (
        run.trainer.get("steps_per_generation"),
        run.trainer.get("generation_batch_size"),
        run.num_generations,
    )
    if gen_batch is not None and steps_per_gen is not None:
        must = "set `trainer.generation_batch_size` or `trainer.steps_per_generation`, not both."
        return [Problem("trainer.steps_per_generation", "rule", steps_per_gen, must)]
    if gen_batch is None:
        steps = steps_per_gen if steps_per_gen is not None else run.optimizer.gradient_accumulation_steps
        gen_batch = per_device * n * steps
        which = "steps_per_generation" if steps_per_gen is not None else "gradient_accumulation_steps"
        how = f"per_device_train_batch_size {per_device} x {n} process(es) x {which} {steps}"
    else:
        how = "trainer.generation_batch_size"
        if gen_batch % (per_device * n):
            must = f"be a multiple of per_device_train_batch_size {per_device} x {n} process(es)"
            return [Problem("trainer.generation_batch_size", "range", gen_batch, must)]
    if gen_batch % g:
        step = g // math.gcd(g, gen_batch // per_device)  # the smallest per-device batch >= this one that works
        fixed = -(-per_device // step) * step
        divisors = ", ".join(str(d) for d in range(2, gen_batch + 1) if gen_batch % d == 0) or "none >= 2"
        must = (
            f"{how} = {gen_batch} completions per generation batch, which is not a multiple of num_generations={g} "
            f"(GRPO needs whole groups of {g} completions per prompt). Use `trainer.per_device_train_batch_size="
            f"{fixed}`, or a num_generations that divides {gen_batch} ({divisors})."
        )
        return [Problem("num_generations", "rule", g, must)]
    return []


def _schedule(c: Checking) -> list[Problem]:
    """The schedule's own rules (grpo_lab.config.schedule), and: a scheduled reward's weight is its schedule's, unless
    the user (or a sweep) also gives `reward.weights.<name>` and it disagrees with where the schedule starts."""
    reward = c.run.reward
    schedule = build_schedule(
        list(reward.functions), reward.weights, reward.schedule, reward.schedule_unit, c.run.max_steps
    )
    for name in schedule.points:
        start, given = schedule.weight(name, 0.0), reward.weights[name]
        both = f"reward.weights.{name}" in c.given and any(k.startswith(f"reward.schedule.{name}") for k in c.given)
        if both and abs(start - given) > 1e-12:
            must = (
                f"the schedule starts at {start:g} and reward.weights.{name}={given:g} was given too: give one of "
                f"them (the schedule owns the weight of a scheduled reward), or begin the schedule at [0, {given:g}]"
            )
            return [Problem(f"reward.weights.{name}", "rule", given, must)]
    return []


def _epsilon_high(c: Checking) -> list[Problem]:
    high, low = c.kwargs.get("epsilon_high"), _value(c.kwargs, "epsilon")
    if high is not None and high < low:
        why = "the upper clip bound; null uses epsilon"
        return [Problem("trainer.epsilon_high", "range", high, f"be >= trainer.epsilon={show(low)}", why)]
    return []


def _eval_batch(c: Checking) -> list[Problem]:
    # TRL checks this with the world size of the process that builds GRPOConfig, which for `launcher=ddp` is the
    # single parent process: checked here for the real number of processes.
    if _value(c.kwargs, "eval_strategy") in ("no", None):
        return []
    per_device = _value(c.kwargs, "per_device_eval_batch_size")
    groups = c.kwargs.get("num_generations_eval") or c.run.num_generations
    if isinstance(per_device, int) and (per_device * c.num_processes) % groups:
        must = (
            f"{per_device} x {c.num_processes} process(es) must be a multiple of the generations per eval prompt, "
            f"{groups} (TRL's GRPOConfig rule)."
        )
        return [Problem("trainer.per_device_eval_batch_size", "rule", per_device, must)]
    return []


# GRPOConfig switch -> (package it imports, how to get it).
_NEEDS = {
    "use_vllm": ("vllm", "`pip install 'vllm==0.31.*'` on a GPU machine, or `make vllm` (vLLM's CPU build)"),
    "use_liger_kernel": ("liger_kernel", "`pip install liger-kernel`"),
}


def _installed(c: Checking) -> list[Problem]:
    for name, (package, how) in _NEEDS.items():
        if c.kwargs.get(name) is True and importlib.util.find_spec(package) is None:
            return [
                Problem(
                    f"trainer.{name}", "rule", True, f"needs the `{package}` package, which is not installed; {how}."
                )
            ]
    return []


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)  # vLLM's CPU attention (16 measured refused)


def _vllm_head_size(c: Checking) -> list[Problem]:
    """vLLM's CPU attention serves a fixed set of head sizes; another fails at the first generation, after the
    engine has started (`Unsupported CPU attention configuration`)."""
    if c.kwargs.get("use_vllm") is not True or c.architecture is None or _cuda():
        return []
    config = c.architecture()
    size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if size in VLLM_CPU_HEAD_SIZES:
        return []
    tiny = (
        " (`model=tiny_vllm` is the tiny model built for it)" if c.run.model.name_or_path.startswith("builtin:") else ""
    )
    must = (
        f"{c.run.model.name_or_path} has attention heads of size {size}, which vLLM's CPU attention cannot serve "
        f"(it takes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}): choose another model{tiny}, or generate with "
        "transformers (`trainer=grpo`)"
    )
    return [Problem("model.name_or_path", "rule", c.run.model.name_or_path, must)]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------------------- TRL's own checks
def _grpo_config(c: Checking) -> list[Problem]:
    """TRL's GRPOConfig (its __post_init__); a refusal is raised as one line naming the key behind it."""
    c.grpo_config()
    return []


def _generation(c: Checking) -> list[Problem]:
    from grpo_lab.config import trl

    if c.kwargs.get("use_vllm") is True:  # vLLM takes the sampling settings itself (checked by their limits)
        return []
    return [p] if (p := trl.generation_problem(c.grpo_config())) is not None else []


def _peft_lora(c: Checking) -> list[Problem]:
    from grpo_lab.config import trl

    return [p] if (p := trl.lora_problem(c.run.model)) is not None else []


RULES: tuple[Rule, ...] = (
    Rule("every reward has a weight, every weight a reward", _reward_keys),
    Rule("trainer keys are GRPOConfig's, and not ones grpo_lab sets", _trainer_keys),
    Rule("trainer values of TRL's types, choices and workable ranges", _trainer_values),
    Rule("the launcher can start the processes asked for", _launcher),
    Rule("the objective is a metric the run produces", _objective),
    Rule("output.keep chooses by a validation objective evaluated during training", _keep),
    Rule("generation batches hold whole groups", _batch_shape),
    Rule("the reward schedule's points, and the weight it owns", _schedule),
    Rule("epsilon_high is at least epsilon", _epsilon_high),
    Rule("the eval batch holds whole groups on every process", _eval_batch),
    Rule("the packages a switch needs are installed", _installed, "installed"),
    Rule("vLLM's CPU attention serves the model's head size", _vllm_head_size, "libraries"),
    Rule("TRL's GRPOConfig accepts the settings", _grpo_config, "libraries"),
    Rule("transformers' generation accepts the sampling settings", _generation, "libraries"),
    Rule("peft accepts the LoRA adapter", _peft_lora, "libraries"),
)


# ------------------------------------------------------------------------------------------------- a sweep
def _sweep_metrics(c: Checking) -> list[Problem]:
    """Each objective is a metric every trial will produce (its evaluation's graders, the trainer's logs)."""
    run = c.run
    known = eval_metric_names(list(run.eval.graders), run.eval.samples, run.eval.pass_k)
    found = (metric_problem(m, known, f"hydra.sweeper.objectives.{i}.metric") for i, m in enumerate(c.sweep.metrics))
    return [problem for problem in found if problem is not None]


def _scheduled_weight(c: Checking) -> list[Problem]:
    """A scheduled reward's weight follows its schedule: sweeping `reward.weights.<name>` would change nothing (or
    clash with the schedule in every trial)."""
    scheduled = c.run.reward.schedule or {}
    for name in sorted(c.sweep.varied):
        reward = name.removeprefix("reward.weights.")
        if name.startswith("reward.weights.") and reward in scheduled:
            must = (
                f"is swept, but `{reward}` has a schedule (reward.schedule.{reward}), which owns its weight: sweep the "
                f"schedule's numbers (reward.schedule.{reward}.end, .to ...) or drop the schedule"
            )
            return [Problem(name, "rule", must=must)]
    return []


def _confirm(c: Checking) -> list[Problem]:
    confirm, metrics = c.sweep.settings.confirm, c.sweep.metrics
    if confirm.top_k and len(metrics) > 1:
        why = f"ranks configs by one objective; set confirm.top_k=0 for the {len(metrics)}-objective sweep"
        return [Problem("hydra.sweeper.confirm.top_k", "rule", confirm.top_k, why)]
    if confirm.top_k and "seed" in c.sweep.varied:
        return [
            Problem(
                "hydra.sweeper.confirm.top_k",
                "rule",
                confirm.top_k,
                "re-runs configs with new seeds: do not also sweep `seed`",
            )
        ]
    return []


def _weight_free(c: Checking) -> list[Problem]:
    """With reward weights swept, the weighted training reward is not comparable across trials (small weights score
    lower only because they scale the reward down): neither the objective nor the pruning signal."""
    from grpo_lab.config.samplers import per_item, prunes

    weights = sorted(n for n in c.sweep.varied if n.startswith(("reward.weights.", "reward.schedule.")))
    if not weights:
        return []
    why = f"the sweep varies {', '.join(f'`{w}`' for w in weights)}, which scale the weighted reward"
    for metric in c.sweep.metrics:
        if metric.startswith("train/reward") and not metric.startswith("train/rewards/"):
            must = (
                f"is the weighted training reward, but {why}: optimise a metric the weights do not scale, e.g. "
                "eval_after/accuracy or train/rewards/<name>/mean"
            )
            return [Problem("hydra.sweeper.objectives", "rule", metric, must)]
    # An eval_* objective without periodic evaluation is pruned on the training reward (grpo_lab.run.trial).
    pruner, metrics = c.sweep.settings.pruner, c.sweep.metrics
    by_reward = metrics[0].startswith("eval_") and not c.run.eval.every_n_steps and not per_item(pruner)
    if len(metrics) == 1 and by_reward and prunes(pruner):
        must = (
            f"would compare trials on the weighted training reward (no periodic evaluation), but {why}. Set "
            "`eval.every_n_steps=N` to prune on the held-out metric, or `hydra/sweeper/pruner=none`"
        )
        return [Problem("hydra.sweeper.pruner", "rule", must=must)]
    return []


def _per_item(c: Checking) -> list[Problem]:
    """A per-item pruner (Wilcoxon) reads the held-out evaluation after training item by item: the one objective
    must be a proportion of that evaluation."""
    from grpo_lab.config.samplers import per_item

    if not per_item(c.sweep.settings.pruner):
        return []
    wanted, metrics = [f"eval_after/{name}" for name in c.run.eval.graders], c.sweep.metrics
    if len(metrics) != 1 or metrics[0] not in wanted or not c.run.eval.after:
        must = (
            f"compares trials item by item on the evaluation after training, so it needs one objective among "
            f"{', '.join(wanted)} and eval.after=true (got {', '.join(metrics)}, eval.after={c.run.eval.after}). "
            "Change the objective or pick another pruner (hydra/sweeper/pruner=median)"
        )
        return [Problem("hydra.sweeper.pruner", "rule", must=must)]
    return []


def _sampled(c: Checking) -> list[Problem]:
    """A sampled pass@k objective (`eval.samples`) exists only after training: periodic evaluations are greedy, so a
    pruner that reads them would never see it."""
    from grpo_lab.config.metrics import EVAL_EXTRA_METRICS
    from grpo_lab.config.samplers import prunes

    greedy = {f"eval_after/{name}" for name in [*c.run.eval.graders, *EVAL_EXTRA_METRICS]}
    sampled = [m for m in c.sweep.metrics if m.startswith("eval_after/") and m not in greedy]
    if sampled and prunes(c.sweep.settings.pruner) and len(c.sweep.metrics) == 1:
        must = (
            f"is a sampled pass@k, measured only after training (periodic evaluations are greedy), so a pruner "
            f"could not compare trials on it: prune on a greedy grader ({', '.join(sorted(greedy))}) or use "
            "`hydra/sweeper/pruner=none`"
        )
        return [Problem("hydra.sweeper.objectives", "rule", sampled[0], must)]
    return []


SWEEP_RULES: tuple[Rule, ...] = (
    Rule("each objective is a metric the trials produce", _sweep_metrics, "sweep"),
    Rule("a swept weight is not a scheduled reward's", _scheduled_weight, "sweep"),
    Rule("confirmation ranks one objective and varies the seed itself", _confirm, "sweep"),
    Rule("no objective or pruning signal the swept weights scale", _weight_free, "sweep"),
    Rule("a per-item pruner has one held-out proportion to compare", _per_item, "sweep"),
    Rule("a pruner never waits for a sampled objective", _sampled, "sweep"),
    Rule("output.keep chooses by one objective", _keep_one_objective, "sweep"),
)


def check(checking: Checking, scopes: Sequence[Scope] = ("settings",)) -> None:
    """Run the rules of `scopes` in order; the first rule that finds problems raises them as one ConfigError."""
    for rule in RULES + SWEEP_RULES:
        if rule.scope in scopes and (found := list(rule.check(checking))):
            raise fail(*found)
