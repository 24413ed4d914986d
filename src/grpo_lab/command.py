"""What a `python -m grpo_lab` command line asks for, checked before Hydra composes or writes anything.

Hydra writes into a job's folder (`.hydra/`, the job's log) before the job starts, so a command that would write
into a folder the user already has is refused here, in one line, with nothing written: a new run into an existing
run's folder (`hydra.run.dir`), a grid into an existing multirun folder (`hydra.sweep.dir`), and a resume that
would not continue the same run (grpo_lab.run.resume). A sweep definition without `-m` is refused too: it would
train one default run instead.
"""

from __future__ import annotations

from pathlib import Path

from grpo_lab.config import overrides as ov
from grpo_lab.errors import ConfigError
from grpo_lab.paths import cache_dir, sweep_files


def checked(args: list[str], positions: list[int]) -> list[str]:
    """The command line to hand Hydra (`args`: grpo_lab's prepared overrides and Hydra's flags; `positions`: where
    the overrides are), or a ConfigError saying what was wrong and how to ask for it."""
    multirun = "-m" in args or "--multirun" in args
    if shown := set(args) & _SHOW_ONLY:  # prints the config or Hydra's information: runs nothing, writes nothing
        if multirun and shown & {"--cfg", "-c", "--info", "-i"}:  # Hydra: a ValueError with its traceback
            flag = sorted(shown)[0]
            raise ConfigError(
                f"{flag} shows one job's config and takes no -m: drop -m and give one value per swept key (e.g. "
                f"lr=1e-5, not lr=1e-5,2e-5) to see that job's."
            )
        return args
    overrides = [args[i] for i in positions]
    keys = {ov.key(o): o for o in overrides}
    sweep = ov.as_dict([keys["sweep"]]).get("sweep") if "sweep" in keys else None
    if not multirun and sweep in {path.stem for path in sweep_files()}:  # an unknown name: Hydra names the options
        raise ConfigError(
            f"`{ov.as_typed(keys['sweep'])}` is an Optuna sweep, which runs with -m: "
            f"`python -m grpo_lab -m {' '.join(ov.as_typed(o) for o in overrides)}`."
        )
    resume = ov.as_dict(overrides).get("resume") if "resume" in keys else None
    if resume not in (None, "", "None", "null"):
        if multirun:
            raise ConfigError(
                f"resume={resume} continues one run and takes no -m; a grid or a sweep continues by running its own "
                "command again."
            )
        from grpo_lab.run.resume import resumed_spec

        spec, _ = resumed_spec(str(resume), overrides, cache_dir())
        # Hydra composes in the run's own folder and keeps no copy of the composed config there: the run's own
        # config.yaml, overrides.yaml and job.json are the record.
        return [*args, ov.render("hydra.run.dir", str(spec.run_dir)), "hydra.output_subdir=null"]
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    # The machines of one job may share a folder (Slurm, submitit): machine 0's job checks it when it starts.
    machines = any(k.startswith(("launcher.num_machines", "launcher.machine_rank")) for k in keys) or _slurm_nodes()
    if key in keys and not (multirun and _optuna_sweep(keys)) and not machines:
        _check_fresh(key, ov.as_dict([keys[key]]).get(key))
    return args


_SHOW_ONLY = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc"}


def _slurm_nodes() -> bool:
    import os

    return int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")) or 1) > 1


def _optuna_sweep(keys: dict[str, str]) -> bool:
    """The Optuna sweeper chooses its own folder (outputs/sweeps/<study>) and guards it (grpo_lab.sweep.identity)."""
    return "sweep" in keys or "hydra/sweeper" in keys


def _check_fresh(key: str, value: object) -> None:
    """A folder the user named for a new run or grid must not hold one already (an interpolated one, such as
    Hydra's `${now:...}` default, is fresh each time)."""
    if not isinstance(value, str) or "${" in value:
        return
    folder = Path(value).expanduser()
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    grid = key == "hydra.sweep.dir"
    marks = ("multirun.yaml", "*/metrics.json", "*/.hydra") if grid else ("job.json", "metrics.json", ".hydra")
    held = "is not empty"
    if any(any(folder.glob(mark)) for mark in marks):
        held = "holds a multirun already" if grid else "holds a run already"
    fix = "choose a new folder" + ("" if grid else ", or resume=<folder> to continue a run there")
    raise ConfigError(f"`{key}={value}` {held}: a new {'grid' if grid else 'run'} would write over it; {fix}.")
