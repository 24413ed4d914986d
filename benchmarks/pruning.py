"""What pruning saves: the same sweep with the median pruner, successive halving and no pruner.

The shipped pruners also prune a trial with no learning signal (`prune_no_signal: true`: the health rule
no_signal, rewards flat within groups for health.patience logs); `median_alone` is the median pruner with it
off, to show what each part saves.

A sweep whose objective really differs across configs (the tiny model's length reward, train/reward_end,
over a log-scale lr and an ideal length of 2, 10 or 40 characters: an ideal of 2 scores 0 whatever the lr),
12 search trials, TPE with the same seed, then the best config re-run with 2 more seeds (confirmation
runs, never pruned) so that each pruner's best config comes with its seed mean and 95% interval. Reported
per pruner: training steps and wall time of the search, the best config's seed mean [interval], and
against no pruning the share of steps saved and Welch's p between the two best configs' seeds.
Goal: >= 40% fewer steps, best not distinguishable from the unpruned one's.

    python benchmarks/pruning.py            # writes results/pruning.json (~5 min on 2 cores)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _pairs

PRUNERS = {  # name: overrides
    "none": ["hydra/sweeper/pruner=none"],
    "median": ["hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=3"],
    "successive_halving": ["hydra/sweeper/pruner=successive_halving", "hydra.sweeper.pruner.min_resource=2"],
    # Optuna's median pruner alone: what the dead-trial rule (prune_no_signal, on in the others) adds
    "median_alone": [
        "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=3",
        "hydra.sweeper.pruner.prune_no_signal=false",
    ],
}  # fmt: skip
SWEEP = """# @package _global_
defaults:
  - override /hydra/sweeper: grpo_optuna
hydra:
  sweeper:
    study_name: pruning
    n_trials: {trials}
    objectives: [{{metric: train/reward_end, direction: maximize}}]
    sampler: {{seed: 7}}
    confirm: {{top_k: 1, seeds: 2}}
    keep_models: none
    params:
      lr: tag(log, interval(1.0e-5, 3.0e-2))
      reward.functions.length.ideal_length: choice(2, 10, 40)
"""


def run(name: str, overrides: list[str], root: Path, env: dict, trials: int, steps: int) -> dict:
    import optuna

    from grpo_lab.evaluation.ranking import from_trials
    from grpo_lab.sweep import confirm

    cwd = root / name
    (cwd / "conf" / "sweep").mkdir(parents=True)
    (cwd / "conf" / "sweep" / "pruning.yaml").write_text(SWEEP.format(trials=trials))
    cmd = [
        sys.executable, "-m", "grpo_lab", "-m", "--config-dir", str(cwd / "conf"), "sweep=pruning",
        "experiment=smoke", f"max_steps={steps}", "eval.before=false", "eval.after=false", *overrides,
    ]  # fmt: skip
    print(f"{name}: {trials} trials x {steps} steps", file=sys.stderr, flush=True)
    sample = _pairs.measure(cmd, env=env, cwd=cwd)
    study = optuna.load_study(study_name="pruning", storage=f"sqlite:///{cwd / 'outputs' / 'sweeps' / 'optuna.db'}")
    search = [t for t in study.trials if not confirm.is_confirmation(t)]
    history = cwd / "outputs" / "sweeps" / "pruning"
    # one history row per training step (the smoke experiment logs every step)
    steps_of = {
        t.number: len((history / f"trial_{t.number}" / "history.jsonl").read_text().splitlines()) for t in search
    }
    best = from_trials(study).configs[0]  # the best seed mean after the confirmation runs
    return {
        "pruner": name,
        "wall_s": sample.wall_s,
        "search_steps": sum(steps_of.values()),
        "pruned": sum(t.state.name == "PRUNED" for t in search),
        "best_trial": best.trial,
        "best_values": best.values,
        "best_mean": best.mean.mean,
        "best_ci": [best.mean.ci_low, best.mean.ci_high],
        "best_params": study.trials[best.trial].params,
    }


def main() -> int:
    from grpo_lab.evaluation.stats import welch_p

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        env = _pairs.env(root / "cache", WANDB_MODE="disabled")
        rows = [run(name, o, root, env, args.trials, args.steps) for name, o in PRUNERS.items()]
    base = rows[0]
    for r in rows:
        r["steps_saved"] = 1 - r["search_steps"] / base["search_steps"]
        r["wall_ratio"] = r["wall_s"] / base["wall_s"]
        r["p_best_vs_unpruned"] = welch_p(r["best_values"], base["best_values"])
    for r in rows:
        lo, hi = r["best_ci"]
        print(
            f"{r['pruner']:<19} {r['search_steps']:>4} steps ({r['steps_saved']:+.0%} saved, {r['pruned']} pruned), "
            f"{r['wall_s']:6.1f} s ({r['wall_ratio']:.2f}x), best #{r['best_trial']} seed mean "
            f"{r['best_mean']:.4f} [{lo:.4f}, {hi:.4f}], vs unpruned p={r['p_best_vs_unpruned']:.2g}"
        )
    print(f"({time.perf_counter() - started:.0f} s in all)")
    print(f"written: {_pairs.write('pruning', rows, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
