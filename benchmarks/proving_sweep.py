"""Does a sweep's winner beat the preset it searched from, on fresh seeds and on the test items?

1. The sweep: `sweep=grpo` on the preset (group size, learning rate, beta and every reward weight; TPE; median
   pruning on periodic validation accuracy), a budget of --trials search trials, then the top --confirm configs
   again on --confirm-seeds more seeds; its winner is the confirmed config with the best mean over seeds
   (grpo_lab.evaluation.ranking), chosen on validation items only. The study lives in a journal file committed
   under benchmarks/results/proving/<preset>/study.journal: the same command resumes it, in another session too.
2. Both arms, the preset's own config and the winner's, on --seeds fresh seeds (none of the sweep's search or
   confirmation seeds), run side by side (per seed: preset then winner, the next seed the other way round),
   single runs that grade the test items before and after training. Each finished run's records are kept under
   benchmarks/results/proving/<preset>/runs/<arm>/seed_<s>/ (committed, like the study: resumable).
3. The verdict: each seed's test accuracy in each arm, the gain (winner - preset) per seed with its mean, a 95%
   t-interval over seeds and a paired t-test across seeds (the seed is the unit: two models of one config differ
   by their seed, so items alone would overstate the evidence); the compute the sweep cost (its trials' time).

    python benchmarks/proving_sweep.py                # quick-start: ~12 + 4 sweep runs, then 2 x 4 runs (~4 h)
    python benchmarks/proving_sweep.py --quick        # the mechanics on the smoke preset, measures nothing

Results: benchmarks/results/proving_sweep.json (or proving_sweep_quick.json, whose records stay in outputs/).
A null result is reported as null.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from _pairs import REPO, RESULTS
from selection import trained

from grpo_lab.compare.sources import read_run_dir
from grpo_lab.config.overrides import key, user_overrides
from grpo_lab.evaluation.stats import seed_mean

TEST = "test_after/accuracy"
SEARCH_SEED = 42  # the presets' seed: the sweep searches with it and confirms with 43, 44, ...
# Settings of a run that are the benchmark's, not the config's: dropped from the winner's overrides.
NOT_CONFIG = ("seed", "logger", "output", "hydra", "experiment", "sweep", "trial", "objective")
SWEEP_ONLY = ("eval.before",)  # the sweep's own saving (below): both arms grade before and after training


def sweep(preset: str, folder: Path, journal: Path, trials: int, confirm: int, confirm_seeds: int) -> list[str]:
    """Run (or resume) the sweep; returns its command."""
    journal.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "grpo_lab", "-m", "sweep=grpo", f"experiment={preset}", "logger=none",
        f"hydra.sweeper.study_name=proving_{preset}", f"hydra.sweeper.storage=journal:{journal}",
        f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.confirm.top_k={confirm}",
        f"hydra.sweeper.confirm.seeds={confirm_seeds}", "hydra.sweeper.keep_models=none",
        f"hydra.sweeper.sweep_root={folder}",
        # The untrained model's validation score is the same in every trial (greedy decoding, one validation part,
        # one base model) and nothing chooses on it: not measured 16 times (~1 min a trial on the quick-start).
        "eval.before=false",
    ]  # fmt: skip
    print(f"sweep: {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return command[1:]


def winner(preset: str, journal: Path) -> tuple[list[str], dict]:
    """The sweep's leader as overrides of the preset, and what it was chosen by."""
    import optuna

    from grpo_lab.evaluation.ranking import from_trials
    from grpo_lab.run.study import open_storage

    study = optuna.load_study(study_name=f"proving_{preset}", storage=open_storage(f"journal:{journal}"))
    ranking = from_trials(study)
    leader = ranking.leader
    if leader is None:
        sys.exit("the sweep has no finished trial to choose from")
    overrides = [
        o
        for o in user_overrides(leader.overrides)
        if key(o).split(".")[0] not in NOT_CONFIG and key(o) not in SWEEP_ONLY
    ]
    config = next((c for c in ranking.configs if c.trial == leader.trial), None)
    trials = study.get_trials(deepcopy=False)
    seconds = [
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in trials
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    chosen = {
        "trial": leader.trial,
        "overrides": overrides,
        "validation": leader.objective,
        "validation_seeds": None if config is None else list(config.values),
        "tied_with": [e.trial for e in ranking.tied],
        "sweep_trials": len(trials),
        "sweep_states": {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "sweep_hours": sum(seconds) / 3600,
    }
    return overrides, chosen


def run_arms(preset: str, arms: dict[str, list[str]], seeds: list[int], scratch: Path, records: Path | None) -> dict:
    """Each seed's run of each arm (alternating which goes first); {arm: {seed: run folder}}."""
    folders: dict[str, dict[int, Path]] = {arm: {} for arm in arms}
    for i, seed in enumerate(seeds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        for arm in order:
            name = f"{arm}/seed_{seed}"
            overrides = [f"experiment={preset}", *arms[arm], f"seed={seed}"]
            kept = records / name if records is not None else None
            folders[arm][seed] = trained(scratch / name, overrides, name, kept)
    return folders


def verdict(folders: dict[str, dict[int, Path]], seeds: list[int]) -> dict:
    """Per seed test accuracy of each arm, and the winner's gain over the preset across seeds."""
    from scipy import stats

    test = {arm: {s: read_run_dir(f).metrics.get(TEST) for s, f in runs.items()} for arm, runs in folders.items()}
    seconds = {arm: [read_run_dir(f).duration_s or math.nan for f in runs.values()] for arm, runs in folders.items()}
    gains = [test["winner"][s] - test["preset"][s] for s in seeds]
    mean = seed_mean(gains)
    p = float(stats.ttest_rel([test["winner"][s] for s in seeds], [test["preset"][s] for s in seeds]).pvalue)
    return {
        "metric": TEST,
        "seeds": seeds,
        "test": {arm: [values[s] for s in seeds] for arm, values in test.items()},
        "mean": {arm: statistics.fmean(values.values()) for arm, values in test.items()},
        "gain": {"per_seed": gains, "mean": mean.mean, "ci95": [mean.ci_low, mean.ci_high], "paired_t_p": p},
        "run_minutes": {arm: statistics.fmean(v) / 60 for arm, v in seconds.items()},
    }


def show(chosen: dict, result: dict) -> None:
    print(f"\nThe sweep's winner (trial {chosen['trial']}): {' '.join(chosen['overrides']) or '(the preset itself)'}")
    print(f"  chosen on validation: {chosen['validation']}; seeds {chosen['validation_seeds']}")
    states = ", ".join(f"{n} {s.lower()}" for s, n in chosen["sweep_states"].items())
    print(f"  the sweep: {chosen['sweep_trials']} trials ({states}), {chosen['sweep_hours']:.2f} h of runs")
    print(f"\nTest accuracy on fresh seeds {result['seeds']}:")
    for arm in ("preset", "winner"):
        cells = "  ".join(f"{100 * v:5.1f}%" for v in result["test"][arm])
        print(f"  {arm:<7} {cells}   mean {100 * result['mean'][arm]:.1f}%")
    g = result["gain"]
    low, high = g["ci95"]
    print(f"  gain    {100 * g['mean']:+.1f} points, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}] over seeds, ", end="")
    print(f"paired t-test p = {g['paired_t_p']:.3g}")
    null = not (low > 0 or high < 0)
    print("  reading: " + ("no gain shown (the interval holds 0): a null result." if null else "a gain shown."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--trials", type=int, default=12, help="search trials (confirmation trials come on top)")
    parser.add_argument("--confirm", type=int, default=2, help="top configs re-run on more seeds")
    parser.add_argument("--confirm-seeds", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=4, help="fresh seeds per arm")
    parser.add_argument("--first-seed", type=int, default=300, help="fresh seeds first..first+seeds-1")
    parser.add_argument("--quick", action="store_true", help="the smoke preset, 3 trials, 2 seeds: mechanics only")
    args = parser.parse_args()
    preset, trials, confirm, confirm_seeds, n_seeds = (
        args.preset,
        args.trials,
        args.confirm,
        args.confirm_seeds,
        args.seeds,
    )
    if args.quick:
        preset, trials, confirm, confirm_seeds, n_seeds = "smoke", 3, 1, 1, 2
    scratch = REPO / "outputs" / ("proving_quick" if args.quick else "proving") / preset
    kept = None if args.quick else RESULTS / "proving" / preset
    journal = (kept or scratch) / "study.journal"
    seeds = list(range(args.first_seed, args.first_seed + n_seeds))
    used = set(range(SEARCH_SEED, SEARCH_SEED + confirm_seeds + 1))
    if used & set(seeds):
        sys.exit(f"--first-seed: seeds {sorted(used & set(seeds))} are the sweep's own; pick fresh ones")
    command = sweep(preset, scratch / "sweep", journal, trials, confirm, confirm_seeds)
    overrides, chosen = winner(preset, journal)
    folders = run_arms(
        preset, {"preset": [], "winner": overrides}, seeds, scratch / "runs", None if kept is None else kept / "runs"
    )
    result = verdict(folders, seeds)
    show(chosen, result)
    out = RESULTS / ("proving_sweep_quick.json" if args.quick else "proving_sweep.json")
    out.write_text(json.dumps({"preset": preset, "sweep": command, "winner": chosen} | result, indent=1) + "\n")
    print(f"Results: {out}")


if __name__ == "__main__":
    main()
