"""Turn the winner into `<your config folder>/experiment/<NAME>.yaml`, a normal preset: `grpo-lab experiment=NAME`.

The folder is `$GRPO_LAB_CONFIG`, else `./conf` (see :func:`grpo_lab.paths.export_dir`), never the installed package.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from grpo_lab.compare.leaderboard import Board
from grpo_lab.compare.sources import RunRecord, SourceError
from grpo_lab.paths import config_groups, export_dir, on_search_path
from grpo_lab.redact import MASK, redact


def pick(board: Board, trial: int | None) -> RunRecord:
    """The ranking's leader (after confirmation runs: the best mean over seeds, not the luckiest seed), or
    trial `trial` (required for several objectives: one of the Pareto front)."""
    runs = [row["_run"] for row in board.rows]
    if trial is not None:
        for run in runs:
            if run.trial == trial:
                if run.state != "finished":
                    raise SourceError(f"Trial {trial} is {run.state}, not finished: pick a finished trial.")
                return run
        raise SourceError(f"No trial {trial} in {board.source.label}.")
    if len(board.source.metrics) > 1:
        front = sorted(e.trial for e in board.ranking.best if e.trial is not None)
        raise SourceError(
            "Several objectives: pick one of the Pareto-optimal trials with --trial N "
            f"({', '.join(str(n) for n in front) or 'none finished'})."
        )
    if (leader := board.ranking.leader) is not None:
        return leader.record
    raise SourceError(f"No finished run with an objective value in {board.source.label}: nothing to export.")


def _split(overrides: list[str]) -> tuple[str, list[tuple[str, str]], list[tuple[str, Any]]]:
    """(base experiment, group choices, key values) from a run's overrides."""
    from grpo_lab.config import overrides as ov

    groups = config_groups()
    base = "quickstart"
    choices: list[tuple[str, str]] = []
    values: list[tuple[str, Any]] = []
    for override in ov.parse_all(ov.without(overrides, ov.Machinery.HYDRA)):
        key = override.key_or_group
        if key == "experiment":
            base = str(override.value())
        elif ov.is_group(override, groups):
            choices.append((key, str(override.value())))
        else:
            values.append((key, override.value()))
    return base, choices, values


def write_preset(board: Board, run: RunRecord, name: str, *, force: bool = False) -> Path:
    from omegaconf import OmegaConf

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise SourceError(f"--export {name!r}: use letters, digits and _ (it becomes experiment/{name}.yaml).")
    path = export_dir() / "experiment" / f"{name}.yaml"
    if path.exists() and not force:
        raise SourceError(f"{path} exists already: choose another name or pass --force to replace it.")
    base, choices, values = _split(run.overrides)
    if base == name:
        raise SourceError(f"--export {name!r} would include itself (the runs used experiment={base}).")
    body = OmegaConf.create({"name": name})
    for key, value in values:
        OmegaConf.update(body, key, value, force_add=True)
    # A preset is shared and committed: secrets stay out of it (set them again, e.g. `${oc.env:MY_KEY}`).
    text = redact(OmegaConf.to_yaml(body))
    metric, direction = board.source.metrics[0], board.source.directions[0]
    what = f"trial {run.trial}" if run.trial is not None else f"run `{run.name}`"
    objective = ", ".join(
        f"{m} = {v:.4g}"
        for m, v in zip(board.source.metrics, run.values or [run.objective], strict=False)
        if v is not None
    )
    config = next((e.config for e in board.ranking.entries if e.record is run), None)
    if (c := next((c for c in board.ranking.configs if c.key == config), None)) is not None:  # picked by seed mean
        tied = [f"#{o.trial}" if o.trial is not None else o.name for o in board.ranking.configs if o.tied]
        objective = f"{metric} = {c.mean.mean:.4g} [{c.mean.ci_low:.4g}, {c.mean.ci_high:.4g}] over {c.mean.n} seeds"
        objective += f", tied with {', '.join(tied)}" if tied else ""
    header = [
        "# @package _global_",
        f"# Exported by `python -m grpo_lab.compare --export {name}` on {dt.date.today().isoformat()}:",
        f"# the best {what} of {board.source.label},",
        f"# {objective} ({direction} {metric}). Re-run it: {preset_command(name)}",
        *([f"# Secrets are masked ({MASK}): set them again, e.g. `key: ${{oc.env:MY_KEY}}`."] if MASK in text else []),
        "defaults:",
        f"  - {base}",
        *(f"  - override /{group}: {choice}" for group, choice in choices),
        "  - _self_",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(redact("\n".join(header)) + text, encoding="utf-8")
    return path


def preset_command(name: str) -> str:
    """The command that runs preset `name` once exported: `--config-dir` only if its folder is not searched anyway."""
    folder = export_dir()
    flag = "" if on_search_path(folder) else f"--config-dir {_shown(folder)} "
    return f"python -m grpo_lab {flag}experiment={name}"


def _shown(folder: Path) -> str:
    try:
        return str(folder.relative_to(Path.cwd()))
    except ValueError:
        return str(folder)
