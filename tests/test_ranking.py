"""The one ranking: order, leader, ties and the re-run command, from run records and from Optuna studies."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution

from grpo_lab.compare.sources import RunRecord
from grpo_lab.evaluation.ranking import Verdict, from_runs, from_trials

LR = {"lr": FloatDistribution(1e-6, 1e-3, log=True)}


def _run(name: str, objective: float | None, state: str = "finished", **kw) -> RunRecord:
    return RunRecord(name=name, state=state, objective=objective, overrides=[f"lr={objective}"], **kw)


def test_runs_best_first_with_unfinished_ones_last_in_their_order():
    runs = [_run("failed", None, "failed"), _run("low", 0.2), _run("high", 0.6), _run("pruned", None, "pruned")]
    ranking = from_runs(runs, ["maximize"])
    assert [e.name for e in ranking.entries] == ["high", "low", "failed", "pruned"]
    assert [e.verdict for e in ranking.entries] == [Verdict.LEADER, Verdict.TIED, Verdict.UNRANKED, Verdict.UNRANKED]
    # one seed per config: the best leads, and no config is shown to differ from it
    assert ranking.leader.name == "high" and [e.name for e in ranking.tied] == ["low"] and not ranking.tested
    assert ranking.one_seed
    assert ranking.leader.command == "python -m grpo_lab lr=0.6"


def test_a_minimised_objective_and_equal_values_tie():
    values = {"a": 3.0, "b": 1.0, "c": 1.0}
    runs = [RunRecord(name=n, state="finished", objective=v, overrides=[f"x={n}"]) for n, v in values.items()]
    ranking = from_runs(runs, ["minimize"])
    assert ranking.leader.name == "b" and [e.name for e in ranking.tied] == ["c", "a"]


def test_a_grids_jobs_that_differ_only_in_their_seed_are_one_config():
    values = {("1e-5", 1): 0.30, ("1e-5", 2): 0.32, ("1e-5", 3): 0.31, ("2e-5", 1): 0.5, ("2e-5", 2): 0.52}
    values[("2e-5", 3)] = 0.51
    runs = [
        RunRecord(name=f"{lr}-{seed}", state="finished", objective=value, overrides=[f"lr={lr}", f"++seed={seed}"])
        for (lr, seed), value in values.items()
    ]
    ranking = from_runs(runs, ["maximize"])
    assert not ranking.one_seed and [c.name for c in ranking.configs] == ["2e-5-1", "1e-5-1"]
    assert ranking.configs[0].mean.mean == 0.51 and ranking.configs[0].trial is None
    assert ranking.leader.name == "2e-5-2" and [e.name for e in ranking.best] == ["2e-5-2"] and ranking.tied == ()
    assert {e.verdict for e in ranking.entries if e.name.startswith("1e-5")} == {Verdict.BEHIND}
    assert ranking.entries[-1].versus.test == "welch" and ranking.entries[-1].versus.p_value < 0.001


def test_a_sweep_without_confirmation_runs_cannot_tell_its_trials_apart():
    study = optuna.create_study(direction="maximize")
    for value in (0.3, 0.5, 0.4):
        study.add_trial(optuna.trial.create_trial(params={"lr": 1e-5}, distributions=LR, value=value))
    ranking = from_trials(study)
    assert ranking.one_seed and ranking.leader.trial == 1 and [e.trial for e in ranking.tied] == [2, 0]


def test_an_unfinished_run_with_a_value_is_listed_but_never_leads():
    ranking = from_runs([_run("cut", 0.9, "interrupted"), _run("done", 0.5)], ["maximize"])
    assert [e.name for e in ranking.entries] == ["done", "cut"]  # unranked entries last, whatever their value
    assert ranking.leader.name == "done" and ranking.entries[-1].verdict is Verdict.UNRANKED


def test_nothing_finished_has_no_leader():
    ranking = from_runs([_run("x", None, "failed")], ["maximize"])
    assert ranking.leader is None and ranking.ranked == ()


def test_several_objectives_lead_with_the_pareto_front():
    runs = [
        _run("dominated", 0.4, values=[0.4, 50.0], trial=0),
        _run("accurate", 0.9, values=[0.9, 80.0], trial=1),
        _run("short", 0.5, values=[0.5, 20.0], trial=2),
    ]
    ranking = from_runs(runs, ["maximize", "minimize"])
    assert {e.trial for e in ranking.best} == {1, 2} and ranking.leader is None and ranking.tied == ()
    assert ranking.entries[-1].trial == 0 and ranking.entries[-1].verdict is Verdict.BEHIND


def test_the_front_of_a_study_is_optunas():
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([0.4, 50.0], [0.9, 80.0], [0.5, 20.0], [0.5, 20.0], [0.3, 90.0]):
        study.add_trial(optuna.trial.create_trial(params={"lr": 1e-5}, distributions=LR, values=values))
    assert {e.trial for e in from_trials(study).best} == {t.number for t in study.best_trials}


def test_a_study_ranks_complete_trials_and_keeps_the_rest_unranked():
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={"lr": 1e-5}, distributions=LR, value=0.3))
    study.add_trial(
        optuna.trial.create_trial(params={"lr": 2e-5}, distributions=LR, state=optuna.trial.TrialState.FAIL)
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 3e-5}, distributions=LR, value=0.5, user_attrs={"overrides": ["++lr=3e-05", "++trial={id:2}"]}
        )
    )
    ranking = from_trials(study)
    assert [e.trial for e in ranking.entries] == [2, 0, 1]
    assert ranking.entries[-1].verdict is Verdict.UNRANKED
    assert ranking.leader.command == "python -m grpo_lab lr=3e-05"  # the sweep's machinery left out
