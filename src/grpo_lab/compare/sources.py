"""Where compared runs come from: run folders on disk, an Optuna study, or a W&B project and group.

Everything becomes a list of `RunRecord`s; run folders are read from their own files (metrics.json,
history.jsonl, overrides.yaml), so comparing needs no network even for offline W&B runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.config.overrides import render, user_overrides
from grpo_lab.errors import GrpoLabError
from grpo_lab.evaluation.ranking import CONFIRM_OF
from grpo_lab.files import RunFolderError
from grpo_lab.paths import BEST_FILE, trial_name
from grpo_lab.redact import MASK, redact, reveal, without_password
from grpo_lab.run.folder import RunFolder
from grpo_lab.run.folder import number as _number
from grpo_lab.run.summary import HEADLINES


class SourceError(GrpoLabError):
    """The thing to compare does not exist, is empty, or cannot be read."""


@dataclass
class RunRecord:
    name: str
    state: str  # finished | failed | pruned | running | incomplete
    objective: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None
    wandb: str | None = None
    duration_s: float | None = None
    trial: int | None = None
    values: list[float] | None = None  # one per objective (Optuna studies)
    error: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # filled by `vary`
    health: list[dict[str, Any]] | None = None  # the recorded health events; None: recorded before they were
    confirms: int | None = None  # a sweep's confirmation run: the trial whose config it repeats with a new seed


@dataclass
class Source:
    kind: str  # folder | study | wandb
    label: str  # what to call it in titles and comments
    runs: list[RunRecord]
    out_dir: Path  # where the leaderboard and plots go
    metrics: list[str]  # objective metric(s)
    directions: list[str]
    storage: str | None = None
    study_name: str | None = None


def _overrides(run_dir: Path) -> list[str]:
    try:
        return RunFolder(run_dir).read_overrides()
    except RunFolderError:
        return []


def read_run_dir(run_dir: Path) -> RunRecord:
    """One run folder (a single run, a multirun job or a sweep trial), whatever state it ended in; a damaged
    metrics.json shows as `incomplete`, with the reason as its error."""
    try:
        data, damage = RunFolder(run_dir).read_metrics() or {}, None
    except RunFolderError as e:
        data, damage = {}, str(e)
    metrics = {k: v for k, v in ((k, _number(v)) for k, v in data.get("metrics", {}).items()) if v is not None}
    objective = _number((data.get("objective") or {}).get("value"))
    wandb = data.get("wandb") or {}
    return RunRecord(
        name=data.get("run_name") or run_dir.name,
        state=data.get("status", "incomplete"),
        objective=objective if objective is not None and math.isfinite(objective) else None,
        metrics=metrics,
        overrides=user_overrides(_overrides(run_dir)),
        history=RunFolder(run_dir).read_history(),
        run_dir=run_dir,
        wandb=wandb.get("url") or wandb.get("run_path"),
        duration_s=_number((data.get("durations_s") or {}).get("total")),
        error=data.get("error") or damage,
        health=data.get("health"),
    )


def _run_dirs(root: Path) -> list[Path]:
    """Run folders below `root`: each has Hydra's `.hydra/` (written when the job starts)."""
    found = {p.parent for p in root.rglob(".hydra") if p.is_dir()}
    return sorted(found, key=lambda p: (len(p.parts), _natural(p.name), str(p)))


def _natural(name: str) -> tuple[int, str]:
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else -1, name)


def _objective_of(run_dir: Path) -> tuple[str, str]:
    try:
        config = RunFolder(run_dir).read_config() or {}
        return config["objective"]["metric"], config["objective"]["direction"]
    except (RunFolderError, KeyError, TypeError):
        return "eval_after/accuracy", "maximize"


def from_folder(path: Path) -> Source:
    if not path.exists():
        raise SourceError(f"{path} does not exist: give a run, multirun or sweep folder under outputs/.")
    dirs = _run_dirs(path)
    if not dirs:
        raise SourceError(f"{path} holds no runs (no folder with Hydra's .hydra/ below it): is the sweep empty?")
    best = path / BEST_FILE
    if best.exists():  # a sweep folder: its study has the real objective(s) and trial states
        import yaml

        info = yaml.safe_load(best.read_text()) or {}
        if info.get("storage") and info.get("study"):
            return from_study(info["storage"], info["study"], out_dir=path)
    runs = [read_run_dir(d) for d in dirs]
    metric, direction = _objective_of(dirs[0])
    return Source(kind="folder", label=str(path), runs=runs, out_dir=path, metrics=[metric], directions=[direction])


def _real_url(storage: str) -> str:
    """A storage URL whose password was masked in a file (best.yaml): the real one when this process knows
    it, else the URL without a password (PostgreSQL then reads PGPASSWORD or ~/.pgpass)."""
    url = reveal(storage)
    return without_password(url) if MASK in url else url


