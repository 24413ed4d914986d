"""`python -m grpo_lab.compare SOURCE`: which run won, and why; `--export NAME` to run the winner again.

SOURCE is a run, multirun or sweep folder (outputs/...), an Optuna storage URL with --study, or a W&B
`entity/project` with --group. Writes leaderboard.csv, leaderboard.md and the plots into the source's
folder (for studies and W&B groups without one: outputs/compare/<name>/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_lab.compare import export, leaderboard, plots
from grpo_lab.compare.sources import Source, SourceError, from_folder, from_study, from_wandb
from grpo_lab.config.metrics import TEST_PREFIXES
from grpo_lab.redact import redact

_STORAGE_PREFIXES = ("sqlite:", "postgresql", "mysql", "journal:")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m grpo_lab.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("source", help="a folder under outputs/, an Optuna storage URL, or a W&B entity/project")
    p.add_argument("--study", help="the Optuna study name (with a storage URL)")
    p.add_argument("--group", help="the W&B group (with entity/project)")
    p.add_argument("--metric", default=None, help="objective for W&B groups (summary key; eval_after/accuracy)")
    p.add_argument("--direction", default=None, choices=("maximize", "minimize"), help="for W&B groups (maximize)")
    p.add_argument("--export", metavar="NAME", help="write experiment/NAME.yaml into $GRPO_LAB_CONFIG (else ./conf)")
    p.add_argument("--trial", type=int, help="with --export: this trial (needed for several objectives)")
    p.add_argument("--force", action="store_true", help="with --export: replace an existing preset")
    p.add_argument("--no-plots", action="store_true", help="only the leaderboard")
    return p


def load_source(args: argparse.Namespace) -> Source:
    if args.source.startswith(_STORAGE_PREFIXES):
        if not args.study:
            raise SourceError(f"{redact(args.source)} is an Optuna storage: name the study with --study NAME.")
        return from_study(args.source, args.study)
    path = Path(args.source)
    if args.group or (not path.exists() and args.source.count("/") == 1 and not args.source.startswith(".")):
        if not args.group:
            raise SourceError(f"{args.source} is not a folder; for a W&B project add --group NAME.")
        out = Path("outputs") / "compare" / args.group
        metric, direction = args.metric or "eval_after/accuracy", args.direction or "maximize"
        if metric.partition("/")[0] in TEST_PREFIXES:  # a ranking chooses: on validation, never on test items
            raise SourceError(
                f"--metric {metric}: a leaderboard ranks and chooses, and test items only report: rank by the "
                f"validation metric, --metric eval_{metric.partition('/')[0].removeprefix('test_')}/"
                f"{metric.partition('/')[2]}."
            )
        return from_wandb(args.source, args.group, metric, direction, out)
    _only_for_others(args)
    return from_folder(path)


def _only_for_others(args: argparse.Namespace) -> None:
    """A folder's (or a study's) runs rank by their own objective: a flag that would not change that is refused."""
    given = [f"--{name}" for name in ("study", "metric", "direction") if getattr(args, name)]
    if given:
        raise SourceError(
            f"{' '.join(given)}: for an Optuna storage (--study) or a W&B group (--metric, --direction); the runs of "
            f"{args.source} rank by the objective they ran with."
        )
    if args.trial is not None and not args.export:
        raise SourceError("--trial chooses the trial that --export NAME writes: give --export too.")


def _offline_sync(source: Source) -> list[str]:
    paths = [r.wandb for r in source.runs if r.wandb and not r.wandb.startswith("http")]
    return [p for p in paths if Path(p).exists()]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        source = load_source(args)
        board = leaderboard.build(source)
        print(leaderboard.heading(board))
        print(leaderboard.as_text(board))
        written = leaderboard.write_files(board, source.out_dir)
        if not args.no_plots:
            written += plots.forest(board, source.out_dir) + plots.training_curves(board, source.out_dir)
            if source.kind == "study":
                import optuna

                from grpo_lab.run.study import open_storage

                study = optuna.load_study(study_name=source.study_name, storage=open_storage(source.storage))
                written += plots.study_plots(study, source.out_dir)
        print(redact("\nWritten: " + ", ".join(str(p) for p in written)))
        flagged = [row for row in board.rows if row["health"]]
        for row in flagged:
            print(redact(f"Health: {row['run']}: {row['health']}"))
        if source.kind == "study":  # the password masked: the user knows it
            print(f"Dashboard: optuna-dashboard {redact(source.storage)}")
        offline = _offline_sync(source)
        if offline:
            print(redact(f"Upload the offline W&B runs: wandb sync {' '.join(offline)}"))
        if args.export:
            winner = export.pick(board, args.trial)
            preset = export.write_preset(board, winner, args.export, force=args.force)
            print(redact(f"\nExported {preset}: re-run the winner with  {export.preset_command(args.export)}"))
    except SourceError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
