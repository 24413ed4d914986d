"""The names of the metrics a run produces, and the check that a name is one of them (objectives, pruners).

A run's metrics: `eval_before/<grader>` and `eval_after/<grader>` for each held-out grader (`eval.graders`) and
`mean_length`, the sampled pass@k of the first grader with `eval.samples`, and `train/<key>` for every key the trainer
logs (`train/reward_end`, `train/kl` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_lab.config.problems import Problem, fail, nearest

EVAL_EXTRA_METRICS = ("mean_length",)  # what an evaluation measures besides its graders' shares


def pass_k_name(grader: str, k: int, graders: Sequence[str]) -> str:
    """The metric of grader `grader`'s sampled pass@k (`eval.samples`): `pass@1` -> `pass@5`, `syntax` -> `syntax@5`;
    `_sampled` is added where that is a greedy grader's own name (`pass@1` sampled, at k=1).

    >>> pass_k_name("pass@1", 5, ["pass@1"]), pass_k_name("pass@1", 1, ["pass@1"]), pass_k_name("ok", 2, ["ok"])
    ('pass@5', 'pass@1_sampled', 'ok@2')
    """
    name = f"{grader.removesuffix('@1')}@{k}"
    return f"{name}_sampled" if name in graders else name


# The test part's metrics (grpo_lab.data: graded to report, after any choice).
TEST_PREFIXES = ("test_before", "test_after", "test_change")


def eval_metric_names(graders: Sequence[str], samples: int | None, pass_k: Sequence[int]) -> list[str]:
    """What an evaluation reports: each grader's greedy share and, with `eval.samples`, the first grader's pass@k
    (EVAL_EXTRA_METRICS besides)."""
    sampled = [pass_k_name(graders[0], k, graders) for k in pass_k] if samples is not None and graders else []
    return [*graders, *sampled]


def metric_problem(metric: str, graders: Sequence[str] | None = None, key: str = "objective.metric") -> Problem | None:
    """What is wrong with `metric` as a metric a run produces: eval_before/eval_after + a grader's name (any name
    when `graders` is None: the job checks it against its own `eval.graders`) or `mean_length`, or train/<logged
    key>; None when nothing is."""
    prefix, _, name = metric.partition("/")
    known = [*(graders or ()), *EVAL_EXTRA_METRICS]
    if prefix in TEST_PREFIXES:  # what chooses reads validation only: a choice on test items is reported biased
        instead = f"eval_{prefix.removeprefix('test_')}/{name}" if name else "eval_after/<grader>"
        must = (
            f"names the test part, which reports and never chooses (a winner chosen on it is scored on it, biased "
            f"upward); choose on the validation part: `{instead}`."
        )
        return Problem(key, "rule", metric, must)
    if prefix in ("eval_before", "eval_after") and name:
        if graders is not None and name not in known:
            near = nearest(name, known)
            must = f"be {prefix}/<{'|'.join(known)}> (`eval.graders`)"
            return Problem(key, "choice", metric, must, near=near and f"{prefix}/{near}")
    elif prefix != "train" or not name:
        must = (
            "be `eval_after/<grader>` (a name in `eval.graders`, or mean_length), `eval_before/...`, "
            "or `train/<logged key>` (e.g. `train/reward_end`, `train/kl`)"
        )
        return Problem(key, "choice", metric, must)
    return None


def check_metric_name(metric: str, graders: Sequence[str] | None = None, key: str = "objective.metric") -> None:
    """:func:`metric_problem`, raised as one ConfigError."""
    if (problem := metric_problem(metric, graders, key)) is not None:
        raise fail(problem)