def _trial_record(t: Any) -> RunRecord:
    """A trial's run folder, with what the study knows better: its state, values, parameters and overrides."""
    run_dir = Path(t.user_attrs["run_dir"]) if t.user_attrs.get("run_dir") else None
    record = (
        read_run_dir(run_dir) if run_dir is not None and run_dir.exists() else RunRecord(trial_name(t.number), "", None)
    )
    record.trial = t.number
    record.state = {"COMPLETE": "finished", "FAIL": "failed"}.get(t.state.name, t.state.name.lower())
    record.values = list(t.values) if t.values is not None else None
    record.objective = record.values[0] if record.values else None
    record.overrides = user_overrides(t.user_attrs.get("overrides", []))
    record.params = dict(t.params)
    record.error = t.user_attrs.get("error") or record.error
    record.confirms = t.user_attrs.get(CONFIRM_OF)
    if t.datetime_start and t.datetime_complete:
        record.duration_s = (t.datetime_complete - t.datetime_start).total_seconds()
    return record


def from_study(storage: str, study_name: str, out_dir: Path | None = None) -> Source:
    import optuna

    from grpo_lab.errors import one_line
    from grpo_lab.run.study import open_storage
    from grpo_lab.sweep.storage import study_sizes

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    masked = MASK in reveal(storage)  # a password that only the user knows now
    shown, storage = redact(storage), _real_url(storage)
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    except KeyError as e:
        names = list(study_sizes(storage))
        raise SourceError(f"No study {study_name!r} in {shown}; studies there: {', '.join(names) or 'none'}.") from e
    except Exception as e:
        hint = (
            " The password is not kept in the sweep's files: pass the storage URL with it "
            f"(python -m grpo_lab.compare 'URL' --study {study_name}) or set PGPASSWORD."
            if masked
            else ""
        )
        raise SourceError(f"Cannot open the Optuna storage {shown!r}: {one_line(e)}.{hint}") from e
    if not study.trials:
        raise SourceError(f"Study {study_name!r} in {shown} has no trials yet.")
    metrics = list(study.metric_names or [])
    runs = [_trial_record(t) for t in study.trials]
    if not metrics:
        metrics = [f"value{i}" if len(study.directions) > 1 else "objective" for i in range(len(study.directions))]
    dirs = [r.run_dir for r in runs if r.run_dir is not None]
    if out_dir is None:
        out_dir = dirs[0].parent if dirs else Path("outputs") / "compare" / study_name
    return Source(
        kind="study",
        label=f"study {study_name} ({shown})",
        runs=runs,
        out_dir=out_dir,
        metrics=metrics,
        directions=[d.name.lower() for d in study.directions],
        storage=storage,
        study_name=study_name,
    )


def from_wandb(project_path: str, group: str, metric: str, direction: str, out_dir: Path) -> Source:
    """Runs of a W&B group through W&B's public API (needs a login; offline runs: pass their folder)."""
    from grpo_lab.run.tracking import wandb_logged_in

    if not wandb_logged_in():
        raise SourceError(
            "Reading a W&B project needs a W&B login (WANDB_API_KEY or `wandb login`). Offline runs are read "
            "from their folders: `python -m grpo_lab.compare outputs/multirun/<date>/<time>`."
        )
    import wandb

    try:
        api_runs = list(wandb.Api(timeout=20).runs(project_path, filters={"group": group}))
    except Exception as e:
        raise SourceError(f"W&B could not list the runs of {project_path} group {group!r}: {e}") from e
    if not api_runs:
        raise SourceError(f"W&B has no runs in {project_path} with group {group!r}.")
    runs = []
    for r in api_runs:
        summary = dict(r.summary)
        history = [
            {k.removeprefix("train/"): v for k, v in row.items()} | {"step": row.get("train/global_step")}
            for row in r.scan_history(keys=["train/global_step", *(h.metric for h in HEADLINES), "train/loss"])
        ]
        objective = _number(summary.get("objective"))
        knobs = [
            render(k, r.config[k]) for k in ("lr", "beta", "num_generations", "seed", "max_steps") if k in r.config
        ]
        runs.append(
            RunRecord(
                name=r.name,
                state={"crashed": "failed"}.get(r.state, r.state),
                objective=objective,
                metrics={k: v for k, v in summary.items() if _number(v) is not None},
                overrides=knobs,
                history=history,
                wandb=r.url,
                duration_s=_number(summary.get("_runtime")),
            )
        )
    return Source(
        kind="wandb",
        label=f"W&B {project_path} group {group}",
        runs=runs,
        out_dir=out_dir,
        metrics=[metric],
        directions=[direction],
    )
