"""Shared by the benchmarks: time whole processes A B A B, summarise, and write results/<name>.json.

Each command runs as a child process; `os.wait4` gives its own CPU time and peak RSS, so the numbers are
the command's, not this script's. The order alternates within each pair (A B, then B A) so that a slow
drift of the machine (another job, thermal) falls on both sides.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from grpo_lab.redact import redact

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Sample:
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    returncode: int


def measure(cmd: list[str], *, env: dict[str, str], cwd: Path, expect: int = 0) -> Sample:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != expect:
        raise SystemExit(f"{' '.join(cmd)} exited {code}, expected {expect}:\n{err[-3000:]}")
    # ru_maxrss is in KiB on Linux
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, code)


def alternate(a, b, pairs: int, warmup: int = 1) -> tuple[list[Sample], list[Sample]]:
    """Run the zero-argument callables `a` and `b` as A B / B A pairs after `warmup` runs of each."""
    xs, ys = rounds([a, b], pairs, warmup)
    return xs, ys


def rounds(fns: list, n: int, warmup: int = 1) -> list[list[Sample]]:
    """Run the zero-argument callables `n` times each after `warmup` runs, rotating their order every round
    (A B C, B C A, C A B, ...) so that no arm always runs first; one list of samples per callable."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    out: list[list[Sample]] = [[] for _ in fns]
    for i in range(n):
        for k in range(len(fns)):
            j = (i + k) % len(fns)
            out[j].append(fns[j]())
        walls = " vs ".join(f"{_wall(samples[-1]):.2f}" for samples in out)
        print(f"  round {i + 1}/{n}: {walls} s", file=sys.stderr, flush=True)
    return out


def _wall(sample: Sample | dict) -> float:
    """A Sample's wall time, or a richer run record's (a dict with `wall_s`: benchmarks/generation.py)."""
    return sample["wall_s"] if isinstance(sample, dict) else sample.wall_s


def summary(name: str, ours: list[Sample], base: list[Sample], baseline: str) -> dict:
    def stats(samples: list[Sample], key: str) -> dict:
        values = [getattr(s, key) for s in samples]
        return {"min": min(values), "median": statistics.median(values), "max": max(values), "raw": values}

    row = {"case": name, "baseline": baseline, "pairs": len(ours)}
    for key in ("wall_s", "cpu_s", "peak_rss_mib"):
        row[key] = {"grpo_lab": stats(ours, key), "baseline": stats(base, key)}
        # the median of the per-pair ratios: each pair ran back to back, under the same conditions
        ratios = [getattr(x, key) / getattr(y, key) for x, y in zip(ours, base, strict=True)]
        row[key]["ratios"] = ratios
        row[key]["ratio_median"] = statistics.median(ratios)
    return row


def regressions(rows: list[dict], goal: float, keys: tuple[str, ...] = ("wall_s",)) -> list[str]:
    """`case: metric` for each measure whose every pair was above `goal`: a regression that the machine's noise
    does not explain (a command at the goal does this by chance once in 2**pairs). The CI check's rule."""
    return [
        f"{r['case']}: {key} {r[key]['ratio_median']:.3f}x (every pair above {goal}x)"
        for r in rows
        for key in keys
        if min(r[key]["ratios"]) > goal
    ]


def check_exit(failed: list[str], check: bool) -> int:
    """A benchmark's exit status: 1 when `--check` was asked for and `regressions` found any (printed)."""
    if check and failed:
        print("regression:\n  " + "\n  ".join(failed))
    return 1 if (check and failed) else 0


def table(rows: list[dict]) -> str:
    lines = [
        f"{'case':<24} {'metric':<15} {'grpo_lab min/median/max':<26} {'baseline min/median/max':<26} ratio",
    ]
    for r in rows:
        for key, label in (("wall_s", "wall (s)"), ("cpu_s", "CPU (s)"), ("peak_rss_mib", "peak RSS (MiB)")):
            m = r[key]
            ours = "/".join(f"{m['grpo_lab'][k]:.2f}" for k in ("min", "median", "max"))
            base = "/".join(f"{m['baseline'][k]:.2f}" for k in ("min", "median", "max"))
            lines.append(f"{r['case']:<24} {label:<15} {ours:<26} {base:<26} {m['ratio_median']:.3f}x")
    return "\n".join(lines)


def machine() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {d: version(d) for d in ("torch", "trl", "transformers", "hydra-core", "optuna", "wandb")},
        "git_sha": sha or None,
        "command": _command(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _command(argv: list[str]) -> str:
    """What produced a results file, as typed from the repository root (benchmarks/report.py shows it): paths
    inside the repository relative to it (an `--out` given as an absolute path too), a storage URL's password
    masked (`--postgres`)."""

    def typed(arg: str) -> str:
        path = Path(arg).resolve()
        inside = Path(arg).is_absolute() and path.is_relative_to(REPO)
        return str(path.relative_to(REPO)) if inside else arg

    return redact(" ".join(["python", typed(str(Path(argv[0]).resolve())), *map(typed, argv[1:])]))


def write(name: str, rows: list[dict], out: Path | None) -> Path:
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**machine(), "benchmark": name, "rows": [dict(r) for r in rows]}, indent=2) + "\n")
    return path


def env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "GRPO_LAB_"))}
    out |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if cache is not None:
        out["GRPO_LAB_CACHE"] = str(cache)
    return out | extra
