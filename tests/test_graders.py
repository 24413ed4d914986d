"""Held-out graders as data (`eval.graders`): an own task with an own grader is evaluated, ranked and swept
like the math recipe; a grader that cannot judge the data says so before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_lab.config import GraderConfig
from grpo_lab.errors import ConfigError
from grpo_lab.evaluation.graders import build, check_can_judge

from conftest import FAST, REPO, load_study, run_cli, write_sweep

TESTS = str(REPO / "tests")
TAGGED = [[{"role": "system", "content": "Answer in <answer>...</answer>."}, {"role": "user", "content": "1+1?"}]]
PLAIN = [[{"role": "user", "content": "What is 7 times 9? Reply with the number only."}]]


def _data(columns: dict, prompts: list):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": p, **{c: v[i] for c, v in columns.items()}} for i, p in enumerate(prompts)])


def _graders(**targets: str):
    return build({name: GraderConfig(target=t, threshold=1.0, kwargs={}) for name, t in targets.items()})


def test_a_reward_serves_as_a_grader_through_its_threshold():
    spec = GraderConfig(target="length", threshold=0.5, kwargs={"ideal_length": 4, "unit": "chars"})
    (grader,) = build({"long": spec})
    assert grader.grade(["abcd", "a" * 40], ["q", "q"], {}) == [1, 0]


@pytest.mark.parametrize(
    ("targets", "columns", "prompts", "key"),
    [
        ({"accuracy": "correctness"}, {}, TAGGED, "eval.graders.accuracy"),  # no reference column
        ({"accuracy": "correctness"}, {"answer": [None]}, TAGGED, "eval.graders.accuracy"),  # references all empty
        ({"format": "strict_format"}, {"answer": ["63"]}, PLAIN, "eval.graders.format"),  # no tags asked for
        ({"exact": "own_task.exact"}, {"question": ["q"]}, PLAIN, "eval.graders.exact"),  # own grader's column
        ({"item": "own_task.digits"}, {}, PLAIN, "eval.graders.item"),  # a name a graded item uses itself
    ],
)
def test_a_grader_that_cannot_judge_the_data_fails_naming_it(monkeypatch, targets, columns, prompts, key):
    monkeypatch.syspath_prepend(TESTS)
    with pytest.raises(ConfigError) as caught:
        check_can_judge(_graders(**targets), _data(columns, prompts))
    message = str(caught.value)
    assert f"`{key}`" in message and "\n" not in message


def test_graders_that_fit_the_data_pass(monkeypatch):
    monkeypatch.syspath_prepend(TESTS)
    check_can_judge(_graders(accuracy="correctness", format="strict_format"), _data({"answer": ["2"]}, TAGGED))
    check_can_judge(_graders(exact="own_task.exact", digits="own_task.digits"), _data({"answer": ["63"]}, PLAIN))


def _own_task(folder: Path) -> list[str]:
    """A JSONL task of plain questions (no tags asked for) with an `answer` column, as a user brings one."""
    rows = [
        {"prompt": f"What is {a} times {b}? Reply with the number only.", "answer": str(a * b)}
        for a in range(2, 13)
        for b in range(2, 13)
    ]
    path = folder / "times.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 121 rows: 24 to validation and 24 to test (20 of each graded: the smoke preset's sizes), the rest to train.
    return ["data=jsonl", f"data.path={path}", "data.system_prompt=", "data.num_shots=0"]


OWN_GRADER = [
    "eval/graders=none",
    "+eval.graders.exact={_target_: own_task.exact}",
    "objective.metric=eval_after/exact",
]


def test_the_math_graders_refuse_an_own_task_before_training(tmp_path, model_cache):
    proc = run_cli([*FAST, *_own_task(tmp_path)], tmp_path, model_cache, PYTHONPATH=TESTS)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "`eval.graders.accuracy`" in errors[0]
    assert not list(tmp_path.glob("outputs/runs/*/*/trainer"))  # it stopped before training


def test_an_own_grader_is_evaluated_with_its_interval_and_change_and_a_sweep_optimises_it(tmp_path, model_cache):
    grader = [*OWN_GRADER, "+eval.graders.digits={_target_: own_task.digits, threshold: 0.5}", "eval.before=true"]
    sweep = write_sweep(
        tmp_path / "conf",
        "own",
        "hydra:\n  sweeper:\n    study_name: own\n    n_trials: 2\n"
        "    objectives: [{metric: eval_after/exact, direction: maximize}]\n"
        "    params:\n      lr: choice(1e-4, 1e-3)\n",
    )
    proc = run_cli(["-m", *sweep, *FAST, *_own_task(tmp_path), *grader], tmp_path, model_cache, PYTHONPATH=TESTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = load_study(tmp_path, "own").trials
    assert len(trials) == 2 and all(t.value is not None for t in trials)
    for trial in trials:
        m = json.loads((tmp_path / f"outputs/sweeps/own/trial_{trial.number}/metrics.json").read_text())["metrics"]
        assert m["eval_after/exact"] == pytest.approx(trial.value)  # the sweep optimised the own grader's score
        assert m["eval_after/exact_ci_low"] <= m["eval_after/exact"] <= m["eval_after/exact_ci_high"]
        assert {"eval_change/exact", "eval_change/digits_p_value", "eval_before/digits"} <= set(m)
        assert "eval_after/accuracy" not in m
    rows = [json.loads(line) for line in next(tmp_path.glob("outputs/sweeps/own/trial_0/eval_after.jsonl")).open()]
    assert {"exact", "digits"} <= set(rows[0]) and all(r["exact"] in (0, 1) for r in rows)
