"""The `sweeper_scaling` benchmark's app: grpo_lab's sweeper and conf/, a task that trains nothing.

Every trial goes through all the sweeper does around a job (claim under the study lock, ask, the trial's
overrides, heartbeats, Hydra's job set-up and log file, tell, retention, best.yaml) while the job itself
returns at once, so what is measured is the sweeper's own cost per trial.
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def app(cfg: DictConfig) -> float:
    return float(cfg.lr)


if __name__ == "__main__":
    app()
