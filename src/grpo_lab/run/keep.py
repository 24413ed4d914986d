"""`output.keep`: which model a run ends with: the last step's, or the best step's by the validation objective.

With `best` or `top_k` every evaluation during training (`eval.every_n_steps`, and one at the last step) is a
candidate: the Trainer saves a checkpoint there (`trainer/checkpoint-N`, its own format, optimizer state
included), and after each save only the kept candidates and the latest checkpoint (what `resume=` continues from)
stay. When training ends the best checkpoint's weights are loaded back into the trainer, so that `model/` and the
final evaluations (validation and test) are the kept model's, and only the kept checkpoints stay on disk.

The validation number at the kept step is chosen as the maximum of several and is biased upward; the test part,
graded after the choice, is not (the run summary says so).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_lab.config import RunConfig
from grpo_lab.run.folder import RunFolder

log = logging.getLogger("grpo_lab")


class Keeper:
    """The candidates' validation scores, and which checkpoints stay."""

    def __init__(self, cfg: RunConfig, folder: RunFolder, evals: list[dict[str, Any]]) -> None:
        self.keep, self.top_k = cfg.output.keep, cfg.output.top_k
        self.name = cfg.objective.metric.partition("/")[2]  # the grader the evaluations during training report
        self.sign = -1.0 if cfg.objective.direction == "maximize" else 1.0
        self.folder = folder
        # A resumed run's evaluations before its checkpoint are candidates too (eval_periodic.jsonl).
        self.scores: dict[int, float] = {int(row["step"]): float(row[self.name]) for row in evals if self.name in row}

    def observe(self, step: int, scores: dict[str, float]) -> None:
        if self.name in scores:
            self.scores[step] = float(scores[self.name])

    @property
    def kept_steps(self) -> list[int]:
        """Best first; between equal scores the earlier step (fewer updates away from the reference model)."""
        ranked = sorted(self.scores, key=lambda step: (self.sign * self.scores[step], step))
        return ranked[: 1 if self.keep == "best" else self.top_k]

    @property
    def best_step(self) -> int | None:
        return next(iter(self.kept_steps), None)

    def checkpoint(self, step: int) -> Path:
        return self.folder.trainer_dir / f"checkpoint-{step}"

    def prune(self, latest: int | None) -> None:
        """Delete the candidates' checkpoints that are neither kept nor the latest (`latest=None`: the run is over).
        A checkpoint at a step no evaluation scored (`trainer.save_strategy=steps`) is the user's: left alone."""
        keep = set(self.kept_steps) | ({latest} if latest is not None else set())
        for step, path in self.folder.checkpoints():
            if step in self.scores and step not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def summary(self) -> dict[str, Any]:
        """metrics.json's `keep`: the policy, the kept steps (best first) and every candidate's score."""
        return {"policy": self.keep, "metric": self.name, "steps": self.kept_steps, "scores": self.scores}


class KeepCheckpoints(TrainerCallback):
    """Save a checkpoint at every evaluation during training (after PeriodicEval has scored it), then prune."""

    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper

    def on_step_end(self, args, state, control, **kwargs):
        # Scored: PeriodicEval evaluated this step just now (a resumed run's earlier scores are all before it).
        if state.global_step in self.keeper.scores:
            control.should_save = True
            # The Trainer's own rotation (trainer.save_total_limit) spares its best checkpoint: name ours.
            if (best := self.keeper.best_step) is not None:
                state.best_model_checkpoint = str(self.keeper.checkpoint(best))

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.keeper.prune(latest=state.global_step)


def load_kept(trainer: Any, keeper: Keeper) -> int | None:
    """Load the best checkpoint's weights into `trainer`'s model (unless it is the last step's); its step."""
    best = keeper.best_step
    if best is None:
        return None
    if best != trainer.state.global_step:
        trainer._load_from_checkpoint(str(keeper.checkpoint(best)))  # model weights (or adapter) only
        log.info(
            "output.keep=%s: the model is step %d's (%s = %.4g)", keeper.keep, best, keeper.name, keeper.scores[best]
        )
    return best


__all__ = ["KeepCheckpoints", "Keeper", "load_kept"]
