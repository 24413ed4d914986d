"""The sweeper's own cost per trial as a study grows: grpo_lab's sweep vs Optuna's `study.optimize`.

Both run a no-op objective (benchmarks/baselines/noop_sweep_app.py through grpo_lab's sweeper and conf/;
benchmarks/baselines/plain_optuna.py), random sampler, same storage, with 1 and 4 worker processes on one
study. A second baseline splits the cost: Hydra's own basic sweeper launching the same number of no-op jobs
of the same app and conf/ (no Optuna, no storage), i.e. what any Hydra sweeper pays per job to compose the
job's config and set up its folder and logging; grpo_lab's sweeper minus that is its own cost.

The time per trial is read from the study itself (consecutive completion times; Hydra's jobs: their start
times), in windows at the start, the middle and the end of the study, so that growth with the number of
trials shows: O(1) per trial means the last window costs what the first does. Goal: flat.

    python benchmarks/sweeper_scaling.py                  # 100 trials; SQLite, journal (+ PostgreSQL, gRPC)
    python benchmarks/sweeper_scaling.py --trials 1000    # the growth over 1,000 (long: ~0.3 s a trial)
    python benchmarks/sweeper_scaling.py --storages postgresql grpc --workers 1 4 8   # the gRPC proxy's arm
PostgreSQL runs when --postgres URL (or GRPO_LAB_TEST_POSTGRES_URL) is given; so does `grpc`: the same database
behind Optuna's gRPC storage proxy (`python -m grpo_lab.sweep.proxy`, started here), each worker a proxy client
instead of a database connection pool; the table ends with gRPC's ms per trial against PostgreSQL direct, and
the most connections the database held during each (sampled from pg_stat_activity).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import _pairs

sys.path.insert(0, str(Path(__file__).resolve().parent / "baselines"))
from plain_optuna import storage  # the baseline's storage rule: both sides read the study alike

NOOP = str(_pairs.REPO / "benchmarks" / "baselines" / "noop_sweep_app.py")
PLAIN = str(_pairs.REPO / "benchmarks" / "baselines" / "plain_optuna.py")


def windows(n: int) -> list[tuple[int, int]]:
    """[start, end) ranks of completed trials: the first 10, ~10% in, ~50% in, the last 10 (10 each)."""
    marks = sorted({10, n // 10, n // 2, n})
    return [(max(m - 10, 0), m) for m in marks if m >= 10]


def ours(url: str, study: str, trials: int, work: Path) -> list[str]:
    return [
        sys.executable, NOOP, "-m",
        "hydra/sweeper=grpo_optuna", "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=none",
        f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.storage={url}", f"hydra.sweeper.study_name={study}",
        f"hydra.sweep.dir={work / study}", "hydra.sweeper.keep_models=none", "lr=tag(log, interval(1e-6, 1e-4))",
    ]  # fmt: skip


def plain(url: str, study: str, trials: int, work: Path) -> list[str]:
    return [sys.executable, PLAIN, "--storage", url, "--study", study, "--trials", str(trials)]


def hydra_basic(trials: int, work: Path, env: dict) -> dict[str, float]:
    """ms per job of Hydra's basic sweeper on the same app, in the same windows, from the jobs' start times
    (each job writes its .hydra/overrides.yaml first)."""
    out = work / f"hydra_basic_{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, NOOP, "-m", "hydra/sweeper=basic", f"hydra.sweep.dir={out}", f"lr=range(0,{trials})"]
    run_workers(cmd, 1, work, env)
    starts = sorted((out / str(i) / ".hydra" / "overrides.yaml").stat().st_mtime for i in range(trials))
    windows_ms = {}
    for a, b in windows(trials):
        lo, hi = (a, b) if b < trials else (a - 1, b - 1)  # job i's time: start of i+1 minus start of i
        windows_ms[f"trials {a + 1}-{b}"] = 1000 * (starts[hi] - starts[lo]) / (hi - lo)
    return windows_ms


def _create(url: str, study: str) -> None:
    import optuna

    optuna.create_study(study_name=study, storage=storage(url), direction="maximize", load_if_exists=True)


def run_workers(cmd: list[str], workers: int, cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]
    errors = [(p.wait(), p.stderr.read().decode(errors="replace")) for p in procs]
    for code, err in errors:
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {code}:\n{err[-3000:]}")
    return time.perf_counter() - started


def per_trial_ms(url: str, study: str, trials: int) -> dict[str, float]:
    import optuna
    from optuna.trial import TrialState

    done = optuna.load_study(study_name=study, storage=storage(url)).get_trials(states=(TrialState.COMPLETE,))
    ends = sorted(t.datetime_complete.timestamp() for t in done)
    if len(ends) < trials:
        raise SystemExit(f"study {study}: {len(ends)} of {trials} trials completed")
    out = {}
    for a, b in windows(trials):
        first = ends[a - 1] if a else min(t.datetime_start.timestamp() for t in done)
        out[f"trials {a + 1}-{b}"] = 1000 * (ends[b - 1] - first) / (b - a)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--storages", nargs="+", default=["sqlite", "journal", "postgresql", "grpc"])
    parser.add_argument("--postgres", default=os.environ.get("GRPO_LAB_TEST_POSTGRES_URL"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        env = _pairs.env(work / "cache", WANDB_MODE="disabled")
        urls = {
            "sqlite": lambda: f"sqlite:///{work / uuid.uuid4().hex}.db",
            "journal": lambda: f"journal:{work / uuid.uuid4().hex}.log",
        }
        if args.postgres:
            urls["postgresql"] = lambda: args.postgres
            if "grpc" in args.storages:
                from grpo_lab.sweep import proxy

                address = stack.enter_context(proxy.running(args.postgres))
                urls["grpc"] = lambda: address
        print(f"Hydra's basic sweeper: {args.trials} jobs", file=sys.stderr, flush=True)
        hydra_ms = hydra_basic(args.trials, work, env)
        # Worker counts outside, storages inside: each storage's arm runs next to the others' at the same worker
        # count, so that a machine whose speed drifts (a shared VM) shifts them alike.
        for workers in args.workers:
            for kind, make_url in ((k, u) for k, u in urls.items() if k in args.storages):
                row = {"storage": kind, "workers": workers, "trials": args.trials}
                for side, build in (("grpo_lab", ours), ("baseline", plain)):
                    url, study = make_url(), f"scaling_{uuid.uuid4().hex[:8]}"
                    if side == "baseline":  # Optuna's workers racing to create one SQLite schema fail; ours lock
                        _create(url, study)
                    print(f"{kind}, {workers} worker(s), {side}: {args.trials} trials", file=sys.stderr, flush=True)
                    with ConnectionCount(args.postgres if kind in ("postgresql", "grpc") else None) as peak:
                        wall = run_workers(build(url, study, args.trials, work), workers, work, env)
                    row[side] = {"wall_s": wall, "ms_per_trial": 1000 * wall / args.trials}
                    if peak.most is not None:  # what the proxy is for: one connection pool, not one per worker
                        row[side]["peak_db_connections"] = peak.most
                    row[side]["windows_ms"] = per_trial_ms(url, study, args.trials)
                    if kind in ("postgresql", "grpc"):
                        import optuna

                        from grpo_lab.sweep.storage import lock_study

                        optuna.delete_study(study_name=study, storage=args.postgres)
                        with contextlib.suppress(KeyError):  # the claim lock's study, behind the proxy
                            optuna.delete_study(study_name=lock_study(study), storage=args.postgres)
                row["hydra_basic_windows_ms"] = hydra_ms  # one worker: Hydra's sweeper has no shared study
                w_ours, w_base = row["grpo_lab"]["windows_ms"], row["baseline"]["windows_ms"]
                first, last = next(iter(w_ours)), list(w_ours)[-1]
                row["growth_last_vs_first"] = w_ours[last] / w_ours[first]
                row["ratio_median"] = statistics.median(w_ours[k] / w_base[k] for k in w_ours)
                # What grpo_lab adds to Hydra's own cost of a job (one worker: ms per trial, per window).
                if workers == 1:
                    row["own_ms_median"] = statistics.median(w_ours[k] - hydra_ms[k] for k in w_ours)
                rows.append(row)
                print(table([row]), flush=True)
    print(table(rows))
    print(grpc_vs_direct(rows))
    print(f"written: {_pairs.write('sweeper_scaling', rows, args.out)}")
    return 0


class ConnectionCount:
    """The most connections PostgreSQL held to the benchmark's database while the block ran (sampled every
    0.1 s from pg_stat_activity, this sampler's own connection left out); `most` stays None without a URL."""

    def __init__(self, url: str | None) -> None:
        self.url, self.most = url, None
        self._stop = threading.Event()

    def _sample(self) -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url)
        query = sqlalchemy.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        with engine.connect() as conn:
            while not self._stop.is_set():
                self.most = max(self.most or 0, conn.execute(query).scalar_one())
                conn.rollback()
                self._stop.wait(0.1)
        engine.dispose()

    def __enter__(self) -> ConnectionCount:
        if self.url:
            self.most = 0
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.url:
            self._stop.set()
            self._thread.join(timeout=10)


