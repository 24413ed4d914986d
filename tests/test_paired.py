"""The leader against each runner-up on the same held-out items: real run-folder files, read by compare."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grpo_lab.compare import leaderboard
from grpo_lab.compare.sources import RunRecord, Source
from grpo_lab.evaluation.ranking import Verdict
from grpo_lab.evaluation.stats import mcnemar_exact, wilson
from grpo_lab.run.folder import RunFolder

QUESTIONS = [f"What is {i} + {i}?" for i in range(20)]


def _run(
    root: Path, name: str, correct: list[int], questions: list[str] = QUESTIONS, overrides: list[str] | None = None
) -> RunRecord:
    run_dir = root / name
    run_dir.mkdir()
    samples = [
        {"item": i, "question": q, "correct": c, "format": 1}
        for i, (q, c) in enumerate(zip(questions, correct, strict=True))
    ]
    RunFolder(run_dir).write_eval("eval_after", samples)
    accuracy = sum(correct) / len(correct)
    return RunRecord(
        name=name,
        state="finished",
        objective=accuracy,
        metrics={"eval_after/accuracy": accuracy},
        run_dir=run_dir,
        overrides=overrides or [],
    )


def _seeds(root: Path, config: str, rights: list[int]) -> list[RunRecord]:
    """One config's runs, one per seed, each right on its first `rights[seed]` of the 20 items."""
    return [
        _run(root, f"{config}_s{seed}", [1] * n + [0] * (20 - n), overrides=[f"lr={config}", f"seed={seed}"])
        for seed, n in enumerate(rights)
    ]


def _board(runs: list[RunRecord]) -> leaderboard.Board:
    source = Source("folder", "test", runs, runs[0].run_dir.parent, ["eval_after/accuracy"], ["maximize"])
    return leaderboard.build(source)


def test_one_seed_per_config_ties_every_config_and_still_pairs_the_models(tmp_path):
    """Two seeds of one config differ as much as two configs (benchmarks/selection.py): with one seed each no config
    is named better, however far apart the two models are on the same items; the paired test stays beside them."""
    strong = _run(tmp_path, "strong", [1] * 16 + [0] * 4, overrides=["lr=1"])
    weak = _run(tmp_path, "weak", [0] * 16 + [1] * 2 + [0] * 2, overrides=["lr=2"])  # lost 16 items, gained 2
    close = _run(tmp_path, "close", [1] * 15 + [0] * 5, overrides=["lr=3"])  # one item fewer
    board = _board([weak, close, strong])
    by_name = {row["run"]: row for row in board.rows}
    assert [row["run"] for row in board.rows] == ["strong", "close", "weak"]
    verdicts = {e.name: e.verdict for e in board.ranking.entries}
    assert verdicts == {"strong": Verdict.LEADER, "close": Verdict.TIED, "weak": Verdict.TIED}
    assert board.ranking.one_seed and [e.name for e in board.ranking.tied] == ["close", "weak"]
    assert (by_name["strong"]["ci_low"], by_name["strong"]["ci_high"]) == pytest.approx(wilson(16, 20))
    assert by_name["close"]["p_vs_#1"] == 1.0
    assert by_name["weak"]["p_vs_#1"] == pytest.approx(mcnemar_exact(16, 2))
    assert by_name["weak"]["diff_vs_#1"] == pytest.approx(-0.7)
    assert by_name["weak"]["diff_ci_low"] < -0.7 < by_name["weak"]["diff_ci_high"] < 0
    assert by_name["weak"]["vs_#1"] == "-70 pts (p=0.0013), ≈#1 (1 seed)"
    assert by_name["strong"]["vs_#1"] == "best, 1 seed"
    text = leaderboard.as_text(board)
    assert "ci95" in text.splitlines()[0] and by_name["close"]["vs_#1"] in text
    csv_text = leaderboard.write_csv(board, tmp_path / "board.csv").read_text()
    assert csv_text.splitlines()[0].endswith("ci_low,ci_high,diff_vs_#1,diff_ci_low,diff_ci_high,p_vs_#1")


def test_several_seeds_a_config_decide_by_welch_across_seeds(tmp_path):
    """A grid's jobs that differ only in `seed` are one config: configs are ranked by their seed mean, and one
    is behind only when Welch's test across the seeds says so."""
    strong = _seeds(tmp_path, "strong", [16, 17, 16])
    close = _seeds(tmp_path, "close", [15, 17, 15])
    weak = _seeds(tmp_path, "weak", [2, 3, 2])
    ranking = _board([*weak, *close, *strong]).ranking
    assert not ranking.one_seed and ranking.tested
    assert ranking.leader.name == "strong_s1"  # the best config's best seed
    assert [e.name for e in ranking.seeds_of(ranking.leader)] == ["strong_s1", "strong_s0", "strong_s2"]
    assert [c.name for c in ranking.configs] == ["strong_s0", "close_s0", "weak_s0"]
    verdicts = {e.name: e.verdict for e in ranking.entries}
    assert {verdicts[r.name] for r in close} == {Verdict.TIED} and {verdicts[r.name] for r in weak} == {Verdict.BEHIND}
    assert [e.name for e in ranking.best] == ["strong_s1"] and [e.name for e in ranking.tied] == ["close_s1"]
    # A config run on one seed can lead on its mean, but no other config can be shown to differ from it.
    lone = _run(tmp_path, "lone", [1] * 19 + [0], overrides=["lr=lone"])
    ranking = _board([*weak, lone, *close, *strong]).ranking
    assert ranking.leader.name == "lone" and ranking.configs[0].name == "lone"
    assert all(c.tied and math.isnan(c.p_vs_best) for c in ranking.configs[1:])


def test_runs_on_other_items_get_no_verdict(tmp_path):
    leader = _run(tmp_path, "leader", [1] * 20)
    other = _run(tmp_path, "other", [0] * 20, questions=[q + " (other set)" for q in QUESTIONS])
    no_items = RunRecord(name="w&b", state="finished", objective=0.1, metrics={"eval_after/accuracy": 0.1})
    board = _board([leader, other, no_items])
    rows = {row["run"]: row for row in board.rows}
    assert rows["other"]["vs_#1"] == rows["w&b"]["vs_#1"] == "≈#1 (1 seed)" and rows["w&b"]["ci95"] is None
    assert all(e.versus is None for e in board.ranking.entries)
    assert {e.verdict for e in board.ranking.entries[1:]} == {Verdict.TIED}  # one seed each: not told apart
    assert rows["other"]["ci95"] == "[0.00, 0.16]"  # its own interval, from its own items


def test_forest_plot_shows_the_leader_the_tied_and_the_rest(tmp_path):
    from PIL import Image

    from grpo_lab.compare import plots

    runs = [*_seeds(tmp_path, "strong", [16, 17]), *_seeds(tmp_path, "close", [15, 17])]
    runs += _seeds(tmp_path, "weak", [2, 3])
    (png,) = plots.forest(_board(runs), tmp_path)
    assert png.name == "forest.png"
    with Image.open(png) as image:
        colors = {rgb for _, rgb in image.convert("RGB").getcolors(1 << 16)}
    # matplotlib's tab:blue (leader), tab:orange (tied with it) and tab:gray (told apart from it)
    assert {(31, 119, 180), (255, 127, 14), (127, 127, 127)} <= colors
    # Runs without per-item results have no interval: no forest plot rather than an empty one.
    (tmp_path / "bare").mkdir()
    bare = RunRecord(name="bare", state="finished", objective=0.5, metrics={}, run_dir=tmp_path / "bare")
    assert plots.forest(_board([bare]), tmp_path / "bare") == []
