"""Reward curricula (issue #29): `reward.schedule`, its rules, its callback in real runs, resumed runs, the sweep.

The runs are real CLI runs of the tiny model with real offline W&B files read back; the schedule's arithmetic is
checked against hand-computed weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_lab import config as config_mod
from grpo_lab.config.overrides import key
from grpo_lab.config.schedule import build
from grpo_lab.config.schedule import of_run as schedule_of
from grpo_lab.errors import ConfigError
from wandb_files import find_runs, read_run

from conftest import compose, error_line, one_line_naming, run_cli

NAMES = ["a", "b"]
FAST = ["experiment=smoke", "eval.before=false", "output.save_model=false"]
ALL_ZERO = [f"reward.weights.{n}=0" for n in ("length", "correctness", "int_answer", "strict_format", "soft_format")]
ALL_ZERO.append("reward.weights.xmlcount=0")


def test_a_schedule_is_piecewise_linear_in_progress() -> None:
    schedule = build(NAMES, {"a": 1.0, "b": 0.5}, {"a": [[0, 1.0], [0.5, 3.0]]}, "fraction", 10)
    assert [schedule.weight("a", x) for x in (0, 0.25, 0.5, 0.9, 1.0)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert schedule.weight("b", 0.7) == 0.5  # no schedule: its fixed weight
    assert schedule.at_step(5, 10) == [3.0, 0.5]
    assert schedule.describe() == ["a 1 -> 3 (0% -> 50%)"]


def test_a_reward_that_enters_later_weighs_0_before_its_first_point_and_ramps_can_be_written_as_such() -> None:
    later = build(NAMES, {"a": 1.0, "b": 0.0}, {"b": [[0.5, 0.2], [1.0, 0.6]]}, "fraction", 4)
    assert [later.weight("b", x) for x in (0, 0.49, 0.5, 0.75, 1.0)] == [0.0, 0.0, 0.2, pytest.approx(0.4), 0.6]
    ramp = build(NAMES, {"a": 1.0, "b": 0.2}, {"b": {"start": 0.2, "end": 0.6, "from": 0.5}}, "fraction", 4)
    assert [ramp.weight("b", x) for x in (0, 0.49, 0.5, 0.75, 1.0)] == [0.2, 0.2, 0.2, pytest.approx(0.4), 0.6]
    assert ramp.last(4) == [1.0, pytest.approx(0.4)]  # the last step trains at 3/4, never at 1.0
    in_steps = build(NAMES, {"a": 1.0, "b": 0.5}, {"b": [[0, 0.5], [20, 1.5]]}, "steps", 40)
    assert in_steps.at_step(10, 40) == [1.0, 1.0] and in_steps.record() == {"b": [[0.0, 0.5], [0.5, 1.5]]}


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["reward.schedule.strict_fromat=[[0,0.5],[0.5,0.8]]"], ["reward.schedule.strict_format"]),
        (["reward.schedule.strict_format=[[0,0.5],[0.5,0.8],[0.4,1]]"], ["strict_format", "increase"]),
        (["reward.schedule.strict_format=[[0,0.5],[1.5,0.8]]"], ["strict_format", "between 0 and 1"]),
        (["reward.schedule.strict_format=[[0,0.5],[0.5,-0.1]]"], ["strict_format", "negative"]),
        (
            ["reward.weights.strict_format=0.5", "reward.schedule.strict_format=[[0,0.9],[0.5,0.8]]"],
            ["reward.weights.strict_format", "0.9", "0.5"],
        ),
        (["reward.schedule.strict_format=[[0,0.5],[0.5]]"], ["strict_format", "[x, weight]"]),
        (["reward.schedule.strict_format={start: 0.5}"], ["strict_format", "ramp"]),
        (["reward.schedule.strict_format={start: 0.5, end: 1, from: 0.6, to: 0.4}"], ["strict_format", "from", "to"]),
        (["reward.schedule.strict_format=[[0,0.5],[0.5,nan]]"], ["strict_format", "finite"]),
        (["reward.schedule_unit=steps", "reward.schedule.strict_format=[[0,0.5],[5,0.8]]"], ["max_steps"]),
        (
            [*ALL_ZERO, "reward.schedule.length=[[0.5,1.0]]"],
            ["reward.schedule", "every weight is 0"],
        ),
    ],
)
def test_a_bad_schedule_fails_in_one_line(overrides: list[str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_given("experiment=smoke", "max_steps=4", *overrides)
    one_line_naming(caught.value, *needles)


def load_given(*overrides: str) -> config_mod.RunConfig:
    """The settings as `python -m grpo_lab OVERRIDES` checks them: the keys typed are the keys given."""
    return config_mod.load(compose(list(overrides)), given=[key(o) for o in overrides])


def test_a_schedule_owns_its_rewards_weight_unless_both_are_given_and_disagree() -> None:
    # The preset's xmlcount weight is not 0; a schedule that starts it at 0 is the user's word for it.
    assert compose(["experiment=smoke"]).reward.weights.xmlcount != 0
    run = load_given("experiment=smoke", "reward.schedule.xmlcount=[[0,0.0],[1.0,1.0]]")
    assert schedule_of(run).weight("xmlcount", 0.0) == 0.0
    load_given("experiment=smoke", "reward.weights.xmlcount=0", "reward.schedule.xmlcount=[[0,0.0],[1.0,1.0]]")
    with pytest.raises(ConfigError) as caught:
        load_given("experiment=smoke", "reward.weights.xmlcount=0.3", "reward.schedule.xmlcount=[[0,0.0],[1.0,1.0]]")
    one_line_naming(caught.value, "`reward.weights.xmlcount", "0.3", "give one of them")


def test_a_bad_schedule_fails_before_any_model_loads(tmp_path: Path, model_cache: Path) -> None:
    proc = run_cli([*FAST, "reward.schedule.lenght=[[0,1.0],[1,0.2]]"], tmp_path, model_cache, timeout=120)
    assert proc.returncode == 1
    error_line(proc, "reward.schedule.lenght", "reward.schedule.length")
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("metrics.json"))


def test_the_recipes_and_the_sweep_compose() -> None:
    run = config_mod.load(compose(["experiment=quickstart_staged"]))
    schedule = schedule_of(run)
    assert dict(zip(schedule.names, schedule.weights(1.0), strict=True)) == {
        "correctness": 3.0,
        "int_answer": 0.3,
        "strict_format": 0.8,
        "soft_format": 0.2,
        "xmlcount": 0.15,
    }
    assert schedule.weights(0.0) == config_mod.load(compose(["experiment=quickstart"])).reward.ordered_weights()
    # The curriculum sweep's ramp on top of the staged recipe's: the same form, so they compose.
    both = config_mod.load(compose(["experiment=quickstart_staged", "sweep=curriculum"]))
    assert both.reward.schedule["strict_format"] == {"start": 0.5, "end": 1.0, "from": 0.0, "to": 0.5}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_smoke_run_applies_the_schedule_at_every_step(tmp_path: Path, model_cache: Path) -> None:
    """length falls from 1.0 to 0.2 by the middle of 6 steps: the weight TRL scored each step with is in history.jsonl,
    the offline W&B run, the summary and metrics.json."""
    proc = run_cli([*FAST, "max_steps=6", "reward.schedule.length=[[0,1.0],[0.5,0.2]]"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    history = _lines(run_dir / "history.jsonl")
    expected = [1.0, 1.0 - 0.8 / 3, 1.0 - 1.6 / 3, 0.2, 0.2, 0.2]  # step s is scored at progress (s - 1) / 6
    assert [row["reward_weights/length"] for row in history] == pytest.approx(expected)
    assert {row["reward_weights/correctness"] for row in history} == {2.0}  # not scheduled: fixed
    # TRL's weighted reward is the scheduled sum: the length reward's mean times its weight, the others 0 here.
    for row in history:
        assert row["reward"] == pytest.approx(row["reward_weights/length"] * row["rewards/length/mean"], abs=1e-5)
    assert "weights      length 1 -> 0.2 (steps 1 -> 6), as scheduled" in proc.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["reward_schedule"] == {"length": [[0.0, 1.0], [0.5, 0.2]]}
    (run_path,) = find_runs(run_dir)
    logged = [
        row["train/reward_weights/length"] for row in read_run(run_path).history if "train/reward_weights/length" in row
    ]
    assert logged == pytest.approx(expected)


def test_a_resumed_run_continues_its_schedule(tmp_path: Path, model_cache: Path) -> None:
    schedule = ["reward.schedule_unit=steps", "reward.schedule.length=[[0,1.0],[4,0.2]]"]
    checkpoints = ["trainer.save_strategy=steps", "trainer.save_steps=2"]
    first = run_cli([*FAST, "max_steps=4", *checkpoints, *schedule], tmp_path, model_cache)
    assert first.returncode == 0, first.stderr[-4000:]
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").rglob("metrics.json")]
    proc = run_cli([*FAST, "max_steps=6", *checkpoints, *schedule, f"resume={run_dir}"], tmp_path, model_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    weights = [row["reward_weights/length"] for row in _lines(run_dir / "history.jsonl")]
    assert weights == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])  # steps 5 and 6 after the resume, from step 4


def test_the_curriculum_sweep_varies_the_schedules(tmp_path: Path, model_cache: Path) -> None:
    proc = run_cli(
        ["-m", "sweep=curriculum", "experiment=smoke", "hydra.sweeper.n_trials=3", "max_steps=2", "eval.before=false"],
        tmp_path,
        model_cache,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").rglob("metrics.json"))
    assert len(runs) == 3
    schedules = [json.loads((r / "metrics.json").read_text())["reward_schedule"]["strict_format"] for r in runs]
    assert len({json.dumps(s) for s in schedules}) == 3  # every trial its own ramp
    for run_dir in runs:
        history = _lines(run_dir / "history.jsonl")
        assert all("reward_weights/strict_format" in row for row in history)
    assert "eval_after/accuracy" in proc.stdout


def test_check_rewards_shows_the_weights_at_the_start_and_the_end() -> None:
    import dataclasses

    from grpo_lab.run import reward_check

    result = reward_check.assess({"a": [[1.0, 0.0]], "b": [[0.0, 0.0]]}, {"a": 1.0, "b": 0.5})
    plain = reward_check.table(result)
    assert "weight " in plain and "->" not in plain
    scheduled = reward_check.table(dataclasses.replace(result, end_weights={"a": 3.0, "b": 0.5}))
    assert "weight (start -> end)" in scheduled and "1 -> 3" in scheduled
