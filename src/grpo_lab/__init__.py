"""grpo_lab: run, sweep, track and compare GRPO fine-tuning experiments (Hydra + TRL + Optuna + W&B).

Importing this package is cheap (no torch): heavy modules (`run.train`, `models`, `evaluation`) import
torch, transformers and trl when they are used.
"""

__version__ = "0.1.0"
