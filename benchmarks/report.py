"""The README's table of the latest benchmark results, from benchmarks/results/*.json.

    python benchmarks/report.py      # markdown on stdout: one row per case, with the command that produced it

Each ratio is the median of the per-pair ratios (grpo_lab / baseline, each pair run back to back), shown
with the range of the pairs' ratios, so that the noise of the number is next to it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _spread(row: dict, key: str) -> str:
    """`median (min-max of the pairs)` of a grpo_lab/baseline ratio from the raw samples."""
    ours, base = row[key]["grpo_lab"]["raw"], row[key]["baseline"]["raw"]
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    return f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _paired(name: str, data: dict, keys: tuple[str, ...], goal: float | None, applies=lambda case: True) -> list:
    """Rows of an A B / B A benchmark; `goal` (a ratio ceiling) judges the cases `applies` selects."""
    labels = {"wall_s": "wall", "peak_rss_mib": "peak RSS", "cpu_s": "CPU"}
    out = []
    for r in data["rows"]:
        judged = goal is not None and applies(r["case"])
        for key in keys:
            med = r[key]["ratio_median"]
            unit = "MiB" if key == "peak_rss_mib" else "s"
            out.append([
                name, f"{r['case']}: {labels[key]}",
                f"{r[key]['grpo_lab']['median']:.2f} {unit}", f"{r[key]['baseline']['median']:.2f} {unit}",
                f"{_spread(r, key)}, {r['pairs']} pairs", f"<= {goal}x" if judged else "-",
                ("met" if med <= goal else "missed") if judged else "-",
            ])  # fmt: skip
    return out


def _windows(w: dict) -> str:
    first, last = next(iter(w)), list(w)[-1]
    return f"{w[first]:.0f} -> {w[last]:.0f}"


def rows() -> list[list[str]]:
    out: list[list[str]] = []
    sources = {}
    # sweeper_scaling_1000*: the same benchmark with `--trials 1000` (a storage set per file), beside the 100-trial one
    scaling = sorted(p.stem for p in RESULTS.glob("sweeper_scaling*.json"))
    for name in ("overhead", "compose", *scaling, "pruning", "parallel"):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        sources[name] = data
        if name == "overhead":
            out += _paired(name, data, ("wall_s", "peak_rss_mib"), 1.03, lambda case: case.startswith("tiny"))
        elif name == "compose":
            rows_of = _paired(name, data, ("wall_s",), 1.2, lambda case: not case.endswith("vs pydantic"))
            for row, r in zip(rows_of, data["rows"], strict=True):  # one row (wall) per case
                if "reference_vs_bare_wall_ratio_median" in r:  # what pydantic alone costs over the bare app
                    row[4] += f"; the pydantic app itself {r['reference_vs_bare_wall_ratio_median']:.2f}x bare"
            out += rows_of
        elif name == "parallel":
            for r in data["rows"]:
                seq, par = r["wall_s"]["baseline"]["raw"], r["wall_s"]["grpo_lab"]["raw"]
                ratios = [s / p for s, p in zip(seq, par, strict=True)]
                med = statistics.median(ratios)
                # older results have no one-thread arm, hence no ceiling
                ceiling = f"; ceiling {r['ceiling_median']:.2f}x" if "ceiling_median" in r else ""
                out.append([
                    name, f"{r['case']}: throughput, 2 at a time", f"{r['wall_s']['grpo_lab']['median']:.1f} s",
                    f"{r['wall_s']['baseline']['median']:.1f} s (one at a time)",
                    f"{med:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), {r['pairs']} rounds{ceiling}", ">= 1.7x",
                    "met" if med >= 1.7 else "missed",
                ])  # fmt: skip
        elif name.startswith("sweeper_scaling"):
            for r in data["rows"]:
                w = r["grpo_lab"]["windows_ms"]
                own = f"; own cost beyond Hydra's ~{r['own_ms_median']:.0f}" if "own_ms_median" in r else ""
                out.append([
                    name, f"{r['storage']}, {r['workers']} worker(s), {r['trials']} trials: ms per trial, first -> "
                    "last 10", f"{_windows(w)}{own}",
                    f"{_windows(r['baseline']['windows_ms'])} (Optuna); "
                    f"{_windows(r['hydra_basic_windows_ms'])} (Hydra's basic sweeper)",
                    f"growth {r['growth_last_vs_first']:.2f}x; {r['ratio_median']:.1f}x Optuna", "flat",
                    "met" if r["growth_last_vs_first"] <= 1.25 else "missed",
                ])  # fmt: skip
        elif name == "pruning":
            base = data["rows"][0]

            def steps_and_best(r: dict) -> str:
                lo, hi = r["best_ci"]
                return f"{r['search_steps']} steps, {r['wall_s']:.0f} s; {r['best_mean']:.3f} [{lo:.3f}, {hi:.3f}]"

            for r in data["rows"][1:]:
                good = r["steps_saved"] >= 0.4 and not r["p_best_vs_unpruned"] < 0.05
                out.append([
                    name, f"{r['pruner']} vs none: search steps; best config's seed mean [95%]", steps_and_best(r),
                    steps_and_best(base), f"{r['steps_saved']:.0%} fewer steps; p={r['p_best_vs_unpruned']:.2g}",
                    ">= 40% fewer, best tied", "met" if good else "missed",
                ])  # fmt: skip
    return out, sources


def main() -> int:
    table, sources = rows()
    if not table:
        print("no results in benchmarks/results/ yet", file=sys.stderr)
        return 1
    print("| benchmark | case | grpo_lab | baseline | ratio (range over pairs) | goal | |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    print()
    for name, data in sources.items():
        sha = (data.get("git_sha") or "?")[:7]
        print(f"- {name}: `{data.get('command', 'python benchmarks/' + name + '.py')}` ({data['date']}, {sha}, "
              f"{data['cpus']} CPUs, torch {data['versions']['torch']}, trl {data['versions']['trl']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
