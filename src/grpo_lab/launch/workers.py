"""Ctrl-C and SIGTERM while a launcher runs a multirun's jobs in worker processes (joblib, submitit_local).

Such a launcher, interrupted in the parent, unwinds and ends its workers at once (joblib terminates its pool), so
a job still training never records its run. With such a launcher on this machine, the parent sends the signal on to
its child processes instead (grpo_lab.interrupts.forward_to_children): each job stops, records itself (metrics.json,
its W&B run closed) and returns; then the parent ends as interrupted (the sweeper records the trials, the CLI exits
130 / 143). A sweep sizes joblib's pool to its batch (an idle worker that gets the signal exits and breaks the
pool). With the basic launcher (jobs in the parent process) or a cluster's (Slurm signals its jobs itself) a signal
stops the command at once.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from grpo_lab import interrupts

# Launchers whose jobs run in worker processes on this machine, which a signal can reach. (A Slurm job runs
# elsewhere: Slurm signals it itself.)
LOCAL_WORKERS = (
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
)


class ForwardSignals(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        interrupts.forward_to_children(str(config.hydra.launcher.get("_target_")) in LOCAL_WORKERS)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        interrupts.forward_to_children(False)
