"""Shared test helpers: compose configs like the CLI does, and run the CLI like a user would."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import warm_start

REPO = Path(__file__).resolve().parents[1]
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))

# A background job of a non-interactive shell (`make test &`, nohup, some CI runners) starts with SIGINT
# ignored, and every child inherits that, so Ctrl-C could never reach the CLIs the tests start. The tests
# act as a terminal, whose foreground job does get Ctrl-C: give this process Python's own handler back
# (a handled signal is reset to the default in exec'd children; an ignored one would stay ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One thread per torch process. The tests' models are tiny: a second thread makes no run faster (7.2 s vs 7.0 s for a
# two-job grid), but pytest-xdist's workers, a sweep's parallel trials and multi-process jobs each start processes
# side by side, and OpenMP threads spin-waiting on a busy core cost the other process its time (two grids at once:
# 11.1 s each with 2 threads, 7.2 s with 1). Set before anything imports torch; a value of one's own is kept.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def compose(overrides: list[str]):
    """The composed DictConfig for these overrides, exactly as `python -m grpo_lab` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_lab.cli import prepare_overrides
    from grpo_lab.paths import CONF_DIR

    rewritten, _ = prepare_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=rewritten)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache folder for the whole session: the tiny model is built once."""
    return tmp_path_factory.mktemp("grpo_lab_cache")


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "GRPO_LAB_"))}
    # Not logged in: grpo_lab picks W&B offline by itself. HF offline: nothing may touch the Hub.
    env.update({"GRPO_LAB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def run_cli(
    args: list[str],
    cwd: Path,
    cache: Path,
    timeout: float = 300,
    module: str = "grpo_lab",
    fresh: bool = False,
    **env: str,
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in `cwd` (so outputs/ lands there): grpo_lab, grpo_lab.compare, .doctor...

    A new process either way; its imports are done once per pytest worker (tests/warm_start.py) unless `fresh`:
    pass fresh=True where the interpreter's own start is part of what the test checks."""
    full_env = cli_env(cache, **env)
    warm = None if fresh else _warm_socket(cache, full_env)
    argv = warm_start.client_argv(warm, module, args) if warm else [sys.executable, "-m", module, *args]
    return subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


_WARM: dict[Path, str | None] = {}


def _warm_socket(cache: Path, env: dict[str, str]) -> str | None:
    """The warm interpreter's socket for runs with this cache, started on first use; None: start fresh."""
    if os.environ.get("GRPO_LAB_TEST_FRESH") or any(k.startswith("COVERAGE_") for k in os.environ):
        return None  # asked for; or coverage, which measures each interpreter from its start
    base = cli_env(cache)
    if {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)} - {"PYTHONPATH"}:
        return None  # a variable the libraries may read when imported (HF_*, WANDB_*...) differs
    if cache not in _WARM:
        _WARM[cache] = _start_warm(cache, base)
    return _WARM[cache]


def _start_warm(cache: Path, env: dict[str, str]) -> str | None:
    folder = Path(tempfile.mkdtemp(prefix="grpo-lab-warm-"))
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("warm_start.py")), str(folder / "socket")],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=(folder / "server.log").open("w"),
        text=True,
    )
    atexit.register(shutil.rmtree, folder, True)
    atexit.register(server.kill)  # runs first: atexit is last in, first out
    if server.stdout.readline().strip() != "ready":
        server.kill()
        return None
    return str(folder / "socket")


def write_sweep(config_dir: Path, name: str, body: str) -> list[str]:
    """A sweep of the test's own, offered as `sweep=<name>` through Hydra's --config-dir."""
    (config_dir / "sweep").mkdir(parents=True, exist_ok=True)
    header = "# @package _global_\ndefaults:\n  - override /hydra/sweeper: grpo_optuna\n"
    (config_dir / "sweep" / f"{name}.yaml").write_text(header + body)
    return ["--config-dir", str(config_dir), f"sweep={name}"]


# Fast jobs: the tiny model, 2 steps, no evaluation before training, nothing saved.
FAST = ["experiment=smoke", "max_steps=2", "eval.before=false", "output.save_model=false"]
# The same on two CPU processes (gloo) through accelerate.
DDP = [*FAST, "launcher=ddp", "launcher.num_processes=2"]
# The tiny model on a reward it learns within seconds (learnable_rewards.digit_share; measured in test_learning.py):
# 2 prompts x 8 completions a step at lr 1e-2, no KL term. Needs PYTHONPATH=tests.
DIGITS = [
    "experiment=smoke",
    "seed=3",
    "lr=1e-2",
    "beta=0",
    "num_generations=8",
    "trainer.per_device_train_batch_size=16",
    "data.train_size=64",
    "~reward.functions.length",
    "~reward.weights.length",
    "+reward.functions.digits._target_=learnable_rewards.digit_share",
    "+reward.weights.digits=1.0",
]
# The same, graded on validation by what that reward works against (learnable_rewards.few_digits): reward hacking.
DIGITS_AGAINST_ITS_GRADER = [
    *DIGITS,
    "eval/graders=none",
    "+eval.graders.words={_target_: learnable_rewards.few_digits}",
    "objective.metric=eval_after/words",
]


