"""How often the grid's answer names a winner among identical configs (a false winner), and how often the validation
winner loses on the test items.

Trains N runs of one preset that differ only in `seed` (single runs: each grades validation and the test part before
and after), then forms comparisons from them as a grid's end would see them: every pair, and random groups of 4 (a
sweep's end). For each comparison the grid's own ranking (grpo_lab.evaluation.ranking, the leaderboard's paired
McNemar test on the validation items) says "winner" or "tie"; any winner among identical configs is a false one.
The answer claims 5% at most. Reported: the share of comparisons that name a winner, with its 95% Wilson interval,
and the share whose validation winner scores below another member on the test items.

    python benchmarks/selection.py --runs 16 --preset quickstart   # ~16 x 9.5 min on 2 CPU cores; resumable
    python benchmarks/selection.py --quick                         # the mechanics: 6 smoke runs, seconds each

Runs go to outputs/selection/<preset>/seed_<s>/ (a finished one is not trained again: re-run the same command to
go on). Results: benchmarks/results/selection.json (or selection_quick.json). The comparisons share runs, so they
are not independent: the interval is the binomial one over comparisons and is narrower than the truth; the number
of distinct runs is reported beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from _pairs import REPO, RESULTS

from grpo_lab.compare.paired import item_outcomes
from grpo_lab.compare.sources import RunRecord, read_run_dir
from grpo_lab.evaluation.ranking import from_runs
from grpo_lab.evaluation.stats import wilson

METRIC = "eval_after/accuracy"
TEST = "test_after/accuracy"


def train(preset: str, seeds: list[int], root: Path, extra: list[str]) -> list[Path]:
    """One single run per seed into root/seed_<s> (a finished one is kept: the command is resumable)."""
    folders = []
    for i, seed in enumerate(seeds, start=1):
        folder = root / f"seed_{seed}"
        metrics = folder / "metrics.json"
        if metrics.is_file() and json.loads(metrics.read_text()).get("status") == "finished":
            folders.append(folder)
            continue
        if folder.exists():  # an unfinished attempt: grpo_lab never writes into a folder that holds a run
            folder.rename(folder.with_name(f"{folder.name}.unfinished-{int(time.time())}"))
        command = [sys.executable, "-m", "grpo_lab", f"experiment={preset}", f"seed={seed}", "logger=none"]
        command += [f"hydra.run.dir={folder}", *extra]
        print(f"[{i}/{len(seeds)}] seed {seed}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        print(f"    {time.monotonic() - started:.0f} s", flush=True)
        folders.append(folder)
    return folders


def judge(group: list[RunRecord]) -> dict:
    """The grid's answer for these runs, and how its validation leader fares on the test items."""
    ranking = from_runs(group, ["maximize"], items=lambda run: item_outcomes(run, METRIC))
    leader = ranking.leader
    named = leader is not None and not ranking.tied
    tests = {run.name: run.metrics.get(TEST) for run in group}
    leader_test = tests.get(leader.record.name) if leader is not None else None
    others = [v for name, v in tests.items() if leader is None or name != leader.record.name]
    return {
        "runs": [run.name for run in group],
        "winner_named": named,
        "leader": leader.record.name if leader is not None else None,
        "leader_loses_on_test": leader_test is not None and any(v is not None and v > leader_test for v in others),
    }


def rate(hits: int, n: int) -> dict:
    low, high = wilson(hits, n)
    return {"hits": hits, "n": n, "rate": hits / n if n else float("nan"), "ci95": [low, high]}


def measure(folders: list[Path], groups: int, seed: int) -> dict:
    records = [read_run_dir(folder) for folder in folders]
    for record, folder in zip(records, folders, strict=True):
        record.name = folder.name  # seed_<s>: the runs' own names are all the preset's
    pairs = [judge(list(pair)) for pair in itertools.combinations(records, 2)]
    rng = random.Random(seed)
    fours = [judge(rng.sample(records, 4)) for _ in range(groups)] if len(records) >= 4 else []
    out = {
        "metric": METRIC,
        "runs": {r.name: {"validation": r.metrics.get(METRIC), "test": r.metrics.get(TEST)} for r in records},
    }
    for name, comparisons in (("pairs", pairs), ("groups_of_4", fours)):
        out[name] = {
            "winner_named": rate(sum(c["winner_named"] for c in comparisons), len(comparisons)),
            "leader_loses_on_test": rate(sum(c["leader_loses_on_test"] for c in comparisons), len(comparisons)),
            "comparisons": comparisons,
        }
    return out


def show(result: dict) -> None:
    print(f"\n{len(result['runs'])} runs of one config, seeds only differ; the grid's answer on {result['metric']}:")
    print(f"{'comparison':<12} {'n':>4}  {'names a winner':<24} {'validation leader loses on test':<24}")
    for name in ("pairs", "groups_of_4"):
        block = result[name]
        cells = []
        for key in ("winner_named", "leader_loses_on_test"):
            r = block[key]
            cells.append(f"{100 * r['rate']:.1f}% [{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}]")
        print(f"{name:<12} {block['winner_named']['n']:>4}  {cells[0]:<24} {cells[1]:<24}")
    print("Goal: names a winner in at most 5% of comparisons (the level the answer claims).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--first-seed", type=int, default=100, help="seeds first..first+runs-1 (none of the docs')")
    parser.add_argument("--groups", type=int, default=60, help="random groups of 4 formed from the runs")
    parser.add_argument("--quick", action="store_true", help="6 smoke runs: checks the mechanics, measures nothing")
    args = parser.parse_args()
    preset, runs, extra = args.preset, args.runs, []
    if args.quick:
        preset, runs, extra = "smoke", 6, ["output.save_model=false"]
    root = REPO / "outputs" / "selection" / preset
    folders = train(preset, list(range(args.first_seed, args.first_seed + runs)), root, extra)
    result = measure(folders, args.groups, seed=0) | {"preset": preset, "quick": args.quick}
    show(result)
    out = RESULTS / ("selection_quick.json" if args.quick else "selection.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"Results: {out}")


if __name__ == "__main__":
    main()
