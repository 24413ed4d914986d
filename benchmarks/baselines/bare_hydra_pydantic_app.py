"""The `compose` benchmark's reference for the bad-input case: the bare Hydra app, validating its one key with
pydantic as grpo_lab validates all of them (grpo_lab.config), to show what importing pydantic and building a
model costs before a single rule of grpo_lab's own runs.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def app(cfg: DictConfig) -> None:
    from pydantic import BaseModel, Field, ValidationError

    class Run(BaseModel):
        lr: float = Field(gt=0)

    try:
        Run(lr=cfg.lr)
    except ValidationError as e:
        sys.stderr.write(f"Error: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    app()
