"""A staged reward schedule against fixed weights, paired by seed: held-out accuracy and strict format after training.

Reads two grids' folders (each job a run folder with metrics.json and config.yaml), pairs their runs by `seed`, and
prints per seed both runs' held-out accuracy and strict format, their difference, and over the seeds the mean
difference with its 95% t-interval and the paired t-test's p (scipy). Results: benchmarks/results/curriculum.json.

    python -m grpo_lab -m experiment=quickstart seed=42,1,2,3          # the fixed weights (~35 min on 2 CPU cores)
    python -m grpo_lab -m experiment=quickstart_staged seed=42,1,2,3   # the staged schedule
    python benchmarks/curriculum.py outputs/multirun/<fixed grid> outputs/multirun/<staged grid>

A side may also be a JSON file of recorded runs ({seed: {"eval_after/accuracy": ..., "eval_after/format": ...}}), or
several sources joined by commas: benchmarks/results/quickstart_seeds.json holds the quick-start's seeds 1, 2 and 3
as docs/quickstart.md records them (seeded runs repeat exactly: its seed 42 re-ran to the same numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _pairs
import yaml

from grpo_lab.evaluation.stats import seed_mean

METRICS = {"accuracy": "eval_after/accuracy", "strict format": "eval_after/format"}


def runs_by_seed(folder: Path) -> dict[int, dict]:
    """seed -> that run's metrics, for every finished run folder under `folder` (or each folder of a comma-separated
    list), or from a JSON file {seed: {metric: value}} of recorded runs (seeded runs repeat exactly)."""
    if "," in str(folder):
        merged: dict[int, dict] = {}
        for part in str(folder).split(","):
            merged |= runs_by_seed(Path(part))
        return merged
    if folder.suffix == ".json":
        return {int(seed): values for seed, values in json.loads(folder.read_text()).items()}
    found = {}
    for metrics_file in sorted(folder.rglob("metrics.json")):
        record = json.loads(metrics_file.read_text())
        config = yaml.safe_load((metrics_file.parent / "config.yaml").read_text())
        if record["status"] != "finished":
            raise SystemExit(f"{metrics_file.parent} ended {record['status']}: a comparison needs finished runs")
        found[config["seed"]] = record["metrics"] | {"name": config["name"], "run_dir": str(metrics_file.parent)}
    return found


def compare(fixed: dict[int, dict], staged: dict[int, dict]) -> dict:
    from scipy import stats

    seeds = sorted(set(fixed) & set(staged))
    if len(seeds) < 2:
        raise SystemExit(f"the two grids share {len(seeds)} seed(s): pairing by seed needs at least 2")
    out = {"seeds": seeds, "fixed": fixed, "staged": staged, "metrics": {}}
    for label, key in METRICS.items():
        diffs = [staged[s][key] - fixed[s][key] for s in seeds]
        interval = seed_mean(diffs)
        p = float(stats.ttest_rel([staged[s][key] for s in seeds], [fixed[s][key] for s in seeds]).pvalue)
        out["metrics"][label] = {
            "key": key,
            "fixed_mean": seed_mean([fixed[s][key] for s in seeds]).mean,
            "staged_mean": seed_mean([staged[s][key] for s in seeds]).mean,
            "differences": diffs,
            "mean_difference": interval.mean,
            "ci_low": interval.ci_low,
            "ci_high": interval.ci_high,
            "p_value": p,
        }
    return out


def table(result: dict) -> str:
    seeds, fixed, staged = result["seeds"], result["fixed"], result["staged"]
    lines = ["| seed | accuracy: fixed -> staged | strict format: fixed -> staged |", "|---|---|---|"]
    for s in seeds:
        cells = []
        for key in METRICS.values():
            a, b = fixed[s][key], staged[s][key]
            cells.append(f"{100 * a:.1f}% -> {100 * b:.1f}% ({100 * (b - a):+.1f} pts)")
        lines.append(f"| {s} | {cells[0]} | {cells[1]} |")
    for label, m in result["metrics"].items():
        lines.append(
            f"\n{label}: mean {100 * m['fixed_mean']:.1f}% fixed, {100 * m['staged_mean']:.1f}% staged; staged - fixed "
            f"{100 * m['mean_difference']:+.1f} pts, 95% interval "
            f"[{100 * m['ci_low']:+.1f}, {100 * m['ci_high']:+.1f}] "
            f"(t over {len(seeds)} seeds), paired t-test p = {m['p_value']:.2g}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixed", type=Path, help="the grid with fixed weights")
    parser.add_argument("staged", type=Path, help="the grid with the schedule")
    parser.add_argument("--out", type=Path, default=_pairs.RESULTS / "curriculum.json")
    args = parser.parse_args()
    result = compare(runs_by_seed(args.fixed), runs_by_seed(args.staged))
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**_pairs.machine(), "benchmark": "curriculum", **result}, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
