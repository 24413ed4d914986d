"""The end of every multirun prints its answer: the leaderboard of its jobs, the winner and how to re-run it.

Hooked in as a Hydra callback (`hydra.callbacks.leaderboard` in conf/config.yaml), so it runs after a grid
on any launcher (basic, joblib, submitit). The table is `python -m grpo_lab.compare <multirun folder>`'s,
from the same code, and `leaderboard.md` / `.csv` are written into the multirun folder.

Hydra skips `on_multirun_end` when a job failed (its basic sweeper re-raises the job's error after the
batch), so the CLI calls :func:`finish_failed` on its way out: the failed job is listed with its reason and
hides none of the others' results.

After an Optuna sweep (`-m sweep=...`) the sweeper has already printed its trials table, the best trial and
its command; this only adds the leaderboard files and the compare and upload commands.
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("grpo_lab")

# The config of the multirun that started and has not printed its end yet (at most one per process), and when it
# started; its folder is read at the end, because a sweeper may move it in its setup (ours does:
# outputs/sweeps/<study>).
_pending: DictConfig | None = None
_started = 0.0


class Leaderboard(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _pending, _started
        _pending, _started = config, time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _pending
        _pending = None
        show(Path(str(config.hydra.sweep.dir)))


def finish_failed() -> None:
    """The end of a multirun that a failed job cut short (Hydra did not call `on_multirun_end`)."""
    global _pending
    config, _pending = _pending, None
    folder = None if config is None else Path(str(config.hydra.sweep.dir))
    # Only a multirun that ran a job: one that failed in its setup would show an earlier study's jobs there.
    if folder is not None and folder.is_dir() and _new_jobs(folder):
        show(folder)


def _new_jobs(folder: Path) -> bool:
    return any(p.is_dir() and p.stat().st_mtime >= _started for p in folder.iterdir())


def show(folder: Path) -> None:
    """Print the multirun's leaderboard, winner, re-run, compare and upload commands; write the leaderboards.
    Never raises: the jobs' results are already on disk, and a report is not worth losing the exit code."""
    from grpo_lab.compare import leaderboard
    from grpo_lab.compare.sources import SourceError, from_folder
    from grpo_lab.redact import redact

    try:
        source = from_folder(folder)
        board = leaderboard.build(source)
        written = leaderboard.write_files(board, source.out_dir)
    except (SourceError, OSError) as e:
        log.warning("No leaderboard for %s: %s", redact(str(folder)), redact(str(e)))
        return
    lines = [""]
    if source.kind != "study":  # a sweep's own table, best trial and command are printed by the sweeper
        failures = _failures(board)
        lines = [leaderboard.heading(board), leaderboard.as_text(board), *(["", *failures] if failures else [])]
        lines += ["", *_winner(board)]
        lines += _winners_test(board, folder)
    lines.append(f"Leaderboard: {', '.join(str(p) for p in written)}")
    lines.append(f"Plots and --export: python -m grpo_lab.compare {shlex.quote(str(folder))}")
    if any(folder.glob("*/wandb/offline-run-*")):
        lines.append(f"Upload its W&B runs: wandb sync {shlex.quote(str(folder))}/*/wandb/offline-run-*")
    print(redact("\n".join(lines)), flush=True)


def _winners_test(board: Any, folder: Path) -> list[str]:
    """The winner's test part, graded now that it is chosen (grpo_lab.run.test_report), and `test.json` in the
    multirun folder; nothing for a tie (nothing was chosen) or a run without a job spec or a kept model."""
    from grpo_lab.run.test_report import answer

    ranking, metric = board.ranking, board.source.metrics[0]
    best = ranking.leader
    if best is None or best.record.run_dir is None or not best.record.run_dir.is_dir():
        return []
    if ranking.one_seed:
        return ["", "Test part not graded: nothing was chosen (one seed per config)."]
    if ranking.tied:
        return ["", "Test part not graded: nothing was chosen (a tie); re-run the tied jobs with more seeds to choose."]
    if _failures(board):
        return ["", "Test part not graded: a job failed, so the winner may change once it is run again."]
    runs = [e.record.run_dir for e in ranking.seeds_of(best) if e.record.run_dir is not None]  # each seed's run
    return answer(runs, metric, folder)


def _less_seed(name: str) -> str:
    """A grid job's name (what its job varies, `lr=1e-05,seed=1`) without its seed: its config's."""
    return ",".join(part for part in name.split(",") if not part.startswith("seed=")) or name


def _with_seeds(board: Any) -> str:
    """The multirun's command again with `seed=1,2,3` (from its multirun.yaml; its overrides as the user typed
    them, a given seed replaced)."""
    from omegaconf import OmegaConf

    from grpo_lab.config.overrides import key, user_overrides

    try:
        task = OmegaConf.load(board.source.out_dir / "multirun.yaml").hydra.overrides.task
    except Exception:  # not a multirun folder of this version: the leader's own command
        task = list(board.ranking.leader.overrides)
    kept = [o for o in user_overrides([str(t) for t in task]) if key(o) != "seed"]
    return shlex.join(["python", "-m", "grpo_lab", "-m", *kept, "seed=1,2,3"])


def _failures(board: Any) -> list[str]:
    failed = [row["_run"] for row in board.rows if row["state"] not in ("finished", "pruned")]
    return [f"Job {run.name} {run.state}" + (f": {run.error}" if run.error else "") for run in failed]


def _winner(board: Any) -> list[str]:
    """The best config and its re-run command, or every config it cannot be told from. One seed per config
    cannot tell configs apart (a model's seed moves its score as much as a config does): the answer then names
    the best job on its seed and the grid again with seeds; with several seeds a config, Welch's test across
    them decides."""
    from grpo_lab.compare.leaderboard import vs_leader
    from grpo_lab.evaluation.stats import ALPHA

    metric, direction = board.source.metrics[0], board.source.directions[0]
    ranking = board.ranking
    if (best := ranking.leader) is None:
        return [f"No job finished with a value of {metric}: no winner."]
    value = f"{metric} = {best.objective:.4g}"
    if ranking.configs:
        c = ranking.configs[0]
        value = f"{metric} mean {c.mean.mean:.4g} [{c.mean.ci_low:.4g}, {c.mean.ci_high:.4g}] over {c.mean.n} seeds"
    if ranking.one_seed:
        return [
            f"No winner: one seed per config cannot tell configs apart (two seeds of one config differ as much as "
            f"two configs do). Best on its seed: {best.record.name} ({value}, {direction}). To choose, run each "
            "config with several seeds:",
            f"  {_with_seeds(board)}",
        ]
    if ranking.tied:
        tied = [best, *ranking.tied]
        lines = [
            f"Tie: {len(tied)} configs cannot be told apart on {metric} ({direction}; the best {value}): not "
            f"distinguishable over their seeds (Welch's t-test p >= {ALPHA}, or too few seeds). Re-run any of them "
            "with more seeds:"
        ]
        return lines + [f"  {entry.record.name}: {entry.command}" for entry in tied]
    runner_up = next((e for e in ranking.ranked if e.config != best.config), None)  # the next config
    label = vs_leader(runner_up, ranking) if runner_up is not None else None
    beaten = f"; vs the next config: {label}" if label else ""
    what = _less_seed(best.record.name) if ranking.configs else best.record.name
    return [f"Winner: {what} ({value}, {direction}{beaten}). Re-run it:", f"  {best.command}"]
