"""What composing a run costs: grpo_lab's `--cfg job`, `--help` and a bad-input failure vs a bare Hydra app.

The baseline (benchmarks/baselines/bare_hydra_app.py) is a plain @hydra.main app on the same conf/ folder,
so the ratio is what grpo_lab adds on top of Hydra: its override rewriting, validation, imports. Goal:
<= 1.2x wall for each case. The bad-input case runs a third arm in the same rounds, the bare app validating its
one key with pydantic (baselines/bare_hydra_pydantic_app.py): pydantic's own cost, and grpo_lab's beyond it.

    python benchmarks/compose.py               # 5 pairs per case after a warm-up; writes results/compose.json
    python benchmarks/compose.py --quick --check   # CI: 3 pairs; exit 1 when every pair of a CHECKED case is above it
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import _pairs

GOAL = 1.2
BARE = str(_pairs.REPO / "benchmarks" / "baselines" / "bare_hydra_app.py")
# The bad-input case's reference arm: the bare app validating its one key with pydantic. Importing pydantic and
# building one model already costs ~0.1 s, above the goal; grpo_lab's own share is its ratio to this app.
BARE_PYDANTIC = str(_pairs.REPO / "benchmarks" / "baselines" / "bare_hydra_pydantic_app.py")
# The cases `--check` guards (CI): those that meet the goal; a bad-input failure misses it (see BARE_PYDANTIC).
CHECKED = ("--cfg job", "--help")
REFERENCE = "bare @hydra.main app validating lr with pydantic (baselines/bare_hydra_pydantic_app.py)"
CASES = {  # name: (arguments, expected exit status)
    "--cfg job": (["--cfg", "job", "experiment=smoke", "lr=2e-5"], 0),
    "--help": (["--help"], 0),
    "bad input (lr=-1)": (["experiment=smoke", "lr=-1"], 1),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 pairs (CI)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when every pair of a case is above {GOAL}x")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    pairs = 3 if args.quick else args.pairs
    rows = []
    with tempfile.TemporaryDirectory() as work:
        cwd, env = Path(work), _pairs.env(Path(work) / "cache")
        for name, (argv, code) in CASES.items():
            print(f"{name}:", file=sys.stderr)
            arms = [[sys.executable, "-m", "grpo_lab", *argv], [sys.executable, BARE, *argv]]
            if code != 0:
                arms.append([sys.executable, BARE_PYDANTIC, *argv])
            xs, ys, *ref = _pairs.rounds(
                [partial(_pairs.measure, a, env=env, cwd=cwd, expect=code) for a in arms], pairs
            )
            rows.append(_pairs.summary(name, xs, ys, baseline="bare @hydra.main app on the same conf/"))
            if ref:
                rows.append(_pairs.summary(f"{name} vs pydantic", xs, ref[0], baseline=REFERENCE))
                # the reference app against the bare one, round by round (as summary's ratios)
                floor = statistics.median(r.wall_s / b.wall_s for r, b in zip(ref[0], ys, strict=True))
                rows[-1]["reference_vs_bare_wall_ratio_median"] = floor
    print(_pairs.table(rows))
    for r in rows:
        if "reference_vs_bare_wall_ratio_median" in r:
            print(f"the reference app alone: {r['reference_vs_bare_wall_ratio_median']:.3f}x the bare app (wall)")
    print(f"written: {_pairs.write('compose', rows, args.out)}")
    over = [r["case"] for r in rows if r["wall_s"]["ratio_median"] > GOAL]
    if over:
        print(f"median above the goal of {GOAL}x wall: {', '.join(over)}")
    return _pairs.check_exit(_pairs.regressions([r for r in rows if r["case"] in CHECKED], GOAL), args.check)


if __name__ == "__main__":
    sys.exit(main())
