"""The `compose` benchmark's baseline: a plain @hydra.main app on grpo_lab's own conf/, as a Hydra user writes it.

`--cfg job` and `--help` are Hydra's own; a negative `lr` is refused with one line and exit 1, as grpo_lab
refuses it (the bad-input case).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def app(cfg: DictConfig) -> None:
    if cfg.lr <= 0:
        sys.stderr.write(f"Error: lr must be > 0, got {cfg.lr}\n")
        sys.exit(1)


if __name__ == "__main__":
    app()