def skip_here(reason: str) -> None:
    """Skip a test this machine cannot run; in CI (where every service is provided) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must be able to run this: {reason}")
    pytest.skip(reason)


def postgres_url() -> str:
    """The PostgreSQL admin URL that .ci/run provides (GRPO_LAB_TEST_POSTGRES_URL)."""
    url = os.environ.get("GRPO_LAB_TEST_POSTGRES_URL")
    if not url:
        skip_here("set GRPO_LAB_TEST_POSTGRES_URL=postgresql+psycopg2://... to run (see .ci/run)")
    return url


def fresh_postgres_database(admin_url: str, tag: str) -> str:
    """A new, empty PostgreSQL database's URL (workers racing on it create the schema and the study)."""
    import sqlalchemy

    name = f"grpo_lab_{tag}_{os.getpid()}_{time.time_ns()}"
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def sqlite_url(cwd: Path) -> str:
    """The default sweep storage of a run started in `cwd`."""
    return f"sqlite:///{cwd / 'outputs' / 'sweeps' / 'optuna.db'}"


def load_study(cwd: Path, name: str, storage: str | None = None):
    import optuna

    return optuna.load_study(study_name=name, storage=storage or sqlite_url(cwd))


def trials_if_ready(load) -> list | None:
    """`load().trials` while a worker may still be creating the study: None until it exists. A reader racing
    the creation sees no study yet (KeyError) or half of Optuna's schema ("table ... already exists" when its
    own RDBStorage tries to create it too): the race the sweep's workers retry, `storage.is_race`."""
    from grpo_lab.sweep.storage import is_race

    try:
        return load().trials
    except KeyError:
        return None
    except Exception as e:
        if is_race(e):
            return None
        raise


PRUNE_SWEEP = """
hydra:
  sweeper:
    study_name: prune
    n_trials: 2
    objectives: [{metric: train/reward_end, direction: maximize}]
    # One finished trial is enough for the median pruner to compare against.
    pruner: {n_startup_trials: 1, n_warmup_steps: 0}  # the default pruner, median
    params:
      # An ideal length of 2 characters: every completion scores 0, clearly worse than 40.
      reward.functions.length.ideal_length: choice(40, 2)
    enqueue:
      - {reward.functions.length.ideal_length: 40}
      - {reward.functions.length.ideal_length: 2}
"""


def run_prune_sweep(cwd: Path, cache: Path, *extra: str) -> list:
    """A good trial, then a clearly bad one that the median pruner stops early; returns the trials."""
    args = write_sweep(cwd / "conf", "prune", PRUNE_SWEEP)
    proc = run_cli(
        ["-m", *args, *FAST, "max_steps=6", "eval.after=false", "objective.metric=train/reward_end", *extra],
        cwd,
        cache,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_study(cwd, "prune").trials


def error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The one error line of a failed command: non-zero exit, no traceback, the message on a single line."""
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    # "Error: ..." ends a command outside a job (storage, output folder, a sweep); a single run's job logs
    # "ERROR grpo_lab: ..." and stops there.
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    lines = lines or [line for line in proc.stderr.splitlines() if line.startswith("ERROR ")]
    assert len(lines) == 1, proc.stderr[-4000:]
    # The message is not continued on further lines (a driver's "\n\tIs the server running?", SQLAlchemy's
    # "(Background on this error at: ...)").
    after = proc.stderr.split(lines[0], 1)[1].splitlines()[1:2]
    assert not (after and after[0][:1] in ("\t", " ", "(")), proc.stderr[-4000:]
    assert "(Background on this error" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def one_line_naming(error_or_text: BaseException | str, *names: str) -> str:
    """Assert an error (or a CLI's message) is one line that carries every name literally: the config key,
    file:line, value or nearest valid name the user needs to act. Not its prose, which may be reworded.
    Returns the text, for a test that checks one more thing (an order, a value that must be absent)."""
    text = str(error_or_text) if isinstance(error_or_text, BaseException) else error_or_text.strip()
    assert "\n" not in text, f"not one line: {text!r}"
    missing = [name for name in names if name not in text]
    assert not missing, f"{missing} not in: {text!r}"
    return text
