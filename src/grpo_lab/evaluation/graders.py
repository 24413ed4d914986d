"""Held-out graders as data: what `eval_before/<name>` and `eval_after/<name>` measure (`eval.graders`).

A grader is a reward-style function, `(completions, **dataset columns) -> list[float | None]`, named by a
built-in reward name or a dotted path exactly as a reward is; an item passes when its score is at least the
grader's `threshold` (None: the item cannot be graded and is left out). So any reward can serve as a grader
(`{_target_: length, threshold: 0.5}`), and each grader's share of passes gets its Wilson interval, the paired
change before -> after and its place in metrics.json, W&B, compare and the objective.

Before training, :func:`check_can_judge` asks whether each grader can judge the held-out data at all: a
grader whose function names a dataset column (`answer`) needs that column with references, and the tag
graders (`correctness`, `strict_format`...) need prompts that ask for the tags. Otherwise the run would
report 0% whatever the model answers; it fails in a second instead, naming the grader.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.config import EVAL_EXTRA_METRICS, GraderConfig
from grpo_lab.errors import ConfigError
from grpo_lab.rewards.registry import NamedReward, resolve_target

# The built-in functions that read the <answer>/<reasoning> tags: useless on prompts that never ask for them.
_READS_TAGS = frozenset(
    f"grpo_lab.rewards.{name}"
    for name in ("math.correctness", "math.int_answer", "format.strict_format", "format.soft_format", "format.xmlcount")
)
_TAG = "<answer>"

# What TRL passes a reward that is not a dataset column; a grader is called with the same names.
_NOT_COLUMNS = frozenset({"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric"})

# A graded item's own fields and the evaluation's other metrics: not a grader's name.
_RESERVED = frozenset({"item", "question", "answer", "completion", *EVAL_EXTRA_METRICS})

# The per-item key the first evaluations wrote for the math graders (eval_*.jsonl of older run folders).
_OLD_ITEM_KEYS = {"accuracy": "correct"}


@dataclass(frozen=True)
class Grader:
    name: str  # the metric's name: eval_after/<name>
    func: NamedReward
    threshold: float

    def grade(self, completions: list[Any], prompts: list[Any], columns: Mapping[str, list[Any]]) -> list[int | None]:
        """1/0 per completion (score >= threshold), None where the function could not grade it. Called as TRL
        calls a reward: completions (a conversation's are lists of messages), prompts and the data's columns."""
        scores = self.func(completions=completions, prompts=prompts, **columns)
        return [None if s is None else int(s >= self.threshold) for s in scores]


def build(specs: Mapping[str, GraderConfig]) -> list[Grader]:
    """One Grader per `eval.graders` entry, in the config's order (the first is the summary's headline)."""
    return [
        Grader(name, NamedReward(name, resolve_target(spec.target), spec.kwargs), spec.threshold)
        for name, spec in specs.items()
    ]


def item_value(sample: Mapping[str, Any], name: str) -> Any:
    """A graded item's 1/0/None for grader `name` (an eval_*.jsonl row, older folders' key names included)."""
    if name in sample:
        return sample[name]
    return sample.get(_OLD_ITEM_KEYS.get(name, name))


def columns(dataset: Any) -> dict[str, list[Any]]:
    """The columns a grader is given, as TRL gives a reward: every column of the data but the prompt."""
    return {c: list(dataset[c]) for c in dataset.column_names if c != "prompt"}


def as_completions(texts: list[str], prompts: list[Any]) -> list[Any]:
    """Completions in the shape TRL gives rewards: for a conversation prompt, a list holding one assistant message."""
    return [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t for t, p in zip(texts, prompts, strict=True)
    ]


def check_can_judge(graders: Sequence[Grader], dataset: Any) -> None:
    """Raise ConfigError, naming the grader, when one cannot judge this held-out data (see the module docstring)."""
    prompts, columns_ = dataset["prompt"], columns(dataset)
    asks_for_tags = any(_TAG in _text(p) for p in prompts)
    for grader in graders:
        if grader.name in _RESERVED:
            raise ConfigError(
                f"`eval.graders.{grader.name}`: that name is taken by a graded item's own fields "
                f"({', '.join(sorted(_RESERVED))}); name the grader otherwise."
            )
        for column in _column_params(grader.func):
            if not any(v is not None for v in columns_.get(column, ())):
                raise ConfigError(
                    f"`eval.graders.{grader.name}` ({_path(grader.func)}) grades against the data's `{column}` "
                    f"column, which the held-out data lacks or leaves empty: give the data that column, or grade "
                    f"with what this task can judge (`eval.graders=...`, and `objective.metric=eval_after/<name>`)."
                )
        if _path(grader.func) in _READS_TAGS and not asks_for_tags:
            raise ConfigError(
                f"`eval.graders.{grader.name}` ({_path(grader.func)}) reads the {_TAG} tags, but no held-out prompt "
                f"asks for them, so it would score 0% whatever the model answers: ask for the tags in the prompt, or "
                f"grade with something this task can judge (`eval.graders=...`, `objective.metric=eval_after/<name>`)."
            )


def _column_params(func: NamedReward) -> list[str]:
    """The dataset columns a grader's function reads: its named parameters, less TRL's own and its config kwargs."""
    try:
        params = inspect.signature(func.func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read off
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [q.name for q in params if q.kind in named and q.name not in _NOT_COLUMNS and q.name not in func.kwargs]


def _path(func: NamedReward) -> str:
    return f"{getattr(func.func, '__module__', '?')}.{getattr(func.func, '__qualname__', '?')}"


def _text(prompt: Any) -> str:
    """A prompt as text: a string, or a conversation's message contents."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, Mapping))
