"""What a sweep shows and leaves behind: the trials table, and `best.yaml` with the command to re-run it."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

from grpo_lab.config.overrides import Machinery, without
from grpo_lab.evaluation.ranking import Entry, Ranking, from_trials
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


def trials_table(study: Any, metrics: list[str], ranking: Ranking | None = None) -> str:
    """One line per trial: number, state, value(s), parameters, duration; the best marked with *."""
    ranking = ranking or from_trials(study)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    best = {e.trial for e in ranking.best}
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


def chosen_runs(study: Any, ranking: Ranking) -> list[Path]:
    """The run folders of what the sweep chose, for its test part (grpo_lab.run.test_report): every seed's run of
    the best confirmed config, else the best trial's; none with several objectives (a front, not a choice)."""
    if len(ranking.directions) != 1:
        return []
    if ranking.configs:
        best = ranking.configs[0].trial
        trials = [
            t for t in study.get_trials(deepcopy=False) if best in (t.number, t.user_attrs.get(confirm.CONFIRM_OF))
        ]
    else:
        trials = [ranking.leader.record] if ranking.leader is not None else []
    found = [t.user_attrs.get("run_dir") for t in sorted(trials, key=lambda t: t.number) if t.state.name == "COMPLETE"]
    return [Path(run_dir) for run_dir in found if run_dir]


def _entry(entry: Entry, metrics: list[str]) -> dict[str, Any]:
    t = entry.record
    return {
        "trial": entry.trial,
        "values": dict(zip(metrics, entry.values, strict=True)),
        "params": dict(t.params),
        "run_dir": t.user_attrs.get("run_dir"),
        # Where its model is, if this trial kept one (hydra.sweeper.keep_models).
        "model": str(model) if (model := model_path(t)) is not None and model.is_dir() else None,
        # As its job got them, less Hydra's settings and the sweeper's `trial=` (study, storage, id).
        "overrides": without(list(entry.overrides), Machinery.HYDRA, Machinery.TRIAL),
        "command": entry.command,
    }


def _confirmed(ranking: Ranking) -> list[dict[str, Any]]:
    """Each confirmed config's seeds: what the leader was chosen by."""
    return [
        {
            "trial": c.trial,
            "values": list(c.values),
            "mean": c.mean.mean,
            "ci95": [c.mean.ci_low, c.mean.ci_high],
            "p_vs_best": c.p_vs_best,
            "tied": c.tied,
        }
        for c in ranking.configs
    ]


def write_best(
    study: Any, path: Path, *, metrics: list[str], storage: str, ranking: Ranking | None = None
) -> Path | None:
    """`best.yaml`: the best trial (or the Pareto front) as parameters plus the exact command to re-run it."""
    from omegaconf import OmegaConf

    from grpo_lab.files import write_atomic
    from grpo_lab.redact import redact

    ranking = ranking or from_trials(study)
    if not ranking.best:
        return None
    data: dict[str, Any] = {
        "study": study.study_name,
        "storage": storage,
        "directions": list(ranking.directions),
        "updated": dt.datetime.now().isoformat(timespec="seconds"),
    }
    if ranking.leader is not None:
        data |= _entry(ranking.leader, metrics)
        data["tied_with"] = [e.trial for e in ranking.tied]  # trials not shown to differ from this one
        if ranking.configs:
            data["confirm"] = _confirmed(ranking)
    else:
        data["pareto_front"] = [_entry(e, metrics) for e in ranking.best]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Every worker of a shared study rewrites best.yaml: each through its own temporary file, so that no
    # worker's rename takes the file from under another's.
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(redact(data))))
    return path
