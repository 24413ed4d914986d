"""Which study a sweep folder holds, and which settings a study was started with: one study, one folder tree.

A sweep's trial folders are `<sweep_root>/<study_name>/trial_<n>`, named after the study, not after its storage;
so the folder records its study (`study.json`: a random id the study keeps in its user attributes) and a command
whose storage holds another study of the same name is refused before it writes there. A study records the
settings its trials share (everything but the searched parameters and the sweep's bookkeeping) and its objectives;
a command whose settings differ would mix trials of two experiments in one ranking, and is refused with the
difference. The same command again still joins (and resumes) its study.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, one_line
from grpo_lab.paths import STUDY_FILE
from grpo_lab.redact import redact

_UID = "grpo_lab_uid"
_FIXED = "grpo_lab_fixed"
_OBJECTIVES = "grpo_lab_objectives"
# Run settings that are the sweep's bookkeeping, set per trial or per machine, not the experiment: which trial and
# study (trial), W&B's names and mode (logger), a resume point, where a vLLM server listens, whether a trial's
# model is kept (output: the sweep's keep_models), the objective (the sweeper's objectives, compared on their own),
# how the processes start (launcher: a resume may change it too).
BOOKKEEPING = ("trial", "logger", "resume", "vllm_server", "output", "objective", "launcher")
# Per machine, not the experiment: how its processes start (launcher, above) and where its vLLM server listens.
_PER_MACHINE = ("trainer.vllm_server_",)


def fixed_settings(run_settings: dict[str, Any], searched: set[str]) -> dict[str, Any]:
    """The dotted settings every trial shares: `run_settings` (a RunConfig dump, with the sweep's fixed overrides)
    flattened, without the bookkeeping; a searched parameter is recorded as "(searched)"."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(run_settings, "")
    kept = {
        key: value
        for key, value in flat.items()
        if key.split(".")[0] not in BOOKKEEPING
        and not key.startswith(_PER_MACHINE)
        and not any(key == s or key.startswith(s + ".") for s in searched)
    }
    return kept | dict.fromkeys(searched, "(searched)")


def check_study(
    study: Any, fixed: dict[str, Any], objectives: list[dict[str, Any]], sweep_dir: Path, command: str
) -> None:
    """Refuse a command whose storage's study is not the one `sweep_dir` holds, or whose settings or objectives
    differ from those the study was started with; a new study (or one of an earlier release) records them, and the
    folder its study and the command that continues it (`command`, secrets masked)."""
    attrs = study.user_attrs
    uid = attrs.get(_UID)
    fixed = json.loads(json.dumps(redact(fixed), default=str))  # kept in the storage: no secret in it
    _check_folder(sweep_dir, study.study_name, uid, has_trials=bool(study.get_trials(deepcopy=False)))
    objectives = [{"metric": o["metric"], "direction": o["direction"]} for o in objectives]
    if _FIXED in attrs:
        _check_same(study.study_name, attrs[_FIXED], fixed, "settings")
        _check_same(study.study_name, {"objectives": attrs.get(_OBJECTIVES)}, {"objectives": objectives}, "objectives")
    if uid is None:
        study.set_user_attr(_UID, uid := uuid.uuid4().hex)
    if _FIXED not in attrs:
        study.set_user_attr(_FIXED, fixed)
        study.set_user_attr(_OBJECTIVES, objectives)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    marker = sweep_dir / STUDY_FILE
    if not marker.is_file():
        from grpo_lab import files

        files.write_json(marker, {"study": study.study_name, "uid": uid, "command": command})


def _check_folder(sweep_dir: Path, name: str, uid: str | None, *, has_trials: bool) -> None:
    marker = sweep_dir / STUDY_FILE
    fix = (
        f"give this sweep its own study name (hydra.sweeper.study_name={name}_2) or folder "
        "(hydra.sweeper.sweep_root=<folder>), or the storage that holds that study"
    )
    if marker.is_file():
        recorded = _recorded_uid(marker)
        if recorded != uid:
            raise ConfigError(
                f"{sweep_dir} holds the trials of another study named {name!r} (another storage, or a study made "
                f"again); this one's trials would overwrite them: {fix}."
            )
    elif not has_trials and any(sweep_dir.glob("trial_*")):
        raise ConfigError(f"{sweep_dir} holds trial folders of a study this storage does not have: {fix}.")


def _recorded_uid(marker: Path) -> str | None:
    """The study id a folder's study.json records; a damaged one is refused: the folder's owner is unknown."""
    try:
        record = json.loads(marker.read_text())
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, not an object")
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{marker} cannot be read ({type(e).__name__}: {one_line(e, 120)}), so whose trials "
            f"{marker.parent} holds is unknown: restore the file, or delete it if every trial folder there is this "
            "study's."
        ) from None
    return record.get("uid")


def _check_same(name: str, before: dict[str, Any], now: dict[str, Any], what: str) -> None:
    now = json.loads(json.dumps(now, default=str))
    differ = sorted(k for k in before.keys() | now.keys() if before.get(k, "(unset)") != now.get(k, "(unset)"))
    if not differ:
        return
    shown = "; ".join(
        f"{k}: {json.dumps(before.get(k, '(unset)'))} in the study, {json.dumps(now.get(k, '(unset)'))} now"
        for k in differ[:3]
    )
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    raise ConfigError(
        redact(
            f"study {name!r} was started with other {what} than this command's ({shown}{more}): its trials would mix "
            f"two experiments in one ranking. Give the study's own {what} to continue it, or start a new study with "
            f"hydra.sweeper.study_name=<new name>."
        )
    )
