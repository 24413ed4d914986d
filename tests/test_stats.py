"""Intervals and paired tests against published values, and the coverage they promise, by simulation."""

from __future__ import annotations

import random

import pytest

from grpo_lab.evaluation.evaluate import EvalResult, change_metrics
from grpo_lab.evaluation.stats import detectable_difference, mcnemar_exact, paired_change, wilson

from conftest import one_line_naming


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, score method.
@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_matches_newcombes_table(k, n, low, high):
    assert wilson(k, n) == pytest.approx((low, high), abs=5e-5)


def test_the_quickstarts_7_of_32_spans_11_to_39_percent():
    low, high = wilson(7, 32)
    assert round(low, 2) == 0.11 and round(high, 2) == 0.39


def test_exact_mcnemar():
    assert mcnemar_exact(0, 6) == pytest.approx(0.03125)  # 6 discordant items, all one way: 2 / 2**6
    assert mcnemar_exact(6, 0) == mcnemar_exact(0, 6)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)


def _paired_sample(rng: random.Random, n: int, p_before: float, flip_up: float, flip_down: float):
    before = [rng.random() < p_before for _ in range(n)]
    after = [(rng.random() >= flip_down) if b else (rng.random() < flip_up) for b in before]
    return before, after


def test_paired_interval_covers_the_true_change_95_percent_of_the_time():
    rng = random.Random(0)
    p_before, flip_up, flip_down, n = 0.3, 0.25, 0.1, 60
    truth = (1 - p_before) * flip_up - p_before * flip_down  # E[after] - E[before]
    runs = 2000
    covered = 0
    for _ in range(runs):
        change = paired_change(*_paired_sample(rng, n, p_before, flip_up, flip_down))
        assert change.ci_low <= change.change <= change.ci_high
        covered += change.ci_low <= truth <= change.ci_high
    assert 0.93 <= covered / runs <= 0.975, covered / runs


def test_paired_change_counts_and_bounds():
    before = [True, True, False, False, False, True]
    after = [True, False, True, True, False, True]
    change = paired_change(before, after)
    assert (change.gained, change.lost, change.n) == (2, 1, 6)
    assert change.change == pytest.approx(1 / 6)
    assert -1 <= change.ci_low < 0 < change.ci_high <= 1  # 3 flips out of 6 decide nothing
    assert change.p_value == 1.0
    same = paired_change([True] * 5 + [False] * 5, [True] * 5 + [False] * 5)
    assert same.change == 0 and same.p_value == 1.0 and same.ci_low < 0 < same.ci_high
    with pytest.raises(ValueError) as error:
        paired_change([True, False], [True, False, True, True, False])
    one_line_naming(error.value, "2", "5")  # both counts


def test_detectable_difference_shrinks_with_the_square_root_of_n():
    assert detectable_difference(32) == pytest.approx(2 * detectable_difference(128))
    assert 0.24 < detectable_difference(32) < 0.25  # the quick-start's 32 items: ~25 points


def _result(correct: list[bool | None], formatted: list[bool]) -> EvalResult:
    samples = [
        {"item": i, "completion": "", "accuracy": c, "format": f}
        for i, (c, f) in enumerate(zip(correct, formatted, strict=True))
    ]
    graded = [c for c in correct if c is not None]
    shares = {"accuracy": sum(graded) / len(graded), "format": sum(formatted) / len(formatted)}
    return EvalResult(shares, len(samples), 10.0, samples)


def test_eval_metrics_carry_intervals_and_the_change_pairs_the_same_items():
    before = _result([False, False, None, True, False, False], [False] * 6)
    after = _result([True, True, None, True, False, True], [True] * 6)
    m = before.metrics("eval_before") | after.metrics("eval_after")
    assert (m["eval_after/accuracy_ci_low"], m["eval_after/accuracy_ci_high"]) == pytest.approx(wilson(4, 5))
    assert m["eval_before/format_ci_low"] == 0.0 and m["eval_before/format_ci_high"] == pytest.approx(wilson(0, 6)[1])
    change = change_metrics(before, after)
    assert change["eval_change/accuracy"] == pytest.approx(3 / 5)  # the item without a reference is left out
    assert (change["eval_change/accuracy_gained"], change["eval_change/accuracy_lost"]) == (3.0, 0.0)
    assert change["eval_change/accuracy_p_value"] == pytest.approx(0.25)
    assert change["eval_change/format"] == 1.0 and change["eval_change/format_p_value"] == pytest.approx(2 / 64)
