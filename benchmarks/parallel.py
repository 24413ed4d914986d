"""What parallel trials gain: the same sweep with 2 trials at a time (joblib launcher) vs one at a time.

Same trials on both sides (sweep=lr_beta with the random sampler, seed 42, so the same lr/beta in the same
order; no pruning), the tiny model, W&B offline. Joblib's worker processes get one BLAS/OpenMP thread each
(cpu_count // n_jobs), so two trials share 2 cores without oversubscribing them. The ratio is throughput:
sequential wall / parallel wall. Goal: >= 1.7x on 2 cores.

A third arm, the sequential sweep on one thread (OMP_NUM_THREADS=1), gives the ceiling: two trials at a time
on one thread each can at best run two such sweeps side by side, 2 x (sequential wall / one-thread wall).
When a trial already uses the second core (torch's intra-op threads), that ceiling is below 2x.

    python benchmarks/parallel.py             # 5 rounds after a warm-up; writes results/parallel.json
    python benchmarks/parallel.py --pairs 3 --trials 2

"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import _pairs

GOAL = 1.7


def sweep(trials: int, steps: int, parallel: bool) -> list[str]:
    cmd = [
        sys.executable, "-m", "grpo_lab", "-m", "sweep=lr_beta", "experiment=smoke", f"max_steps={steps}",
        "eval.before=false", "output.save_model=false", "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=none",
        f"hydra.sweeper.n_trials={trials}",
    ]  # fmt: skip
    if parallel:
        cmd += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2"]
    return cmd


def fresh(cmd: list[str], root: Path, env: dict) -> _pairs.Sample:
    """One sweep in a folder of its own: a new study every time, the same trials."""
    cwd = Path(tempfile.mkdtemp(dir=root))
    return _pairs.measure(cmd, env=env, cwd=cwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        env = _pairs.env(root / "cache", WANDB_MODE="offline")
        par, seq, one = _pairs.rounds(
            [
                partial(fresh, sweep(args.trials, args.steps, True), root, env),
                partial(fresh, sweep(args.trials, args.steps, False), root, env),
                partial(fresh, sweep(args.trials, args.steps, False), root, env | {"OMP_NUM_THREADS": "1"}),
            ],
            args.pairs,
        )
    row = _pairs.summary(
        f"{args.trials} trials x {args.steps} steps", par, seq, baseline="the same sweep, one trial at a time"
    )
    # throughput: sequential wall over parallel wall, per round
    row["throughput_ratio_median"] = statistics.median(s.wall_s / p.wall_s for p, s in zip(par, seq, strict=True))
    row["one_thread_wall_s"] = [s.wall_s for s in one]
    row["ceiling_median"] = statistics.median(2 * s.wall_s / o.wall_s for s, o in zip(seq, one, strict=True))
    print(_pairs.table([row]))
    print(f"throughput (sequential wall / parallel wall), median of rounds: {row['throughput_ratio_median']:.2f}x")
    print(f"ceiling (2 x sequential wall / sequential wall on one thread): {row['ceiling_median']:.2f}x; goal {GOAL}x")
    print(f"written: {_pairs.write('parallel', [row], args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
