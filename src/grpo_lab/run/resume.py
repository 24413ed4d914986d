"""`resume=<run folder>`: where an interrupted run continues (its last complete checkpoint, its W&B run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.run.folder import RunFolder


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
    run = RunFolder(Path(folder).expanduser().resolve())
    if not run.path.is_dir():
        raise ConfigError(f"resume={folder}: no such run folder.")
    found = run.last_checkpoint()
    if found is None:
        raise ConfigError(
            f"no checkpoint in {run.trainer_dir}: run with trainer.save_strategy=steps trainer.save_steps=N"
        )
    step, checkpoint = found
    previous = run.read_metrics() or {}
    return Resume(run.path, checkpoint, step, run.wandb_run_id(previous), previous)
