"""Confirmation runs of a sweep, on real Optuna studies: the plan, the ranking by seed mean, ties, best.yaml.

The studies are built with Optuna's own `create_trial` (values chosen by hand), so that the statistics can be
checked against a hand computation; `test_sweeps.py` runs the same code end to end through the sweeper.
"""

from __future__ import annotations

import math

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution

from grpo_lab.evaluation.ranking import Verdict, from_trials
from grpo_lab.evaluation.stats import seed_mean, welch_p
from grpo_lab.sweep import confirm
from grpo_lab.sweep.report import write_best

LR = {"lr": FloatDistribution(1e-6, 1e-3, log=True)}
T_975_DF2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom (printed tables: 4.303)


def study_of(search: list[tuple[float, float]], confirmations: list[tuple[int, float, int]] = ()) -> optuna.Study:
    """A maximised study: search trials (lr, value), then confirmation trials (config trial, value, seed)."""
    study = optuna.create_study(direction="maximize")
    for lr, value in search:
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=LR, value=value))
    for of, value, seed in confirmations:
        attrs = {confirm.CONFIRM_OF: of, confirm.SEED: seed}
        lr = study.trials[of].params["lr"]
        study.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=LR, value=value, user_attrs=attrs))
    return study


def test_plan_repeats_the_top_k_configs_with_the_same_new_seeds():
    study = study_of([(1e-5, 0.9), (2e-5, 0.7), (3e-5, 0.3)])
    assert confirm.plan(study, top_k=2, seeds=2, base_seed=42) == [
        (0, {"lr": 1e-5}, 43),
        (0, {"lr": 1e-5}, 44),
        (1, {"lr": 2e-5}, 43),
        (1, {"lr": 2e-5}, 44),
    ]
    confirm.enqueue(study, confirm.plan(study, top_k=1, seeds=1, base_seed=0))
    assert confirm.planned(study) == 1
    (waiting,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting.user_attrs == {confirm.CONFIRM_OF: 0, confirm.SEED: 1}
    assert optuna.create_study().user_attrs.get("grpo_lab_confirm_planned") is None


def test_a_config_that_won_once_by_luck_is_not_crowned(tmp_path):
    # Config A (trial 0) won the search with a lucky 0.9; with two more seeds it scores 0.2 and 0.3.
    # Config B (trial 1) was second with 0.7 and stays there: 0.72, 0.68.
    study = study_of(
        [(1e-5, 0.9), (2e-5, 0.7), (3e-5, 0.3)], [(0, 0.2, 43), (0, 0.3, 44), (1, 0.72, 43), (1, 0.68, 44)]
    )
    assert study.best_trial.number == 0  # what Optuna, and a sweeper that takes max(objective), would crown
    a, b = (0.9, 0.2, 0.3), (0.7, 0.72, 0.68)
    ranking = from_trials(study)
    ranked = ranking.configs
    assert [r.trial for r in ranked] == [1, 0]
    assert ranked[0].values == b and ranked[1].values == a
    # By hand: B's mean 0.7, sample sd 0.02, 95% half-width t(0.975, 2) * 0.02 / sqrt(3).
    half = T_975_DF2 * 0.02 / math.sqrt(3)
    assert ranked[0].mean.mean == pytest.approx(0.7)
    assert (ranked[0].mean.ci_low, ranked[0].mean.ci_high) == pytest.approx((0.7 - half, 0.7 + half))
    # Welch by hand: t = (mean_b - mean_a) / sqrt(var_a/3 + var_b/3), Welch-Satterthwaite degrees of freedom.
    var_a, var_b = sum((x - 0.4666666666666667) ** 2 for x in a) / 2, 0.0004
    se2 = var_a / 3 + var_b / 3
    t = (0.7 - 0.4666666666666667) / math.sqrt(se2)
    df = se2**2 / ((var_a / 3) ** 2 / 2 + (var_b / 3) ** 2 / 2)
    from scipy import stats

    assert ranked[1].p_vs_best == pytest.approx(2 * stats.t.sf(t, df))
    assert ranked[1].tied  # p ~ 0.47: three seeds cannot tell A from B, and the output says so
    assert ranking.leader.trial == 1 and [e.trial for e in ranking.tied] == [0]
    # B's config first, then A's, each config's runs by value; trial 2 was not confirmed: behind
    assert [e.trial for e in ranking.ranked] == [5, 1, 6, 0, 4, 3, 2]
    assert ranking.entries[-1].verdict is Verdict.BEHIND and ranking.entries[-1].versus is None
    best = yaml.safe_load(write_best(study, tmp_path / "best.yaml", metrics=["m"], storage="mem").read_text())
    assert best["trial"] == 1 and best["tied_with"] == [0]
    assert [c["trial"] for c in best["confirm"]] == [1, 0] and best["confirm"][0]["mean"] == pytest.approx(0.7)
    assert "#0" in confirm.verdict(ranking)  # the line names the config tied with the winner


def test_a_clear_winner_is_not_called_tied():
    study = study_of([(1e-5, 0.5), (2e-5, 0.8)], [(0, 0.52, 43), (0, 0.49, 44), (1, 0.81, 43), (1, 0.79, 44)])
    ranking = from_trials(study)
    ranked = ranking.configs
    assert [r.trial for r in ranked] == [1, 0] and ranked[1].p_vs_best < 0.001 and not ranked[1].tied
    assert ranking.tied == () and {e.verdict for e in ranking.entries if e.trial in (0, 2, 3)} == {Verdict.BEHIND}
    assert "#0" not in confirm.verdict(ranking)  # nothing tied to name
    assert len(confirm.table(ranking).splitlines()) == 3  # a header and one line per config


def test_equal_search_values_are_a_tie_not_a_win(tmp_path):
    # A smoke sweep where every trial scored 0.0: trial 0 is "best" only by its number.
    study = study_of([(1e-5, 0.0), (2e-5, 0.0), (3e-5, 0.0)])
    assert [e.trial for e in from_trials(study).tied] == [1, 2]
    best = yaml.safe_load(write_best(study, tmp_path / "best.yaml", metrics=["m"], storage="mem").read_text())
    assert best["trial"] == 0 and best["tied_with"] == [1, 2] and "confirm" not in best


def test_seed_statistics_edge_cases():
    assert math.isnan(seed_mean([0.5]).ci_low) and seed_mean([0.5]).mean == 0.5
    assert seed_mean([]).n == 0
    assert math.isnan(welch_p([0.5], [0.4, 0.6]))  # one seed: nothing to test
    assert welch_p([0.5, 0.5], [0.5, 0.5]) == 1.0 and welch_p([0.5, 0.5], [0.6, 0.6]) == 0.0


def test_a_multi_objective_study_has_no_ranking():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(optuna.trial.create_trial(params={"lr": 1e-5}, distributions=LR, values=[0.5, 40.0]))
    ranking = from_trials(study)
    assert ranking.configs == () and ranking.tied == () and ranking.leader is None
    assert [e.trial for e in ranking.best] == [0]


def test_compare_of_a_confirmed_study_leads_and_exports_the_seed_mean_winner(tmp_path):
    from grpo_lab.compare import export, leaderboard
    from grpo_lab.compare.sources import from_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    lucky = study_of(
        [(1e-5, 0.9), (2e-5, 0.7), (3e-5, 0.3)], [(0, 0.2, 43), (0, 0.3, 44), (1, 0.72, 43), (1, 0.68, 44)]
    )
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.add_trials(lucky.trials)
    board = leaderboard.build(from_study(url, "s", out_dir=tmp_path))
    assert export.pick(board, None).trial == 1  # not trial 0, the luckiest single value
    assert [row["run"] for row in board.rows][:3] == ["trial_5", "trial_1", "trial_6"]  # config #1's runs first
    assert board.ranking.leader.trial == 1 and [e.trial for e in board.ranking.tied] == [0]
