"""What grpo_lab costs on top of TRL: the same GRPO training run through grpo_lab and as a bare TRL script.

Both sides train the same model folder on the same prompts (dumped to JSONL from grpo_lab's data), with the
same GRPOConfig values (dumped from grpo_lab's own mapping, config.grpo_kwargs), the same reward functions
and weights, W&B offline; grpo_lab's evaluations and model saving are off, so the difference is the
harness: composing and validating the config, the recorder, the health monitor, run folder and summary.
Cases: the tiny model for 10 steps, SmolLM2-135M for 3 steps. Goal: <= 1.03x wall and peak memory on the
tiny model.

    python benchmarks/overhead.py                  # both cases, 5 pairs after a warm-up; results/overhead.json
    python benchmarks/overhead.py --cases tiny --pairs 3
    python benchmarks/overhead.py --quick --check   # CI: tiny, 3 pairs; exit 1 when every pair is above the goal
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import _pairs

GOAL = 1.03
BARE = str(_pairs.REPO / "benchmarks" / "baselines" / "bare_trl.py")
OFF = ["eval.before=false", "eval.after=false", "output.save_model=false", "objective.metric=train/reward_end"]
CASES = {  # name: (grpo_lab overrides, the baseline's reward set)
    "tiny, 10 steps": (["experiment=smoke", "max_steps=10", *OFF], "smoke"),
    "SmolLM2-135M, 3 steps": (["experiment=quickstart", "max_steps=3", *OFF], "gsm8k"),
}


def _dump(overrides: list[str], work: Path, cache: Path) -> tuple[Path, Path, Path]:
    """The model folder, the prompts as JSONL and the GRPOConfig values grpo_lab would use."""
    from hydra import compose, initialize_config_dir

    from grpo_lab import config, data, models
    from grpo_lab.cli import prepare_overrides
    from grpo_lab.paths import CONF_DIR

    args, _ = prepare_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        run = config.load(compose(config_name="config", overrides=args))
    models.prepare(run.model, cache)  # build or convert once, outside the timing
    source = models.resolve_source(run.model.name_or_path)
    folder = cache / "models" / str(source.cache_name)
    prompts = work / "train.jsonl"
    with prompts.open("w") as f:
        for row in data.load_datasets(run.data).train:
            f.write(json.dumps(row) + "\n")
    kwargs = config.grpo_kwargs(run, output_dir="unused", report_to=[], run_name=None)
    for key in ("output_dir", "report_to", "run_name"):
        kwargs.pop(key)
    settings = work / "grpo.json"
    settings.write_text(json.dumps(kwargs, default=str))
    return folder, prompts, settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cases", default="tiny,smollm2", help="tiny, smollm2 or both")
    parser.add_argument("--quick", action="store_true", help="the tiny case, 3 pairs (CI)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when every tiny pair is above {GOAL}x")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.cases, args.pairs = "tiny", 3
    chosen = [name for name in CASES if name.lower().split(",")[0].split("-")[0] in args.cases.lower()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache"
        env = _pairs.env(cache, WANDB_MODE="offline")
        for name in chosen:
            overrides, reward_set = CASES[name]
            print(f"{name}:", file=sys.stderr)
            folder, prompts, settings = _dump(overrides, work, cache)
            ours = [sys.executable, "-m", "grpo_lab", *overrides]
            base = [sys.executable, BARE, "--model", str(folder), "--prompts", str(prompts), "--config", str(settings)]
            base += ["--rewards", reward_set, "--out", str(work / "bare")]
            xs, ys = _pairs.alternate(
                partial(_pairs.measure, ours, env=env, cwd=work),
                partial(_pairs.measure, base, env=env, cwd=work),
                args.pairs,
            )
            rows.append(_pairs.summary(name, xs, ys, baseline="bare TRL script (benchmarks/baselines/bare_trl.py)"))
    print(_pairs.table(rows))
    print(f"written: {_pairs.write('overhead', rows, args.out)}")
    for r in rows:
        if r["case"].startswith("tiny"):
            for key in ("wall_s", "peak_rss_mib"):
                verdict = "meets" if r[key]["ratio_median"] <= GOAL else "misses"
                print(f"{r['case']}: {key} {r[key]['ratio_median']:.3f}x {verdict} the goal of {GOAL}x")
    failed = _pairs.regressions([r for r in rows if r["case"].startswith("tiny")], GOAL, ("wall_s", "peak_rss_mib"))
    return _pairs.check_exit(failed, args.check)


if __name__ == "__main__":
    sys.exit(main())
