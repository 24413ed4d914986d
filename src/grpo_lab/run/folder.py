"""The run folder: every file a job leaves behind, as one object that owns their paths and their I/O.

config.yaml          the resolved config (as composed, interpolations resolved)
overrides.yaml       the command-line overrides of this job
job.json             the job spec (grpo_lab.config.job): the settings as checked, where and under which name it ran
environment.json     package versions, python, platform, git commit of the project (grpo_lab.run.provenance)
history.jsonl        one line per logged trainer step (written live, survives a crash)
eval_periodic.jsonl  one line per periodic evaluation (`eval.every_n_steps`, written live)
metrics.json         status, objective, before/after evaluation, final training metrics, periodic evals
summary.txt          the run's readable summary (printed at the end of a single run or grid job)
eval_*.jsonl         the held-out completions, graded (eval_before.jsonl, eval_after.jsonl)
trainer/checkpoint-N the trainer's checkpoints (`trainer.save_strategy=steps`), for `resume=<run folder>`
model/               the final model or LoRA adapter (unless output.save_model=false)

Every file goes through grpo_lab.files: written atomically with secrets masked; a missing file reads as
None or []; a damaged one raises :class:`grpo_lab.files.RunFolderError` naming it.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import files
from grpo_lab.files import RunFolderError
from grpo_lab.redact import redact
from grpo_lab.run import provenance
from grpo_lab.run.tracking import TrackerInfo

# A checkpoint folder of the trainer's; complete once trainer_state.json, written last, is there.
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class RunResult:
    """How a job ended; its run folder's metrics.json holds it (RunFolder.write_metrics, RunFolder.read_result)."""

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
    health: list[dict[str, Any]] = field(default_factory=list)  # grpo_lab.run.health events, in order


def number(value: Any) -> float | None:
    """A metric as stored in metrics.json (NaN/inf are the strings "nan"/"inf"); None for anything else."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _nan_if_none(value: Any) -> float:
    found = number(value)
    return found if found is not None else float("nan")


class _Entry:
    """A file or folder of a run folder, by name: `RunFolder(p).metrics_file` is `p / "metrics.json"`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, folder: RunFolder | None, owner: type | None = None) -> Any:
        return self if folder is None else folder.path / self.name


