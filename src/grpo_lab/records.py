"""The run folder: every file a job leaves behind, written and read here only.

config.yaml          the resolved config (as composed, interpolations resolved)
overrides.yaml       the command-line overrides of this job
environment.json     package versions, python, platform, git commit of the project
history.jsonl        one line per logged trainer step (written live, survives a crash)
eval_periodic.jsonl  one line per periodic evaluation (`eval.every_n_steps`, written live)
metrics.json         status, objective, before/after evaluation, final training metrics, periodic evals
summary.txt          the run's readable summary (printed at the end of a single run or grid job)
eval_*.jsonl         the held-out completions, graded (eval_before.jsonl, eval_after.jsonl)
trainer/checkpoint-N the trainer's checkpoints (`trainer.save_strategy=steps`), for `resume=<run folder>`
model/               the final model or LoRA adapter (unless output.save_model=false)

Readers: a missing file gives None (JSON/YAML files) or [] (JSONL files); a JSON or YAML file that
exists but cannot be read or parsed raises :class:`RunFolderError` naming it (these files are written
atomically, so that means damage from outside); in a JSONL file, a line that is not JSON (cut by a
crash) is skipped. :data:`HEADLINES` are the training metrics every view of a run shows first.

Every file written here passes through :func:`grpo_lab.redact.redact` (storage passwords, API keys and
tokens are masked), and so do Hydra's own copies of the config (`.hydra/*.yaml`, `multirun.yaml`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.redact import redact
from grpo_lab.tracking import TrackerInfo

CONFIG = "config.yaml"
OVERRIDES = "overrides.yaml"
ENVIRONMENT = "environment.json"
HISTORY = "history.jsonl"
EVAL_PERIODIC = "eval_periodic.jsonl"
METRICS = "metrics.json"
SUMMARY = "summary.txt"
TRAINER = "trainer"
MODEL = "model"


class RunFolderError(GrpoLabError):
    """A file of a run folder exists but cannot be read (damaged, or not written by grpo_lab)."""


@dataclass(frozen=True)
class Headline:
    """A training metric that every view of a run shows first (progress bar, leaderboard, curves, W&B)."""

    key: str  # TRL's log key: a history.jsonl row's key
    column: str  # the leaderboard's column
    short: str  # beside the progress bar
    title: str  # the training curve's title

    @property
    def metric(self) -> str:
        """The key in metrics.json's `metrics` and in the W&B run (summary and history)."""
        return f"train/{self.key}"


HEADLINES = (
    Headline("reward", "reward", "reward", "reward"),
    Headline("reward_std", "reward_std", "std", "reward std"),
    Headline("kl", "kl", "kl", "KL to the reference"),
    Headline("completions/mean_length", "length", "len", "mean completion length (tokens)"),
)

_PACKAGES = (
    "grpo-lab",
    "torch",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "peft",
    "wandb",
    "hydra-core",
    "omegaconf",
    "optuna",
)


def _yaml(data: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(data))


def git_commit(root: Path | None = None) -> dict[str, Any] | None:
    """The commit of the user's repository (the one around the current directory, or `root`: where their
    presets and rewards live; grpo_lab's own version is in `packages`) and whether its tree had uncommitted
    changes; None outside a git repository."""
    root = root or Path.cwd()
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def environment() -> dict[str, Any]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "git": git_commit(),
    }


