"""What a sweep shows and leaves behind: the trials table, and `best.yaml` with the command to re-run it."""

from __future__ import annotations

import datetime as dt
import math
import shlex
from pathlib import Path
from typing import Any

from grpo_lab.overrides import Machinery, user_overrides, without
from grpo_lab.sweep import confirm
from grpo_lab.sweep.retention import model_path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _duration(trial: Any) -> str:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return "-"
    return f"{(trial.datetime_complete - trial.datetime_start).total_seconds():.0f}s"


def best_trials(study: Any) -> list[Any]:
    """The best trial (single objective: the best seed mean once there are confirmation runs) or the
    Pareto-optimal trials (several)."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return []
    if len(study.directions) > 1:
        return list(study.best_trials)
    if ranked := confirm.rank(study):
        return [study.get_trials(deepcopy=False)[ranked[0].trial]]
    return [study.best_trial]


def tied_with_best(study: Any) -> list[int]:
    """The trials that cannot be told from the best one: statistically tied seed means after confirmation
    runs, else search trials with exactly the best value (a smoke sweep where every trial scored 0)."""
    if len(study.directions) > 1 or not (best := best_trials(study)):
        return []
    best = best[0]
    if ranked := confirm.rank(study):
        return [r.trial for r in ranked[1:] if r.tied]
    return [
        t.number
        for t in study.get_trials(deepcopy=False)
        if t.state.name == "COMPLETE"
        and t.number != best.number
        and not confirm.is_confirmation(t)
        and t.value == best.value
    ]


def trials_table(study: Any, metrics: list[str]) -> str:
    """One line per trial: number, state, value(s), parameters, duration; the best marked with *."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    best = {t.number for t in best_trials(study)}
    names = sorted({name for t in trials for name in t.params})
    header = ["#", "state", *metrics, *names, "time", "note"]
    rows = []
    for t in trials:
        values = t.values if t.values is not None else [None] * len(metrics)
        note = t.user_attrs.get("error", "")
        if confirm.is_confirmation(t):
            note = f"confirms #{t.user_attrs[confirm.CONFIRM_OF]} (seed {t.user_attrs[confirm.SEED]}) {note}".rstrip()
        if t.state.name == "PRUNED":
            note = t.user_attrs.get("pruned", "pruned")
        rows.append(
            [
                f"{t.number}{'*' if t.number in best else ''}",
                t.state.name.lower(),
                *[_fmt(v) if v is not None else "-" for v in values],
                *[_fmt(t.params[n]) if n in t.params else "-" for n in names],
                _duration(t),
                (note[:60] + "...") if len(note) > 63 else note,
            ]
        )
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip() for line in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def rerun_command(overrides: list[str]) -> str:
    """`python -m grpo_lab ...` for a trial, to paste into a shell: its overrides as a user types them
    (the CLI adds the `++` again), minus the sweep machinery."""
    return shlex.join(["python", "-m", "grpo_lab", *user_overrides(overrides)])


def write_best(study: Any, path: Path, *, metrics: list[str], storage: str) -> Path | None:
    """`best.yaml`: the best trial (or the Pareto front) as parameters plus the exact command to re-run it."""
    from omegaconf import OmegaConf

    best = best_trials(study)
    if not best:
        return None
    entries = []
    for t in best:
        overrides = list(t.user_attrs.get("overrides", []))
        entries.append(
            {
                "trial": t.number,
                "values": dict(zip(metrics, t.values, strict=True)),
                "params": dict(t.params),
                "run_dir": t.user_attrs.get("run_dir"),
                # Where its model is, if this trial kept one (hydra.sweeper.keep_models).
                "model": str(model) if (model := model_path(t)) is not None and model.is_dir() else None,
                # As its job got them, less Hydra's settings and the sweeper's `trial=` (study, storage, id).
                "overrides": without(overrides, Machinery.HYDRA, Machinery.TRIAL),
                "command": rerun_command(overrides),
            }
        )
    data: dict[str, Any] = {
        "study": study.study_name,
        "storage": storage,
        "directions": [d.name.lower() for d in study.directions],
        "updated": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if len(entries) == 1:
        data |= entries[0]
        data["tied_with"] = tied_with_best(study)  # trials not shown to differ from this one
        if ranked := confirm.rank(study):  # chosen by the seed mean: each confirmed config's seeds
            data["confirm"] = [
                {
                    "trial": r.trial,
                    "values": r.values,
                    "mean": r.mean.mean,
                    "ci95": [r.mean.ci_low, r.mean.ci_high],
                    "p_vs_best": r.p_vs_best,
                    "tied": r.tied,
                }
                for r in ranked
            ]
    else:
        data["pareto_front"] = entries
    path.parent.mkdir(parents=True, exist_ok=True)
    from grpo_lab.records import write_atomic
    from grpo_lab.redact import redact

    # Every worker of a shared study rewrites best.yaml: each through its own temporary file (one shared
    # `best.tmp` let one worker's rename take the file from under another's: FileNotFoundError, the sweep died).
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))
    return path


__all__ = ["best_trials", "rerun_command", "tied_with_best", "trials_table", "write_best"]
