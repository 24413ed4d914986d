"""What a test's CLI job forked from the warm interpreter (tests/warm_start.py) costs, with the interpreter's
imported objects frozen (gc.freeze, as the tests run) against the same server unfrozen (the baseline).

Two warm servers, one of each, serve the same jobs in A B / B A pairs, each job timed from the client's start to
its exit, as `conftest.run_cli` starts it:
- `refused`: `python -m grpo_lab experiment=smoke model=tinyy`, refused in one line before any model (the
  suite's many one-line error tests);
- `smoke`: a 2-step smoke run of the tiny model with W&B offline (conftest.FAST, the suite's usual job).

    python benchmarks/warm_jobs.py              # 6 pairs each (~1.5 min on 2 CPU cores)

Results: benchmarks/results/warm_jobs.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _pairs import REPO, RESULTS, Sample, machine, rounds, summary

sys.path.insert(0, str(REPO / "tests"))
import warm_start

import conftest  # the tests' own way of starting a CLI job

JOBS = {
    "refused": (["experiment=smoke", "model=tinyy"], 1),
    "smoke": (conftest.FAST, 0),
}


def server(cache: Path, frozen: bool) -> str:
    env = conftest.cli_env(cache) | ({} if frozen else {"GRPO_LAB_TEST_WARM_UNFROZEN": "1"})
    socket = conftest._start_warm(cache, env)
    if socket is None:
        sys.exit("the warm server did not start")
    return socket


def job(socket: str, cache: Path, args: list[str], expect: int):
    def run() -> Sample:
        with tempfile.TemporaryDirectory() as cwd:
            started = time.perf_counter()
            argv = warm_start.client_argv(socket, "grpo_lab", args)
            proc = subprocess.run(argv, cwd=cwd, env=conftest.cli_env(cache), capture_output=True, text=True)
            wall = time.perf_counter() - started
        if proc.returncode != expect:
            sys.exit(f"{' '.join(args)} exited {proc.returncode}, expected {expect}:\n{proc.stderr[-3000:]}")
        return Sample(wall, float("nan"), float("nan"), proc.returncode)  # the job is the server's grandchild

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="grpo-lab-warm-bench-"))
    frozen, unfrozen = server(cache, frozen=True), server(cache, frozen=False)
    rows = []
    for name, (job_args, expect) in JOBS.items():
        print(f"{name}: {' '.join(job_args)}", file=sys.stderr)
        ours, base = rounds([job(frozen, cache, job_args, expect), job(unfrozen, cache, job_args, expect)], args.pairs)
        rows.append(summary(name, ours, base, baseline="the same warm server, unfrozen"))
    print(f"{'job':<10} {'frozen (s) min/median/max':<28} {'unfrozen (s) min/median/max':<28} ratio (median of pairs)")
    for r in rows:
        w = r["wall_s"]
        cells = ["/".join(f"{w[arm][k]:.2f}" for k in ("min", "median", "max")) for arm in ("grpo_lab", "baseline")]
        print(f"{r['case']:<10} {cells[0]:<28} {cells[1]:<28} {w['ratio_median']:.3f}x")
    out = RESULTS / "warm_jobs.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    print(f"Results: {out}")


if __name__ == "__main__":
    main()
