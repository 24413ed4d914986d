"""Stress the sweep's promise: n workers, exactly n_trials finished trials, nothing lost, nothing left running.

Each repetition starts W workers of the same smoke sweep (`python -m grpo_lab -m sweep=lr_beta ...`) on one
fresh study, with a CPU hog beside them; in every other repetition one random worker is `kill -9`ed at a
random moment, and once the survivors end, the same command is run again to resume. Then it reads the study:

  expected/got   n_trials vs COMPLETE+PRUNED trials at the end
  duplicates     trial numbers seen twice, or two finished trials with identical parameters
  overshoot      finished trials beyond n_trials
  lost           trials whose run folder says `finished` but that the study does not hold as COMPLETE
  running        trials still RUNNING after the resume
  FAIL           trials recorded FAIL (the killed worker's trial: not counted, its number is not reused)

    python benchmarks/sweep_stress.py                                  # all storages, 2 and 4 workers, 10 reps
    python benchmarks/sweep_stress.py --storages grpc --workers 4,8 --reps 4   # through Optuna's gRPC proxy
    python benchmarks/sweep_stress.py --storages sqlite,postgresql --workers 2 --reps 2 --trials-per-worker 1 --check
                                                                       # CI (tests/test_stress.py): exit 1 on any error
    python benchmarks/sweep_stress.py --merge a.json b.log          # one table of earlier (partial) runs

PostgreSQL and grpc (workers through Optuna's gRPC storage proxy in front of PostgreSQL) need
GRPO_LAB_TEST_POSTGRES_URL (an admin URL; each repetition creates its own database).
Writes benchmarks/results/sweep_stress.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAST = ["experiment=smoke", "max_steps=2", "eval.before=false", "output.save_model=false"]
ERROR_COLUMNS = ("duplicates", "overshoot", "lost", "running", "short")


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "GRPO_LAB_"))}
    env |= {"GRPO_LAB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return env


def _storage(kind: str, work: Path, rep: int, stack: contextlib.ExitStack) -> tuple[str, str]:
    """(storage URL for the sweep, URL or journal path to read it back). `grpc`: the workers go through Optuna's
    gRPC proxy (`python -m grpo_lab.sweep.proxy`, stopped with `stack`) in front of a PostgreSQL database."""
    if kind == "sqlite":
        url = f"sqlite:///{work / 'optuna.db'}"
        return url, url
    if kind == "journal":
        return f"journal:{work / 'optuna.log'}", str(work / "optuna.log")
    if kind == "grpc":
        from grpo_lab.sweep import proxy

        _, database = _storage("postgresql", work, rep, stack)
        return stack.enter_context(proxy.running(database)), database
    import sqlalchemy

    admin_url = os.environ["GRPO_LAB_TEST_POSTGRES_URL"]
    name = f"grpo_lab_stress_{os.getpid()}_{rep}_{int(time.time())}"
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    return url, url


def _load(kind: str, where: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if kind == "journal":
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return optuna.load_study(study_name="lr_beta", storage=JournalStorage(JournalFileBackend(where)))
    return optuna.load_study(study_name="lr_beta", storage=where)


def one_sweep(
    kind: str, workers: int, n_trials: int, kill: bool, rep: int, cache: Path, work_root: Path | None = None
) -> dict:
    with contextlib.ExitStack() as stack:
        return _one_sweep(kind, workers, n_trials, kill, rep, cache, work_root, stack)


def _one_sweep(
    kind: str, workers: int, n_trials: int, kill: bool, rep: int, cache: Path, work_root: Path | None, stack
) -> dict:
    from optuna.trial import TrialState

    work = Path(tempfile.mkdtemp(prefix=f"stress_{kind}_{workers}_", dir=work_root))
    url, where = _storage(kind, work, rep, stack)
    args = [sys.executable, "-m", "grpo_lab", "-m", "sweep=lr_beta", *FAST, f"hydra.sweeper.n_trials={n_trials}"]
    args += [f"hydra.sweeper.storage='{url}'", "hydra/sweeper/pruner=none", "hydra.sweeper.heartbeat_interval=1"]
    args += ["hydra.sweeper.grace_period=4"]
    started = time.monotonic()
    logs = [(work / f"worker{i}.log").open("w") for i in range(workers)]
    procs = [
        subprocess.Popen(args, cwd=work, env=_env(cache), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for log in logs
    ]
    killed = None
    if kill:
        time.sleep(random.uniform(5, 25))  # imports take ~6 s: some kills land in start-up, most mid-trial
        killed = random.randrange(workers)
        if procs[killed].poll() is None:
            os.killpg(procs[killed].pid, signal.SIGKILL)
    codes = [p.wait(timeout=1200) for p in procs]
    resumed = None
    if kill:
        time.sleep(5)  # past the grace period: the killed worker's trial is stale
        with (work / "resume.log").open("w") as log:
            resumed = subprocess.run(args, cwd=work, env=_env(cache), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    trials = _load(kind, where).trials
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    numbers = [t.number for t in trials]
    params = [tuple(sorted(t.params.items())) for t in finished]
    lost = 0  # the job finished (its run folder says so) but the study does not hold the trial as COMPLETE
    for t in trials:
        metrics = Path(t.user_attrs.get("run_dir", "/nonexistent")) / "metrics.json"
        done = metrics.exists() and json.loads(metrics.read_text()).get("status") == "finished"
        lost += done and t.state != TrialState.COMPLETE
    ok_codes = all(c == 0 for i, c in enumerate(codes) if i != killed) and resumed in (None, 0)
    return {
        "storage": kind,
        "workers": workers,
        "kill": kill,
        "expected": n_trials,
        "got": len(finished),
        "duplicates": (len(numbers) - len(set(numbers))) + (len(params) - len(set(params))),
        "overshoot": max(0, len(finished) - n_trials),
        "short": max(0, n_trials - len(finished)),
        "lost": lost,
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "failed": sum(t.state == TrialState.FAIL for t in trials),
        "exit_codes_ok": ok_codes,
        "wall_s": round(wall, 1),
        "folder": str(work),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storages", default="sqlite,journal,postgresql,grpc")
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--only-kills", action="store_true", help="kill a worker in every repetition")
    parser.add_argument("--no-hog", action="store_true", help="do not run a CPU hog beside the workers")
    parser.add_argument("--check", action="store_true", help="exit 1 when any error column is non-zero")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials-per-worker", type=int, default=2, help="n_trials = this x workers")
    parser.add_argument("--work", type=Path, help="folder for the sweeps' folders (default: the temp folder)")
    parser.add_argument("--cache", type=Path, help="grpo_lab's model cache to use (default: a new one)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sweep_stress.json")
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="measure nothing: one table of the rows of earlier runs (their --out JSON, or their printed lines)",
    )
    opts = parser.parse_args()
    rows = [row for path in opts.merge for row in _rows(path)] if opts.merge else _measure(opts)
    table = _table(rows)
    print(table)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    meta["git"] = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if opts.merge:
        meta["merged"] = [str(p) for p in opts.merge]
    opts.out.write_text(json.dumps({"meta": meta, "rows": rows, "table": table}, indent=2) + "\n")
    bad = any(r[c] for r in rows for c in ERROR_COLUMNS) or not all(r["exit_codes_ok"] for r in rows)
    return 1 if opts.check and bad else 0


def _measure(opts: argparse.Namespace) -> list[dict]:
    random.seed(opts.seed)
    storages = [s for s in opts.storages.split(",") if s]
    for needs_postgres in ("postgresql", "grpc"):
        if needs_postgres in storages and not os.environ.get("GRPO_LAB_TEST_POSTGRES_URL"):
            print(f"{needs_postgres} skipped: set GRPO_LAB_TEST_POSTGRES_URL", file=sys.stderr)
            storages.remove(needs_postgres)
    cache = opts.cache or Path(tempfile.mkdtemp(prefix="stress_cache_"))
    hog = None if opts.no_hog else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = []
    try:
        for kind in storages:
            for workers in (int(w) for w in opts.workers.split(",")):
                for rep in range(opts.reps):
                    n_trials = opts.trials_per_worker * workers
                    kill = opts.only_kills or rep % 2 == 1
                    row = one_sweep(kind, workers, n_trials, kill, rep, cache, work_root=opts.work)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if hog is not None:
            hog.kill()
    return rows


def _rows(path: Path) -> list[dict]:
    """The rows of an earlier run: its JSON result file, or the JSON lines it printed (a run cut short)."""
    text = path.read_text()
    if text.lstrip().startswith("{\n") or text.lstrip().startswith('{"meta"'):
        return json.loads(text)["rows"]
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"storage"')]


def _table(rows: list[dict]) -> str:
    header = (
        "| storage | workers | reps (killed) | trials expected/got | duplicates | overshoot | lost | running left "
        "| short | FAIL (killed) | exit codes ok | wall s (median) |"
    )
    lines = [header, "|" + "---|" * 12]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["storage"], r["workers"]), []).append(r)
    for (kind, workers), rs in groups.items():
        walls = sorted(r["wall_s"] for r in rs)
        lines.append(
            f"| {kind} | {workers} | {len(rs)} ({sum(r['kill'] for r in rs)}) | "
            f"{sum(r['expected'] for r in rs)}/{sum(r['got'] for r in rs)} | "
            + " | ".join(str(sum(r[c] for r in rs)) for c in ("duplicates", "overshoot", "lost", "running", "short"))
            + f" | {sum(r['failed'] for r in rs)} | {sum(r['exit_codes_ok'] for r in rs)}/{len(rs)}"
            + f" | {walls[len(walls) // 2]} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
