"""What every batch of one sweep works with, fixed once the sweeper has opened its study.

(A dataclass here rather than in the sweeper's module: Hydra imports plugin modules without registering them
in `sys.modules`, where `dataclasses` looks up string annotations.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_lab.sweep.space import SearchSpace
from grpo_lab.sweep.storage import SweepStorage


@dataclass(frozen=True)
class Plan:
    study: Any  # optuna.Study
    storage: SweepStorage
    space: SearchSpace
    metrics: list[str]
    worker: int  # this worker's number in the study (its sampler's seed offset)
    distributions: dict[str, Any]
    pruner: dict[str, Any] | None  # what a trial's job builds its pruner from; None: trials are not pruned

    @property
    def url(self) -> str:
        return self.storage.url