@dataclass(frozen=True)
class RunFolder:
    path: Path

    # -------------------------------------------------------------------------------------------- paths
    config_file = _Entry("config.yaml")
    job_file = _Entry("job.json")  # the job spec (grpo_lab.config.job): what the run ran, to read back
    overrides_file = _Entry("overrides.yaml")
    environment_file = _Entry("environment.json")
    history_file = _Entry("history.jsonl")
    metrics_file = _Entry("metrics.json")
    summary_file = _Entry("summary.txt")
    trainer_dir = _Entry("trainer")
    model_dir = _Entry("model")
    vllm_server_log = _Entry("vllm_server.log")

    def eval_file(self, name: str) -> Path:
        """eval_before, eval_after (graded completions) or eval_periodic (one row per evaluation)."""
        return self.path / f"{name}.jsonl"

    # The files that record the run (not its checkpoints, model or logs): what a resume attempt that ends before
    # training a step puts back as they were.
    RECORD = (
        "config.yaml",
        "job.json",
        "overrides.yaml",
        "environment.json",
        "history.jsonl",
        "metrics.json",
        "summary.txt",
        "eval_before.jsonl",
        "eval_after.jsonl",
        "eval_periodic.jsonl",
    )

    def snapshot(self) -> dict[str, bytes | None]:
        """The record files' contents (None: absent), for :meth:`restore`."""
        return {name: (self.path / name).read_bytes() if (self.path / name).is_file() else None for name in self.RECORD}

    def restore(self, snapshot: dict[str, bytes | None]) -> None:
        for name, data in snapshot.items():
            path = self.path / name
            if data is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != data:
                files.write_atomic_bytes(path, data)

    # ------------------------------------------------------------------------------------------ writing
    def write_start(self, resolved_config: dict[str, Any], overrides: list[str]) -> None:
        """config.yaml, overrides.yaml and environment.json: what a job writes as it starts."""
        self.path.mkdir(parents=True, exist_ok=True)
        files.write_yaml(self.config_file, {k: v for k, v in resolved_config.items() if k != "hydra"})
        files.write_yaml(self.overrides_file, list(overrides))
        files.write_json(self.environment_file, provenance.environment())

    def write_job(self, spec: Any) -> None:
        """job.json: the job spec as the run ran it (its settings typed and checked, where and under which name),
        secrets masked; grpo_lab.config.JobSpec.from_json reads it back."""
        self.path.mkdir(parents=True, exist_ok=True)
        files.write_json(self.job_file, spec.as_json())

    def recorded_since(self, before: bytes | None) -> bool:
        """Whether metrics.json was written after it read `before` (None: it did not exist)."""
        return self.metrics_file.exists() and self.metrics_file.read_bytes() != before

    def record_lost_run(self, spec: Any, *, status: str, signum: int | None = None, error: str | None = None) -> None:
        """metrics.json for a run whose main process left none (killed, out of memory, stopped before training):
        how it ended and the last step in history.jsonl. Written by the parent of a multi-process job; a job that
        ends by itself is closed by its Recorder (grpo_lab.run.train). Both write through :meth:`write_metrics`."""
        import logging

        from grpo_lab import interrupts
        from grpo_lab.run.tracking import choose_mode

        rows = self.read_history()
        step = rows[-1].get("step", 0) if rows else 0
        how = interrupts.signal_name(signum) if signum is not None else error
        logging.getLogger("grpo_lab").warning(
            "The main process left no record: %s says %s (%s) at step %d.", self.metrics_file, status, how, step
        )
        result = RunResult(
            status=status,
            objective=float("nan"),
            objective_metric=spec.run.objective.metric,
            metrics={},
            run_dir=spec.run_dir,
            run_name=spec.run_name,
            # The children's W&B run (their environment is the parent's), left unclosed by the kill.
            tracker=TrackerInfo(mode=choose_mode(spec.run.logger), run_id=self.wandb_run_id()),
            error=error,
        )
        if signum is not None:
            self.write_metrics(result, interrupted={"signal": how, "step": step})
        else:
            self.write_metrics(result, error=error, failed={"step": step})

    def remove_if_unstarted(self) -> None:
        """Remove a run folder that holds nothing but Hydra's copies of the config and the job's log (a refused
        command's), so that `compare` shows no run that never started."""
        import shutil

        entries = list(self.path.iterdir()) if self.path.is_dir() else []
        if entries and all(e.name == ".hydra" or (e.is_file() and e.suffix == ".log") for e in entries):
            shutil.rmtree(self.path / ".hydra", ignore_errors=True)
            for log_file in self.path.glob("*.log"):
                if log_file.stat().st_size < 64 * 1024:  # the refused job's few lines, not a user's own log
                    log_file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only if nothing else is left

    def record_refused(self, run_name: str, objective_metric: str, error: str) -> None:
        """metrics.json for a job of a grid or a sweep refused before it started (its settings broke a rule), so
        that its row says why; never over a record that is there."""
        if self.metrics_file.exists() or self.job_file.exists():
            return
        result = RunResult(
            status="failed",
            objective=float("nan"),
            objective_metric=objective_metric,
            metrics={},
            run_dir=self.path,
            run_name=run_name,
            tracker=TrackerInfo(mode="disabled"),
            error=error,
        )
        self.write_metrics(result, error=error, refused=True)

    def append_history(self, row: dict[str, Any]) -> None:
        files.append_jsonl(self.history_file, row)

    def append_eval_periodic(self, row: dict[str, Any]) -> None:
        files.append_jsonl(self.eval_file("eval_periodic"), row)

    def restart_logs(self, upto: int | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """history.jsonl and eval_periodic.jsonl start again: empty, or with only the rows up to step `upto` (a
        resumed run trains the later steps again). Returns the rows kept, (history, periodic evaluations)."""
        kept = []
        for path in (self.history_file, self.eval_file("eval_periodic")):
            rows = [r for r in files.read_jsonl(path) if r.get("step", 0) <= upto] if upto is not None else []
            files.rewrite_jsonl(path, rows)
            kept.append(rows)
        return kept[0], kept[1]

    def write_eval(self, name: str, samples: list[dict[str, Any]]) -> None:
        """`<name>.jsonl` (eval_before, eval_after): one graded completion a line, replacing an older file."""
        files.rewrite_jsonl(self.eval_file(name), samples)

    def write_metrics(self, result: RunResult, **extra: Any) -> None:
        """metrics.json for `result`; `extra` adds keys (error, interrupted, pruned, params, eval_periodic ...)."""
        record = {
            "status": result.status,
            "run_name": result.run_name,
            "objective": {"metric": result.objective_metric, "value": result.objective},
            "metrics": result.metrics,
            "durations_s": result.durations,
            "wandb": vars(result.tracker),
            "health": result.health,  # the health events (rule, step, action, message, values); [] = none fired
        }
        files.write_json(self.metrics_file, record | extra)

    def redact_hydra_copies(self, output_subdir: str | None, sweep_dir: Path | None = None) -> None:
        """Mask secrets in the copies of the config that Hydra writes before the job starts: `.hydra/config.yaml`,
        `hydra.yaml` (with the command line's `hydra.*` overrides, e.g. a sweep storage URL with its password)
        and `overrides.yaml` here, and `multirun.yaml` in the sweep folder."""
        names = ("config.yaml", "hydra.yaml", "overrides.yaml") if output_subdir is not None else ()
        paths = [self.path / str(output_subdir) / name for name in names]
        for path in [*paths, *([sweep_dir / "multirun.yaml"] if sweep_dir is not None else [])]:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError:
                continue
            masked = redact(text)
            if masked != text:
                files.write_atomic(path, masked)

    def write_summary(self, text: str) -> Path:
        files.write_atomic(self.summary_file, redact(text))
        return self.summary_file

    # ------------------------------------------------------------------------------------------ reading
    def read_metrics(self) -> dict[str, Any] | None:
        """metrics.json as written (NaN/inf as strings); None when the run left none (still running, killed)."""
        data = files.read_parsed(self.metrics_file, json.loads)
        if data is not None and not isinstance(data, dict):
            raise RunFolderError(f"{self.metrics_file} is not a JSON object.")
        return data

    def read_result(self) -> RunResult | None:
        """The RunResult that metrics.json records (how a multi-process job's parent learns it); None without one."""
        data = self.read_metrics()
        if data is None:
            return None
        if "status" not in data:
            raise RunFolderError(f"{self.metrics_file} has no `status`.")
        objective = data.get("objective") or {}
        return RunResult(
            status=data["status"],
            objective=_nan_if_none(objective.get("value")),
            objective_metric=objective.get("metric", ""),
            metrics={k: _nan_if_none(v) for k, v in (data.get("metrics") or {}).items()},
            run_dir=self.path,
            run_name=data.get("run_name", ""),
            tracker=TrackerInfo(**(data.get("wandb") or {"mode": "disabled"})),
            durations=data.get("durations_s") or {},
            error=data.get("error") or data.get("pruned"),
            health=data.get("health") or [],
        )

    def read_config(self) -> dict[str, Any] | None:
        """config.yaml (secrets masked); None when the job never started."""
        data = files.read_parsed(self.config_file, files.yaml_load)
        if data is not None and not isinstance(data, dict):
            raise RunFolderError(f"{self.config_file} is not a mapping.")
        return data

    def read_overrides(self) -> list[str]:
        """The job's command-line overrides (overrides.yaml, else Hydra's `.hydra/overrides.yaml`); [] if neither."""
        for path in (self.overrides_file, self.path / ".hydra" / "overrides.yaml"):
            data = files.read_parsed(path, files.yaml_load)
            if data is not None:
                if not isinstance(data, list):
                    raise RunFolderError(f"{path} is not a list of overrides.")
                return [str(o) for o in data]
        return []

    def read_environment(self) -> dict[str, Any] | None:
        """environment.json (versions, platform, git commit); None when the job never started."""
        return files.read_parsed(self.environment_file, json.loads)

    def read_history(self) -> list[dict[str, Any]]:
        """history.jsonl: the trainer's logged steps, in order ([] before the first one)."""
        return files.read_jsonl(self.history_file)

    def read_eval(self, name: str) -> list[dict[str, Any]]:
        return files.read_jsonl(self.eval_file(name))

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, folder) of every `trainer/checkpoint-N` folder, complete or not, by step."""
        found = [
            (int(m.group(1)), p)
            for p in (self.trainer_dir.iterdir() if self.trainer_dir.is_dir() else [])
            if (m := _CHECKPOINT.match(p.name)) and p.is_dir()
        ]
        return sorted(found)

    def last_checkpoint(self) -> tuple[int, Path] | None:
        """(step, folder) of the last complete `trainer/checkpoint-N`; None when there is none. Not transformers'
        get_last_checkpoint: importing it loads torch (~4 s), and `resume=` with no checkpoint must fail in a
        second, before any library loads."""
        found = [(step, p) for step, p in self.checkpoints() if (p / "trainer_state.json").is_file()]
        return max(found) if found else None

    def wandb_run_id(self, metrics: dict[str, Any] | None = None) -> str | None:
        """The run's W&B id: from metrics.json (`metrics`, when read already), else the name of its W&B folder
        (`wandb/offline-run-<date>-<id>`, left even by a run killed before it wrote metrics.json)."""
        found = ((metrics if metrics is not None else self.read_metrics()) or {}).get("wandb") or {}
        if found.get("run_id"):
            return found["run_id"]
        runs = sorted((self.path / "wandb").glob("*run-*-*"))
        return runs[-1].name.rsplit("-", 1)[1] if runs else None
