"""How often the grid's answer names a winner among identical configs (a false winner), and how often the validation
winner loses on the test items.

Trains N runs of one preset that differ only in `seed` (single runs: each grades validation and the test part before
and after), then forms comparisons from them as a grid's end would see them: every pair, and random groups of 4 (a
sweep's end). For each comparison the grid's own ranking (grpo_lab.evaluation.ranking, the leaderboard's paired
McNemar test on the validation items) says "winner" or "tie"; any winner among identical configs is a false one.
The answer claims 5% at most. Reported: the share of comparisons that name a winner, with its 95% Wilson interval,
and the share whose validation winner scores below another member on the test items.

    python benchmarks/selection.py --runs 16 --preset quickstart   # ~16 x 9 min on 2 CPU cores; resumable
    python benchmarks/selection.py --quick                         # the mechanics: 6 smoke runs, seconds each

Runs are trained in outputs/selection/<preset>/seed_<s>/ (without saving the model: only records are read); each
finished run's records (metrics.json, the graded items, .hydra/) are copied to
benchmarks/results/selection_runs/<preset>/seed_<s>/, which is committed: a run found there is not trained again,
so the benchmark goes on across sessions and machines (re-run the same command). Results:
benchmarks/results/selection.json (or selection_quick.json, whose runs stay in outputs/). The comparisons share
runs, so they are not independent: the interval is the binomial one over comparisons and is narrower than the
truth; the number of distinct runs is reported beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _pairs import REPO, RESULTS

from grpo_lab.compare.paired import item_outcomes
from grpo_lab.compare.sources import RunRecord, read_run_dir
from grpo_lab.evaluation.ranking import from_runs, paired
from grpo_lab.evaluation.stats import ALPHA, wilson

METRIC = "eval_after/accuracy"
TEST = "test_after/accuracy"


RECORDS = RESULTS / "selection_runs"
# What a comparison reads of a run folder (grpo_lab.compare.sources.read_run_dir), a few hundred KB a run.
RECORD_FILES = (
    "metrics.json",
    "history.jsonl",
    "eval_before.jsonl",
    "eval_after.jsonl",
    "test_before.jsonl",
    "test_after.jsonl",
    ".hydra",
)


def finished(folder: Path) -> bool:
    metrics = folder / "metrics.json"
    return metrics.is_file() and json.loads(metrics.read_text()).get("status") == "finished"


def keep_records(run: Path, records: Path) -> None:
    """Copy a finished run's records into `records` (complete or absent: copied beside it, then renamed)."""
    partial = records.with_name(records.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in RECORD_FILES:
        source = run / name
        if source.is_dir():
            shutil.copytree(source, partial / name)
        elif source.is_file():
            shutil.copy2(source, partial / name)
    partial.rename(records)


def trained(folder: Path, overrides: list[str], label: str, records: Path | None) -> Path:
    """One single run with these overrides into `folder` (no W&B, no saved model), its records copied to `records`
    (None: not kept); a finished run found in either is not trained again. Returns the folder to read it from."""
    if records is not None and finished(records):
        return records
    if not finished(folder):
        if folder.exists():  # an unfinished attempt: grpo_lab never writes into a folder that holds a run
            folder.rename(folder.with_name(f"{folder.name}.unfinished-{int(time.time())}"))
        command = [sys.executable, "-m", "grpo_lab", *overrides, "logger=none", "output.save_model=false"]
        command.append(f"hydra.run.dir={folder}")
        print(f"{label}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        print(f"    {time.monotonic() - started:.0f} s", flush=True)
    if records is None:
        return folder
    keep_records(folder, records)
    return records


def train(preset: str, seeds: list[int], root: Path, records: Path | None) -> list[Path]:
    """One single run per seed into root/seed_<s>; its records kept in records/seed_<s> (resumable: see trained)."""
    return [
        trained(root / f"seed_{seed}", [f"experiment={preset}", f"seed={seed}"], f"[{i}/{len(seeds)}] seed {seed}",
                None if records is None else records / f"seed_{seed}")
        for i, seed in enumerate(seeds, start=1)
    ]  # fmt: skip


def _items(run: RunRecord) -> list | None:
    return item_outcomes(run, METRIC)


def _as_configs(groups: list[list[RunRecord]]) -> list[RunRecord]:
    """The runs as a grid's jobs: group k is config k (its runs its seeds), whatever run they were."""
    return [
        dataclasses.replace(run, overrides=[f"+selection.config={k}", f"seed={run.name.removeprefix('seed_')}"])
        for k, group in enumerate(groups)
        for run in group
    ]


def judge(group: list[RunRecord]) -> dict:
    """The grid's answer (grpo_lab.evaluation.ranking) for these jobs, and how the chosen config fares on the test
    items: its runs' mean test accuracy below another config's."""
    ranking = from_runs(group, ["maximize"], items=_items)
    leader = ranking.leader
    config_of = {run.name: run.overrides[0] for run in group}
    tests: dict[str, list[float]] = {}
    for run in group:
        if (value := run.metrics.get(TEST)) is not None:
            tests.setdefault(config_of[run.name], []).append(value)
    means = {config: statistics.fmean(values) for config, values in tests.items()}
    chosen = config_of[leader.record.name] if leader is not None else None
    return {
        "runs": [run.name for run in group],
        "configs": len(set(config_of.values())),
        "winner_named": leader is not None and not ranking.tied,
        "leader": leader.record.name if leader is not None else None,
        "leader_loses_on_test": chosen in means and any(v > means[chosen] for c, v in means.items() if c != chosen),
    }


def judge_items(group: list[RunRecord]) -> dict:
    """The earlier rule, one run per config: the best value wins unless another run is not shown to differ on the
    same validation items (McNemar p >= 0.05): a test of two models, blind to the spread between seeds."""
    leader = max(group, key=lambda run: run.metrics.get(METRIC, float("-inf")))
    tied = any(
        run.metrics.get(METRIC) == leader.metrics.get(METRIC)
        or (versus := paired(_items(leader), _items(run))) is None
        or versus.p_value >= ALPHA
        for run in group
        if run is not leader
    )
    loses = any(run.metrics.get(TEST, -1.0) > leader.metrics.get(TEST, -1.0) for run in group if run is not leader)
    return {
        "runs": [run.name for run in group],
        "configs": len(group),
        "winner_named": not tied,
        "leader": leader.name,
        "leader_loses_on_test": loses,
    }


def rate(hits: int, n: int) -> dict:
    low, high = wilson(hits, n)
    return {"hits": hits, "n": n, "rate": hits / n if n else float("nan"), "ci95": [low, high]}


def summarise(comparisons: list[dict]) -> dict:
    return {
        "winner_named": rate(sum(c["winner_named"] for c in comparisons), len(comparisons)),
        "leader_loses_on_test": rate(sum(c["leader_loses_on_test"] for c in comparisons), len(comparisons)),
        "comparisons": comparisons,
    }


def measure(folders: list[Path], groups: int, seed: int, seeds_per_config: int) -> dict:
    """Comparisons of identical configs under each rule: every pair and `groups` random groups of 4 configs."""
    records = [read_run_dir(folder) for folder in folders]
    for record, folder in zip(records, folders, strict=True):
        record.name = folder.name  # seed_<s>: the runs' own names are all the preset's
    rng = random.Random(seed)
    pairs = list(itertools.combinations(records, 2))
    fours = [rng.sample(records, 4) for _ in range(groups)] if len(records) >= 4 else []
    k = seeds_per_config
    out: dict = {
        "metric": METRIC,
        "runs": {r.name: {"validation": r.metrics.get(METRIC), "test": r.metrics.get(TEST)} for r in records},
        "rules": {
            "items": "one run per config; a winner unless McNemar on the validation items says p >= 0.05 (before)",
            "one_seed": "one run per config under grpo_lab's ranking: configs cannot be told apart on one seed",
            "seeds": f"{k} runs per config under grpo_lab's ranking: Welch's t-test on the configs' seed values",
        },
    }
    out["items"] = {"pairs": summarise([judge_items(list(p)) for p in pairs])}
    out["items"]["groups_of_4"] = summarise([judge_items(g) for g in fours])
    out["one_seed"] = {"pairs": summarise([judge(_as_configs([[a], [b]])) for a, b in pairs])}
    out["one_seed"]["groups_of_4"] = summarise([judge(_as_configs([[r] for r in g])) for g in fours])
    out["seeds"] = {}
    for name, n_configs in (("pairs", 2), ("groups_of_4", 4)):
        if len(records) < n_configs * k:
            continue
        splits = []
        for _ in range(groups):
            drawn = rng.sample(records, n_configs * k)
            splits.append(judge(_as_configs([drawn[i * k : (i + 1) * k] for i in range(n_configs)])))
        out["seeds"][name] = summarise(splits)
    return out


def show(result: dict) -> None:
    print(f"\n{len(result['runs'])} runs of one config, seeds only differ; the grid's answer on {result['metric']}:")
    print(f"{'rule':<10} {'comparison':<12} {'n':>4}  {'names a winner':<22} {'chosen config loses on test':<22}")
    for rule in ("items", "one_seed", "seeds"):
        for name, block in result[rule].items():
            cells = []
            for key in ("winner_named", "leader_loses_on_test"):
                r = block[key]
                cells.append(f"{100 * r['rate']:.1f}% [{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}]")
            print(f"{rule:<10} {name:<12} {block['winner_named']['n']:>4}  {cells[0]:<22} {cells[1]:<22}")
    for rule, text in result["rules"].items():
        print(f"  {rule}: {text}")
    print("Goal: names a winner in at most 5% of comparisons (the level the answer claims).")
    print("Among identical configs the chosen one is below another on the test items by chance alone in ~50% of")
    print("pairs and ~75% of groups of 4 (fewer with ties): a validation choice that carried no information.")
    print("\nFor docs/benchmarks.md:\n" + markdown(result))


RULE_LABELS = {
    "items": "before: McNemar between single runs",
    "one_seed": "now, one seed a config",
    "seeds": "now, 3 seeds a config (Welch)",
}


def markdown(result: dict) -> str:
    """The table of docs/benchmarks.md, from the results (so that the page is never typed by hand)."""

    def cell(r: dict) -> str:
        return f"{100 * r['rate']:.1f}% [{100 * r['ci95'][0]:.0f}, {100 * r['ci95'][1]:.0f}] ({r['hits']}/{r['n']})"

    lines = [
        "| rule | comparisons | names a winner [95%] | chosen config below another on test [95%] |",
        "|---|---|---|---|",
    ]
    for rule, label in RULE_LABELS.items():
        for name, block in result[rule].items():
            named, loses = cell(block["winner_named"]), cell(block["leader_loses_on_test"])
            lines.append(f"| {label} | {name.replace('_', ' ')} | {named} | {loses} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--first-seed", type=int, default=100, help="seeds first..first+runs-1 (none of the docs')")
    parser.add_argument("--groups", type=int, default=60, help="random groups of 4 formed from the runs")
    parser.add_argument("--seeds-per-config", type=int, default=3, help="runs per config under the seeds rule")
    parser.add_argument("--quick", action="store_true", help="6 smoke runs: checks the mechanics, measures nothing")
    args = parser.parse_args()
    preset, runs, records = args.preset, args.runs, RECORDS / args.preset
    if args.quick:
        preset, runs, records = "smoke", 6, None
    root = REPO / "outputs" / "selection" / preset
    seeds = list(range(args.first_seed, args.first_seed + runs))
    folders = train(preset, seeds, root, records)
    result = measure(folders, args.groups, seed=0, seeds_per_config=args.seeds_per_config) | {
        "preset": preset,
        "quick": args.quick,
    }
    show(result)
    out = RESULTS / ("selection_quick.json" if args.quick else "selection.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"Results: {out}")


if __name__ == "__main__":
    main()
