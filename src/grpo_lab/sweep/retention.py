"""Which trial models a sweep keeps on disk (`hydra.sweeper.keep_models`, `hydra.sweeper.keep_top_k`).

A saved fp32 SmolLM2-135M is ~517 MB, so a 20-trial sweep that keeps every model costs ~10 GB. By default
only the best trial's model stays: after every finished trial, each worker deletes the `model/` folder
of every trial that is not (or no longer) among the best `k` (or, with several objectives, not on the
Pareto front). Pruned and failed trials never keep theirs.

- `all`:  every trial keeps its model (what a single run does).
- `best`: the best `keep_top_k` trials keep theirs (default 1), and, after confirmation runs, every seed's run of
  the best config (its test part is graded over those seeds: grpo_lab.run.test_report).
- `none`: trials do not save a model at all (`output.save_model=false` is passed to each job).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from grpo_lab.evaluation.ranking import Ranking, from_trials
from grpo_lab.run.folder import RunFolder
from grpo_lab.sweep.confirm import CONFIRM_OF

log = logging.getLogger("grpo_lab")


def kept_trials(ranking: Ranking, policy: str, top_k: int, candidates: int = 0) -> list[Any]:
    """The trials whose models stay, best first (with several objectives and `best`: the Pareto front).
    `candidates`: while the sweep may still confirm its best `candidates` configs, their search trials and every
    confirmation run stay too, whichever config the seeds' mean ends up choosing."""
    if policy == "none":
        return []
    if policy == "best" and len(ranking.directions) > 1:
        return [e.record for e in ranking.best]
    ranked = [e.record for e in ranking.ranked]
    if policy == "all":
        return ranked
    kept = ranked[:top_k]
    if candidates:
        search = [e.trial for e in ranking.ranked if e.confirms is None][:candidates]
        protected = set(search) | {e.trial for e in ranking.ranked if e.confirms is not None}
        kept += [t for t in ranked if t not in kept and t.number in protected]
    elif ranking.configs:  # every seed's run of the best confirmed config: its test part is graded over the seeds
        best = ranking.configs[0].trial
        kept += [t for t in ranked if t not in kept and best in (t.number, t.user_attrs.get(CONFIRM_OF))]
    return kept


def model_path(trial: Any) -> Path | None:
    run_dir = trial.user_attrs.get("run_dir")
    return RunFolder(Path(run_dir)).model_dir if run_dir else None


def apply(study: Any, policy: str, top_k: int, ranking: Ranking | None = None, candidates: int = 0) -> list[Path]:
    """Delete the models (and the trainer's checkpoints) of trials that are not kept; returns the kept models that
    exist, best first."""
    kept = kept_trials(ranking or from_trials(study), policy, top_k, candidates)
    if policy != "all":
        keep = {t.number for t in kept}
        for trial in study.get_trials(deepcopy=False):
            path = model_path(trial)
            if trial.number in keep or path is None or trial.state.name not in ("COMPLETE", "PRUNED"):
                continue
            checkpoints = [p for _, p in RunFolder(path.parent).checkpoints()]
            for found in [path, *checkpoints] if path.is_dir() else checkpoints:
                shutil.rmtree(found, ignore_errors=True)
                log.info("Trial %d: deleted (keep_models=%s, keep_top_k=%d): %s", trial.number, policy, top_k, found)
    return [p for t in kept if (p := model_path(t)) is not None and p.is_dir()]
