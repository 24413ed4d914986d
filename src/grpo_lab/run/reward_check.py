"""Check the rewards before training: does the untrained model give GRPO anything to learn from?

GRPO learns only from the spread of rewards within a group of completions of one prompt: when every
completion of a prompt scores the same (all 0, typically: the format is never produced), its advantages
and gradient are zero, and a run burns its budget learning nothing. This samples the untrained model the
way training will (N prompts x num_generations completions, the trainer's temperature and completion
length), scores them with the configured rewards (the run's own data, model and reward code) and says
whether the groups vary. `python -m grpo_lab.check_rewards [the run's overrides]` is its command.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import data as data_mod
from grpo_lab import files, models
from grpo_lab.config import RunConfig
from grpo_lab.config.schedule import of_run as reward_schedule
from grpo_lab.config.trl_fields import trl_default
from grpo_lab.evaluation.evaluate import generate
from grpo_lab.rewards import build_rewards
from grpo_lab.run.health import no_signal_diagnosis

REPORT = "reward_check.json"
PICTURE = "reward_check.png"
# More than this fraction of groups without reward spread: no signal (the rule of thumb of GRPO recipes:
# most groups must vary).
_MAX_FLAT_GROUPS = 0.5


@dataclass(frozen=True)
class RewardStats:
    name: str  # a reward's config name, or `total` (the weighted sum GRPO uses)
    weight: float
    mean: float
    std: float
    flat_groups: float  # the fraction of prompts whose completions all scored the same
    values: list[float]  # one per completion (None, "not applicable", left out)


@dataclass(frozen=True)
class RewardCheck:
    prompts: int
    generations: int
    rewards: list[RewardStats]
    total: RewardStats
    normalised_mean: float  # total mean / sum of |weights|
    healthy: bool
    verdict: str
    diagnosis: str | None  # without a signal: why, and what to change (health.no_signal_diagnosis)
    seconds: float
    # Per reward that runs the problems' tests (grpo_lab.rewards.code.tests): the share of completions that pass at
    # least one test, and all of them: whether the untrained model gets any test right.
    tests_passed: dict[str, dict[str, float]] = field(default_factory=dict)
    # With reward.schedule: each reward's weight at the end of training (the check scores with the starting ones).
    end_weights: dict[str, float] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per test-running reward: does the untrained model get any test right?"""
        lines = []
        for name, share in self.tests_passed.items():
            if share["any"] == 0:
                lines.append(
                    f"{name}: no completion passes a single test: the tests reward gives GRPO nothing until the model "
                    f"writes working code (an easier data set, more worked examples, or a larger model)."
                )
            else:
                lines.append(
                    f"{name}: {100 * share['any']:.0f}% of the completions pass at least one test, "
                    f"{100 * share['all']:.0f}% pass all of them."
                )
        return lines


def _stats(name: str, weight: float, groups: list[list[float | None]]) -> RewardStats:
    values = [v for g in groups for v in g if v is not None and math.isfinite(v)]
    flat = [len({v for v in g if v is not None}) <= 1 for g in groups]
    return RewardStats(
        name=name,
        weight=weight,
        mean=statistics.fmean(values) if values else math.nan,
        std=statistics.pstdev(values) if len(values) > 1 else 0.0,
        flat_groups=sum(flat) / len(flat) if flat else math.nan,
        values=values,
    )


def assess(
    per_reward: dict[str, list[list[float | None]]], weights: dict[str, float], seconds: float = 0.0
) -> RewardCheck:
    """The check's numbers and verdict for each reward's scores, one list per prompt (its completions' scores)."""
    groups = next(iter(per_reward.values()))
    prompts, g = len(groups), len(groups[0]) if groups else 0
    totals = [
        [sum(weights[n] * (per_reward[n][i][j] or 0.0) for n in per_reward) for j in range(g)] for i in range(prompts)
    ]
    stats = [_stats(n, weights[n], scores) for n, scores in per_reward.items()]
    total = _stats("total", sum(weights.values()), totals)
    normalised = total.mean / (sum(abs(w) for w in weights.values()) or 1.0)
    if total.flat_groups > _MAX_FLAT_GROUPS:
        diagnosis = no_signal_diagnosis(total.mean)
        share = f"{100 * total.flat_groups:.0f}% of the prompts get the same total reward for all their completions"
        return RewardCheck(
            prompts, g, stats, total, normalised, False, f"no signal: {diagnosis} ({share}).", diagnosis, seconds
        )
    # The recipes' other rule of thumb (a mean total of 0.3-0.7 of its range) needs each reward's range, which a
    # user's reward does not declare: shown as information (total mean / sum of weights), not judged.
    verdict = (
        f"healthy: the completions of {100 * (1 - total.flat_groups):.0f}% of the prompts score differently, so "
        f"GRPO has a signal to learn from (mean total reward {normalised:.2f} of the weights' sum)."
    )
    return RewardCheck(prompts, g, stats, total, normalised, True, verdict, None, seconds)


