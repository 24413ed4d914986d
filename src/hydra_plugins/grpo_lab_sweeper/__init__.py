"""Hydra discovers this package (the `hydra_plugins` namespace) and registers `hydra/sweeper=grpo_optuna`.

The settings are declared once, in grpo_lab.config.sweep (their defaults, ranges, choices and meaning). Kept
import-light: Optuna is imported only when a sweep starts, so `--help` and `--cfg` stay fast.
"""

from hydra.core.config_store import ConfigStore

from grpo_lab.config.sweep import SweeperSettings

ConfigStore.instance().store(group="hydra/sweeper", name="grpo_optuna", node=SweeperSettings, provider="grpo_lab")
