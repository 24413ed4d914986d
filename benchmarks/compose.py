"""What composing a run costs: grpo_lab's `--cfg job`, `--help` and a bad-input failure vs a bare Hydra app.

The baseline (benchmarks/baselines/bare_hydra_app.py) is a plain @hydra.main app on the same conf/ folder,
so the ratio is what grpo_lab adds on top of Hydra: its override rewriting, validation, imports. Goal:
<= 1.2x wall for each case.

    python benchmarks/compose.py               # 5 pairs per case after a warm-up; writes results/compose.json
    python benchmarks/compose.py --quick --check   # CI: 3 pairs; exit 1 when every pair of a CHECKED case is above it
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

import _pairs

GOAL = 1.2
BARE = str(_pairs.REPO / "benchmarks" / "baselines" / "bare_hydra_app.py")
# The cases `--check` guards (CI): those that meet the goal. A bad-input failure misses it (validating every key
# with pydantic costs ~0.1 s that the baseline's one-key check does not; see the README's table).
CHECKED = ("--cfg job", "--help")
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
            ours = [sys.executable, "-m", "grpo_lab", *argv]
            base = [sys.executable, BARE, *argv]
            xs, ys = _pairs.alternate(
                partial(_pairs.measure, ours, env=env, cwd=cwd, expect=code),
                partial(_pairs.measure, base, env=env, cwd=cwd, expect=code),
                pairs,
            )
            rows.append(_pairs.summary(name, xs, ys, baseline="bare @hydra.main app on the same conf/"))
    print(_pairs.table(rows))
    print(f"written: {_pairs.write('compose', rows, args.out)}")
    over = [r["case"] for r in rows if r["wall_s"]["ratio_median"] > GOAL]
    if over:
        print(f"median above the goal of {GOAL}x wall: {', '.join(over)}")
    return _pairs.check_exit(_pairs.regressions([r for r in rows if r["case"] in CHECKED], GOAL), args.check)


if __name__ == "__main__":
    sys.exit(main())