def grpc_vs_direct(rows: list[dict]) -> str:
    """grpo_lab's ms per trial through the gRPC proxy against PostgreSQL direct, at each number of workers."""
    by = {(r["storage"], r["workers"]): r["grpo_lab"]["ms_per_trial"] for r in rows}
    peak = {(r["storage"], r["workers"]): r["grpo_lab"].get("peak_db_connections") for r in rows}
    lines = [
        f"gRPC proxy vs PostgreSQL direct, {w} worker(s): {by[('grpc', w)]:.1f} vs {by[('postgresql', w)]:.1f} ms a "
        f"trial ({by[('grpc', w)] / by[('postgresql', w)]:.2f}x); at most {peak[('grpc', w)]} vs "
        f"{peak[('postgresql', w)]} database connections"
        for (kind, w) in by
        if kind == "grpc" and ("postgresql", w) in by
    ]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        head = f"{r['storage']}, {r['workers']} worker(s), {r['trials']} trials"
        lines.append(f"{head}: grpo_lab {r['grpo_lab']['ms_per_trial']:.1f} ms/trial overall, "
                     f"Optuna's optimize {r['baseline']['ms_per_trial']:.1f}; last/first window "
                     f"{r['growth_last_vs_first']:.2f}x; median ratio {r['ratio_median']:.2f}x")  # fmt: skip
        if "own_ms_median" in r:
            lines.append(f"    grpo_lab's own cost beyond Hydra's per-job cost: ~{r['own_ms_median']:.0f} ms a trial")
        lines.append(f"    {'window':<16} {'grpo_lab':>9}    {'Optuna':>9}    {'Hydra basic':>11}")
        for k, v in r["grpo_lab"]["windows_ms"].items():
            base, hydra = r["baseline"]["windows_ms"][k], r["hydra_basic_windows_ms"][k]
            lines.append(f"    {k:<16} {v:8.1f} ms {base:8.1f} ms {hydra:10.1f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