def check(cfg: RunConfig, cache_dir: Path, *, prompts: int, seed: int | None = None) -> RewardCheck:
    """Sample `prompts` training prompts x num_generations completions from the untrained model and score them."""
    from transformers import set_seed

    started = time.monotonic()
    set_seed(cfg.seed if seed is None else seed)
    train = data_mod.load_datasets(cfg.data).train
    rows = train.select(range(min(prompts, len(train))))
    rewards = build_rewards(cfg.reward.functions)
    model, tokenizer = models.load_model_and_tokenizer(cfg.model, cache_dir)

    def value(name: str) -> object:  # the run's GRPOConfig value, else TRL's default
        return cfg.trainer.get(name, trl_default(name))

    g = cfg.num_generations
    batches = generate(
        model,
        tokenizer,
        list(rows["prompt"]),
        max_new_tokens=value("max_completion_length"),
        batch_size=max(1, cfg.eval.batch_size // g),
        desc="sampling",
        sampling={
            "do_sample": True,
            "temperature": value("temperature"),
            "top_p": value("top_p"),
            "top_k": value("top_k") or None,
            "num_return_sequences": g,
        },
    )
    generated = [out for batch in batches for out in batch]
    columns = [c for c in rows.column_names if c != "prompt"]
    per_reward: dict[str, list[list[float | None]]] = {r.__name__: [] for r in rewards}
    for i, row in enumerate(rows):
        completions = [[{"role": "assistant", "content": text}] for text, _ in generated[i * g : (i + 1) * g]]
        extra = {c: [row[c]] * g for c in columns}
        for reward in rewards:
            per_reward[reward.__name__].append(reward(completions=completions, prompts=[row["prompt"]] * g, **extra))
    result = assess(per_reward, cfg.reward.weights, time.monotonic() - started)
    schedule = reward_schedule(cfg)
    end = dict(zip(schedule.names, schedule.last(cfg.max_steps), strict=True)) if schedule else {}
    return dataclasses.replace(result, tests_passed=_tests_passed(rewards, per_reward), end_weights=end)


def _tests_passed(rewards: list[Any], per_reward: dict[str, list[list[float | None]]]) -> dict[str, dict[str, float]]:
    from grpo_lab.rewards.code import tests

    out = {}
    for reward in rewards:
        if reward.func is tests:
            scores = [v for group in per_reward[reward.__name__] for v in group if v is not None]
            if scores:
                out[reward.__name__] = {
                    "any": sum(v > 0 for v in scores) / len(scores),
                    "all": sum(v == 1 for v in scores) / len(scores),
                }
    return out


def table(result: RewardCheck) -> str:
    scheduled = bool(result.end_weights)
    rows = [["reward", "weight (start -> end)" if scheduled else "weight", "mean", "std", "flat groups"]]
    for s in [*result.rewards, result.total]:
        weight = f"{s.weight:g}"
        if scheduled and s.name in result.end_weights and result.end_weights[s.name] != s.weight:
            weight += f" -> {result.end_weights[s.name]:g}"
        rows.append([s.name, weight, f"{s.mean:.3f}", f"{s.std:.3f}", f"{100 * s.flat_groups:.0f}%"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def write(result: RewardCheck, run_dir: Path) -> list[Path]:
    """reward_check.json (the numbers, the verdict) and reward_check.png (a histogram per reward and the total)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files.write_json(run_dir / REPORT, asdict(result))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [*result.rewards, result.total]
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3), squeeze=False)
    for ax, s in zip(axes[0], shown, strict=True):
        ax.hist(s.values, bins=20, color="tab:orange" if s.name == "total" else "tab:blue")
        ax.set_title(f"{s.name} (x{s.weight:g})" if s.name != "total" else "weighted total", fontsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Rewards of the untrained model: {result.prompts} prompts x {result.generations} completions")
    fig.tight_layout()
    fig.savefig(run_dir / PICTURE, dpi=100)
    plt.close(fig)
    return [run_dir / REPORT, run_dir / PICTURE]


__all__ = ["RewardCheck", "RewardStats", "assess", "check", "table", "write"]
