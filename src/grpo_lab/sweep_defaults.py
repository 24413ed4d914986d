"""Where a sweep keeps its Optuna study unless `hydra.sweeper.storage` says otherwise: the sweeper and the
doctor (which checks that storage) read it here."""

DEFAULT_STORAGE = "sqlite:///outputs/sweeps/optuna.db"
