"""Hydra discovers this package (the `hydra_plugins` namespace) and registers `hydra/sweeper=grpo_optuna`.

Kept import-light: Optuna is imported only when a sweep starts, so `--help` and `--cfg` stay fast.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ObjectiveConf:
    # A key of the run's metrics (eval_after/accuracy, eval_after/mean_length, train/kl, train/reward_end ...).
    metric: str = "eval_after/accuracy"
    direction: str = "maximize"


@dataclass
class ConfirmConf:
    # After the search: re-run the top_k configs with `seeds` more seeds each (seed + 1 .. seed + seeds),
    # then pick the winner by the mean over seeds and say which configs are statistically tied with it.
    # top_k 0: no confirmation runs (one objective only; the swept parameters must not include `seed`).
    top_k: int = 0
    seeds: int = 2


@dataclass
class GrpoOptunaSweeperConf:
    _target_: str = "hydra_plugins.grpo_lab_sweeper.sweeper.GrpoOptunaSweeper"
    # The sampler and pruner configs reach the sweeper as configs: it seeds each worker's sampler itself and
    # hands the pruner's config to every trial's job.
    _recursive_: bool = False
    # The sampler and the pruner are `_target_` configs, options of the groups hydra/sweeper/sampler and
    # hydra/sweeper/pruner (conf/hydra/sweeper/): `hydra/sweeper/pruner=hyperband`, or a file of one's own.
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": "median"}])
    study_name: str = "grpo_lab"
    # null: sqlite:///outputs/sweeps/optuna.db. Any Optuna RDB URL (postgresql+psycopg2://...), or
    # journal:<path> for a journal file shared by workers without a database.
    storage: Optional[str] = None
    # Trial folders go under <sweep_root>/<study_name>/trial_<n>/.
    sweep_root: str = "outputs/sweeps"
    # The number of finished (complete or pruned) trials the study should reach, over all workers and
    # restarts: re-running the command continues the study up to it.
    n_trials: int = 8
    # Trials launched at once (with hydra/launcher=joblib they run in parallel).
    n_jobs: int = 1
    objectives: Any = field(default_factory=lambda: [ObjectiveConf()])
    confirm: ConfirmConf = field(default_factory=ConfirmConf)
    sampler: Any = MISSING
    pruner: Any = MISSING
    # key: override-grammar sweep, e.g. `lr: tag(log, interval(1e-6, 1e-4))`.
    params: Any = field(default_factory=dict)
    # Parameter sets to try first (only when the study is new), e.g. a known-good config.
    enqueue: Any = field(default_factory=list)
    # Stop the sweep when more than this fraction of ended trials failed (after at least 3).
    max_failure_fraction: float = 0.5
    # Re-run a trial left RUNNING by a killed worker up to this many times (0: only mark it failed).
    retry_failed: int = 0
    # Seconds between heartbeats of running trials; a trial silent for grace_period is stale.
    heartbeat_interval: int = 10
    grace_period: int = 30
    # Trial models kept on disk: best (the best keep_top_k trials, or the Pareto front), all, or none
    # (trials save no model). A fp32 SmolLM2-135M is ~517 MB a trial.
    keep_models: str = "best"
    keep_top_k: int = 1


ConfigStore.instance().store(group="hydra/sweeper", name="grpo_optuna", node=GrpoOptunaSweeperConf, provider="grpo_lab")