def write_start(run_dir: Path, resolved_config: dict[str, Any], overrides: list[str]) -> None:
    """config.yaml, overrides.yaml and environment.json: what a job writes as it starts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in resolved_config.items() if k != "hydra"}
    write_atomic(run_dir / CONFIG, _yaml(redact(config)))
    write_atomic(run_dir / OVERRIDES, _yaml(redact(list(overrides))))
    write_json(run_dir / ENVIRONMENT, environment())


def redact_hydra_files(run_dir: Path, output_subdir: str | None, sweep_dir: Path | None = None) -> None:
    """Mask secrets in the copies of the config that Hydra writes before the job starts.

    Hydra saves `.hydra/config.yaml`, `hydra.yaml` (with the command line's `hydra.*` overrides, e.g. a
    sweep storage URL with its password) and `overrides.yaml` in the run folder, and `multirun.yaml` in
    the sweep folder; the job rewrites them masked as soon as it starts.
    """
    names = ("config.yaml", "hydra.yaml", "overrides.yaml") if output_subdir is not None else ()
    paths = [run_dir / str(output_subdir) / name for name in names]
    if sweep_dir is not None:
        paths.append(sweep_dir / "multirun.yaml")
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        masked = redact(text)
        if masked != text:
            write_atomic(path, masked)


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a reader never sees half a file, a full disk leaves none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: store them as strings so the file stays readable everywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item())
    return value


def write_json(path: Path, data: Any, *, redact_secrets: bool = True) -> None:
    """`data` as JSON, secrets masked; atomically (a reader never sees half a file).

    `redact_secrets=False` only for files that hand a job its own config (`launch/job.json`): the child
    process needs the real values.
    """
    data = _jsonable(data)
    write_atomic(path, json.dumps(redact(data) if redact_secrets else data, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(redact(_jsonable(row))) + "\n")


def write_eval(run_dir: Path, name: str, samples: list[dict[str, Any]]) -> None:
    """`<name>.jsonl` (eval_before, eval_after): one graded completion a line, replacing an older file."""
    path = run_dir / f"{name}.jsonl"
    path.unlink(missing_ok=True)
    for sample in samples:
        append_jsonl(path, sample)


def restart_jsonl(path: Path, upto: int | None) -> list[dict[str, Any]]:
    """Start a live JSONL file (history, periodic evals) again: empty, or with only the rows up to step
    `upto` (a resumed run trains the later steps again). Returns the rows kept."""
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= upto] if upto is not None else []
    path.unlink(missing_ok=True)
    for row in rows:
        append_jsonl(path, row)
    return rows


# ------------------------------------------------------------------------------------- metrics.json
@dataclass
class RunResult:
    """How a job ended; metrics.json holds it (see :func:`write_metrics` and :func:`read_result`)."""

    status: str  # finished | failed | pruned | interrupted | diverged | stopped (a health rule)
    objective: float
    objective_metric: str
    metrics: dict[str, float]
    run_dir: Path
    run_name: str
    tracker: TrackerInfo
    history: list[dict[str, Any]] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    health: list[dict[str, Any]] = field(default_factory=list)  # grpo_lab.health events, in order


def write_summary(run_dir: Path, text: str) -> Path:
    path = run_dir / SUMMARY
    write_atomic(path, redact(text))
    return path


def write_metrics(result: RunResult, **extra: Any) -> None:
    """metrics.json for `result`; `extra` adds keys (error, interrupted, pruned, params, eval_periodic ...)."""
    write_json(
        result.run_dir / METRICS,
        {
            "status": result.status,
            "run_name": result.run_name,
            "objective": {"metric": result.objective_metric, "value": result.objective},
            "metrics": result.metrics,
            "durations_s": result.durations,
            "wandb": vars(result.tracker),
            # The health events (rule, step, action, message, values); [] = watched, nothing fired.
            "health": result.health,
            **extra,
        },
    )


def read_metrics(run_dir: Path) -> dict[str, Any] | None:
    """metrics.json as written (NaN/inf as strings); None when the run left none (still running, killed)."""
    data = _read_file(run_dir / METRICS, json.loads)
    if data is not None and not isinstance(data, dict):
        raise RunFolderError(f"{run_dir / METRICS} is not a JSON object.")
    return data


def number(value: Any) -> float | None:
    """A metric as stored in metrics.json (NaN/inf are the strings "nan"/"inf"); None for anything else."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_result(run_dir: Path) -> RunResult | None:
    """The RunResult that metrics.json records (how a multi-process job's parent learns it); None without one."""
    data = read_metrics(run_dir)
    if data is None:
        return None
    if "status" not in data:
        raise RunFolderError(f"{run_dir / METRICS} has no `status`.")

    def nan_if_none(value: Any) -> float:
        found = number(value)
        return found if found is not None else float("nan")

    objective = data.get("objective") or {}
    return RunResult(
        status=data["status"],
        objective=nan_if_none(objective.get("value")),
        objective_metric=objective.get("metric", ""),
        metrics={k: nan_if_none(v) for k, v in (data.get("metrics") or {}).items()},
        run_dir=run_dir,
        run_name=data.get("run_name", ""),
        tracker=TrackerInfo(**(data.get("wandb") or {"mode": "disabled"})),
        durations=data.get("durations_s") or {},
        error=data.get("error") or data.get("pruned"),
        health=data.get("health") or [],
    )


