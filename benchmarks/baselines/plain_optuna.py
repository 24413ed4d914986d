"""The `sweeper_scaling` benchmark's baseline: Optuna's own loop, `study.optimize`, with a no-op objective.

Same storage, same random sampler, same search space (lr, log scale) as the grpo_lab sweep it is compared
with; several copies of this script share the study as several sweep workers do, and stop together at the
study's total (MaxTrialsCallback).
"""

import argparse

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState


def storage(url: str):
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    if url.startswith("grpc://"):  # Optuna's gRPC storage proxy
        host, _, port = url.removeprefix("grpc://").rpartition(":")
        return optuna.storages.GrpcStorageProxy(host=host, port=int(port))
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--trials", type=int, required=True)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=args.study,
        storage=storage(args.storage),
        sampler=optuna.samplers.RandomSampler(),
        direction="maximize",
        load_if_exists=True,
    )
    study.optimize(
        lambda trial: trial.suggest_float("lr", 1e-6, 1e-4, log=True),
        callbacks=[MaxTrialsCallback(args.trials, states=(TrialState.COMPLETE,))],
        n_trials=args.trials,
    )


if __name__ == "__main__":
    main()
