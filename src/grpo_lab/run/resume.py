"""`resume=<run folder>`: the same run, continued from its last complete checkpoint with its own settings.

A run folder keeps the job spec it ran (job.json; config.yaml in folders of earlier releases). Resuming reads it
back, so the run's overrides need not be typed again and cannot be mistyped: the command line may change only what
continuing the same run can change (:data:`MAY_CHANGE`: `max_steps`, the launcher, W&B's mode). Everything
here is decided before Hydra composes or writes anything, so a refused command leaves the folder as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.config import JobSpec, RunConfig, job
from grpo_lab.config import overrides as ov
from grpo_lab.errors import ConfigError
from grpo_lab.paths import STUDY_FILE
from grpo_lab.redact import MASK
from grpo_lab.run.folder import RunFolder

# What a resume command may change (docs/reliability.md): how far the run trains (max_steps, beyond its last
# checkpoint; a finished run's only upward), how it is launched, and whether W&B is reached online. Anything else
# would make it another run.
MAY_CHANGE = ("max_steps", "launcher.*", "logger.mode")
_SHOWN = "max_steps (beyond the last checkpoint), launcher.* and logger.mode"


@dataclass(frozen=True)
class Resume:
    """Where `resume=<run folder>` continues: the folder, its last complete checkpoint, the W&B run."""

    run_dir: Path
    checkpoint: Path
    step: int
    wandb_id: str | None
    previous: dict[str, Any]  # the folder's metrics.json, {} when the run left none (e.g. killed)


def find_resume(folder: str | Path) -> Resume:
    """The last complete `trainer/checkpoint-N` of a run folder; a one-line ConfigError if there is none."""
    run = RunFolder(Path(folder).expanduser().resolve())
    if not run.path.is_dir():
        raise ConfigError(f"resume={folder}: no such run folder.")
    found = run.last_checkpoint()
    if found is None:
        raise ConfigError(
            f"resume={folder}: no checkpoint in {run.trainer_dir} (a run keeps them with trainer.save_strategy=steps "
            "trainer.save_steps=N): it can only be run again, not continued."
        )
    step, checkpoint = found
    previous = run.read_metrics() or {}
    return Resume(run.path, checkpoint, step, run.wandb_run_id(previous), previous)


def may_change(key: str) -> bool:
    return key in ("max_steps", "logger.mode") or key.startswith("launcher.")


# ------------------------------------------------------------------------------------------- the spec
def saved_spec(folder: RunFolder) -> JobSpec:
    """The job spec a run folder ran: its job.json, or, for a folder of an earlier release, one rebuilt from its
    config.yaml, overrides.yaml and metrics.json."""
    if folder.job_file.is_file():
        return JobSpec.from_json(json.loads(folder.job_file.read_text()))
    config = folder.read_config()
    if config is None:
        raise ConfigError(f"resume={folder.path}: not a run folder (it has neither job.json nor config.yaml).")
    previous = folder.read_metrics() or {}
    return JobSpec(
        run=job.parse(config),
        run_dir=folder.path,
        output_dir=folder.trainer_dir,
        run_name=previous.get("run_name") or folder.path.name,
        group=(previous.get("tracker") or {}).get("group"),
        overrides=tuple(folder.read_overrides()),
        resolved_config=config,
        cache_dir=Path(),
    )


def resumed_spec(folder: str | Path, given: list[str], cache_dir: Path) -> tuple[JobSpec, Resume]:
    """The spec that continues the run in `folder` with the overrides `given` on the command line (as typed or as
    grpo_lab normalised them), and where it continues; every refusal is one ConfigError line."""
    run_folder = RunFolder(Path(folder).expanduser().resolve())
    _check_one_run(run_folder, folder)
    spec = saved_spec(run_folder)
    if (trial := spec.run.trial) is not None:
        raise ConfigError(
            f"resume={folder}: this is trial {trial.number} of the sweep study {trial.study!r}, and a trial resumes "
            f"only through its sweep (its study records its value): run the sweep's command again, "
            f"{_sweep_command(run_folder)}."
        )
    point = find_resume(folder)
    changes = _changes(spec, given, str(folder))
    run = _updated(spec.run, changes)
    if masked := [k.replace(".kwargs.", ".") for k in _masked(run.model_dump(mode="json"), "")]:
        raise ConfigError(
            f"resume={folder}: the run's record masks its secret {', '.join(f'`{k}`' for k in masked[:3])}: give it "
            f"again, from the environment (`{masked[0]}='${{oc.env:NAME}}'`) or as a value."
        )
    _check_length(point, spec.run.max_steps, run.max_steps, str(folder))
    _check_kept(point, spec.run.output.keep, spec.run.max_steps, str(folder))
    config = job.set_keys(spec.resolved_config, changes | {"resume": str(point.run_dir)})
    kept = [o for o in spec.overrides if ov.key(o) not in ("max_steps", "resume")]
    rerun = [*kept, f"max_steps={run.max_steps}"] if run.max_steps != spec.run.max_steps else list(spec.overrides)
    resumed = JobSpec(
        run=run.model_copy(update={"resume": str(point.run_dir)}),
        run_dir=point.run_dir,
        output_dir=run_folder.trainer_dir,
        run_name=spec.run_name,
        group=spec.group,
        overrides=tuple(rerun),
        resolved_config=config,
        cache_dir=cache_dir,
        extra_tags=spec.extra_tags,
        in_multirun=spec.in_multirun,
    )
    return resumed, point


def _check_one_run(folder: RunFolder, given: str) -> None:
    if not folder.path.is_dir():
        raise ConfigError(f"resume={given}: no such run folder.")
    if (folder.path / "multirun.yaml").is_file() or any(folder.path.glob("*/metrics.json")):
        raise ConfigError(
            f"resume={given} is the folder of a grid or a sweep, not of one run: resume one of its runs "
            f"(resume={given}/<job>), or run a sweep's command again to continue the sweep."
        )


def _sweep_command(trial_folder: RunFolder) -> str:
    """The command that continues the trial's sweep, as its study folder recorded it (grpo_lab.sweep.identity)."""
    try:
        found = json.loads((trial_folder.path.parent / STUDY_FILE).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        found = None
    return f"`{found}`" if found else "`python -m grpo_lab -m <the sweep's overrides>`"


def _changes(spec: JobSpec, given: list[str], folder: str) -> dict[str, Any]:
    """{key: value} of the command line's overrides that change the run; an override repeating one the run was
    started with is no change. Anything else is refused, naming what the run has."""
    own = {ov.as_typed(o) for o in spec.overrides}
    changes: dict[str, Any] = {}
    for text in given:
        override = ov.parse(text)
        key = override.key_or_group
        if key == "resume" or ov.as_typed(text) in own:
            continue
        if key == "hydra.run.dir":
            raise ConfigError(f"`{ov.as_typed(text)}`: a resumed run stays in its own folder ({folder}).")
        if override.is_hydra_override() or key.startswith("hydra/"):
            continue  # Hydra's own settings (verbosity, logging) do not change the run
        secret = _holds_mask(_lookup(spec.resolved_config, key))  # masked in the record: the user gives it again
        if secret and override.value_type is not None and not override.is_sweep_override():
            changes[_settings_key(key)] = _resolved(override.value())
            continue
        if not may_change(key) or override.value_type is None or override.is_sweep_override():
            was = _lookup(spec.resolved_config, key)
            raise ConfigError(
                f"`{ov.as_typed(text)}`: resume={folder} continues the run with its own settings "
                f"({key} {'was ' + json.dumps(was) if was is not _MISSING else 'was not set'}); a resume may change "
                f"only {_SHOWN}. To train other settings, start a new run."
            )
        changes[key] = override.value()
    return changes


_MISSING = object()


def _holds_mask(value: Any) -> bool:
    return isinstance(value, str) and MASK in value


def _masked(node: Any, prefix: str) -> list[str]:
    """The dotted keys whose value the record masked (a secret: `***`, or a URL's password)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _masked(value, f"{prefix}{key}.")]
    return [prefix[:-1]] if _holds_mask(node) else []


def _settings_key(key: str) -> str:
    """A config key as the typed settings hold it: a reward's or a grader's own argument sits in its `kwargs`."""
    parts = key.split(".")
    if len(parts) == 4 and parts[:2] in (["reward", "functions"], ["eval", "graders"]) and parts[3] != "_target_":
        return ".".join([*parts[:3], "kwargs", parts[3]])
    return key


def _resolved(value: Any) -> Any:
    """A value typed for a masked secret, its `${oc.env:NAME}` resolved as the composed config would have."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create({"value": value}), resolve=True)["value"]


def _lookup(config: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return _MISSING
        config = config[part]
    return config


def _updated(run: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """The run's settings with the allowed changes, checked by their declarations."""
    return job.with_values(run, changes) if changes else run


def _check_kept(point: Resume, keep: str, ended: int, folder: str) -> None:
    """A finished run with output.keep=best|top_k kept only its chosen checkpoints (grpo_lab.run.keep): continuing
    from one of those would train from an earlier step than the run ended at (its max_steps)."""
    if keep != "last" and point.previous.get("status") == "finished" and point.step < ended:
        raise ConfigError(
            f"resume={folder}: the run finished at step {int(ended)} and kept only its chosen checkpoints "
            f"(output.keep={keep}; the latest is step {point.step}), so it cannot be continued from where it ended. "
            f"Run it again with a larger max_steps instead."
        )


def _check_length(point: Resume, before: int, after: int, folder: str) -> None:
    """A resume trains on from its checkpoint to max_steps (an interrupted run may stop earlier than it was to: the
    learning-rate schedule follows the new length); a finished run only to a larger max_steps."""
    if point.previous.get("status") == "finished" and after <= before:
        raise ConfigError(
            f"resume={folder}: the run finished its max_steps={before} steps; to train on, resume with a larger "
            f"max_steps (e.g. max_steps={2 * before})."
        )
    if point.step >= after:
        raise ConfigError(
            f"resume={folder}: its last checkpoint is at step {point.step}, so max_steps={after} leaves nothing to "
            f"train; give max_steps above {point.step}."
        )