# ------------------------------------------------------------------------------------------ readers
def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")  # a cut multi-byte character: a bad line
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunFolderError(f"Cannot read {path}: {e.strerror or e}.") from e


def _read_file(path: Path, parse: Any) -> Any:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as e:  # json.JSONDecodeError and yaml.YAMLError (below) both say where
        raise RunFolderError(f"{path} is damaged (cut short or edited?): {e}") from e


def _yaml_load(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e).replace("\n", " ")) from e


def read_config(run_dir: Path) -> dict[str, Any] | None:
    """config.yaml (secrets masked); None when the job never started."""
    data = _read_file(run_dir / CONFIG, _yaml_load)
    if data is not None and not isinstance(data, dict):
        raise RunFolderError(f"{run_dir / CONFIG} is not a mapping.")
    return data


def read_overrides(run_dir: Path) -> list[str]:
    """The job's command-line overrides as written (overrides.yaml, else Hydra's `.hydra/overrides.yaml`);
    [] when neither exists."""
    for path in (run_dir / OVERRIDES, run_dir / ".hydra" / OVERRIDES):
        data = _read_file(path, _yaml_load)
        if data is not None:
            if not isinstance(data, list):
                raise RunFolderError(f"{path} is not a list of overrides.")
            return [str(o) for o in data]
    return []


def read_environment(run_dir: Path) -> dict[str, Any] | None:
    """environment.json (versions, platform, git commit); None when the job never started."""
    return _read_file(run_dir / ENVIRONMENT, json.loads)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSONL file ([] when it does not exist); lines that are not JSON objects (a line cut by
    a crash) are skipped."""
    rows = []
    for line in (_read_text(path) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """history.jsonl: the trainer's logged steps, in order ([] before the first one)."""
    return read_jsonl(run_dir / HISTORY)


def read_eval(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """eval_before, eval_after (graded completions) or eval_periodic (one row per evaluation)."""
    return read_jsonl(run_dir / f"{name}.jsonl")


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the last complete `trainer/checkpoint-N`; None when there is none."""
    trainer_dir = run_dir / TRAINER
    found = [
        (int(m.group(1)), p)
        for p in (trainer_dir.iterdir() if trainer_dir.is_dir() else [])
        if (m := _CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()  # written last: complete
    ]
    return max(found) if found else None


def wandb_run_id(run_dir: Path, metrics: dict[str, Any] | None = None) -> str | None:
    """The run's W&B id: from metrics.json (`metrics`, when read already), else the name of its W&B folder
    (`wandb/offline-run-<date>-<id>`, left even by a run killed before it wrote metrics.json)."""
    found = ((metrics if metrics is not None else read_metrics(run_dir)) or {}).get("wandb") or {}
    if found.get("run_id"):
        return found["run_id"]
    runs = sorted((run_dir / "wandb").glob("*run-*-*"))
    return runs[-1].name.rsplit("-", 1)[1] if runs else None


# ------------------------------------------------------------------------------------------- resume
@dataclass(frozen=True)
class Resume:
    """Where `resume=<run folder>` continues: the folder, its last complete checkpoint, the W&B run."""

    run_dir: Path
    checkpoint: Path
    step: int
    wandb_id: str | None
    previous: dict[str, Any]  # the folder's metrics.json, {} when the run left none (e.g. killed)


def find_resume(folder: str) -> Resume:
    """The last complete `trainer/checkpoint-N` of a run folder; a one-line ConfigError if there is none."""
    run_dir = Path(folder).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"resume={folder}: no such run folder.")
    found = last_checkpoint(run_dir)
    if found is None:
        raise ConfigError(
            f"no checkpoint in {run_dir / TRAINER}: run with trainer.save_strategy=steps trainer.save_steps=N"
        )
    step, checkpoint = found
    previous = read_metrics(run_dir) or {}
    return Resume(run_dir, checkpoint, step, wandb_run_id(run_dir, previous), previous)
