"""Ctrl-C and SIGTERM while a launcher runs a multirun's jobs in worker processes (joblib, submitit_local).

Such a launcher, interrupted in the parent, unwinds and ends its workers at once (joblib terminates its pool), so
a job still training never records its run. While the jobs run elsewhere, the parent sends the signal on to its
child processes instead (grpo_lab.interrupts.forward_to_children): each job stops, records itself (metrics.json,
its W&B run closed) and returns; then the parent ends as interrupted (the sweeper records the trials, the CLI
exits 130 / 143). Jobs that run in the parent process (Hydra's basic launcher) are interrupted there, as always.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from grpo_lab import interrupts

_IN_PROCESS = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


class ForwardSignals(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        interrupts.forward_to_children(str(config.hydra.launcher.get("_target_", _IN_PROCESS)) != _IN_PROCESS)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        interrupts.forward_to_children(False)
