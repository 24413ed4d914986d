"""`python -m grpo_lab`: the Hydra entry point, which turns a command line into a checked job and runs it.

The job parses the composed config and builds its spec (grpo_lab.config.build_job: every rule, TRL's own included,
before W&B or a model loads), trains it in this process (grpo_lab.run.train.run) or in `accelerate launch` children
(grpo_lab.launch), prints the run's summary and returns the objective, so any Hydra sweeper can optimise it. The
side commands (``check_rewards``, ``doctor``, ``vllm_server``) compose and report errors through the same public
helpers: :func:`parse_flags`, :func:`hydra_app`, :func:`side_command` and :func:`report`.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from grpo_lab import interrupts, startup
from grpo_lab.config import overrides as ov
from grpo_lab.errors import ConfigError
from grpo_lab.paths import CONF_DIR, CONFIG_ENV, SWEEPS_DIR, cache_dir, config_groups, sweep_files
from grpo_lab.redact import redact

log = logging.getLogger("grpo_lab")

# Every grpo_lab command composes the same config: `@hydra_app` is `@hydra.main` on conf/config.yaml.
hydra_app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")

# Hydra flags that take a value: the token after them is not an override.
_FLAGS_WITH_VALUE = {
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--info",
    "-i",
    "--experimental-rerun",
}


def register_sweeps() -> list[str]:
    """Offer every `sweeps/<name>.yaml` as the config group option `sweep=<name>`.

    Sweep definitions live in the top-level `sweeps/` folder, outside `conf/`; Hydra's search path can
    only add roots, not rename a folder into a group, so they are stored in Hydra's ConfigStore. The user's
    `$GRPO_LAB_CONFIG/sweeps/*.yaml` are stored after ours and replace same-named ones; a user's
    `sweep/<name>.yaml` (under `--config-dir` or `$GRPO_LAB_CONFIG`) is found by Hydra itself.
    """
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    names = []
    for path in sweep_files():
        provider = "grpo_lab sweeps/" if path.parent == SWEEPS_DIR else f"{CONFIG_ENV} sweeps/"
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_", provider=provider)
        names.append(path.stem)
    return list(dict.fromkeys(names))


register_sweeps()


# ------------------------------------------------------------------------------------------------- argv
def parse_flags(argv: list[str], parser: argparse.ArgumentParser | None = None) -> tuple[argparse.Namespace, list[str]]:
    """grpo_lab's own options (`--verbose`, plus `parser`'s) and the rest of argv, in order, for Hydra.

    `verbose`: print the full traceback of any error (`--verbose`, or HYDRA_FULL_ERROR=1 as the user started
    the command); otherwise user and environment errors are one line.
    """
    parser = parser or argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # --help is Hydra's
    parser.add_argument("--verbose", action="store_true")
    options, rest = parser.parse_known_args(argv)
    options.verbose = options.verbose or os.environ.get("HYDRA_FULL_ERROR") == "1"
    return options, rest


def prepare_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Rewrite `key=value` overrides into `++key=value`, and list the swept keys.

    Hydra refuses a key that is not already in the composed config with "Could not override"; we want
    our own validation to see it instead, so that it can name the nearest valid key, and so that any
    TRL GRPOConfig field can be set as `trainer.<field>=...` without listing all ~200 in YAML.
    Group selections (`model=tiny`), `hydra.*` keys and explicit `+`/`~` overrides are left alone
    (the rule is :func:`grpo_lab.config.overrides.normalise`).
    """
    groups = config_groups(_config_dirs(args))  # a group only a `--config-dir` has is a group too
    out, swept = list(args), []
    for i in _override_positions(args):
        override = ov.parse(args[i])
        if (key := override.key_or_group) in ("hydra.sweeper.sampler.name", "hydra.sweeper.pruner.name"):
            from grpo_lab.config.samplers import renamed

            raise renamed(key.split(".")[2], override.value())
        out[i] = ov.normalise(override, groups)
        if key := ov.swept_key(override):
            swept.append(key)
    return out, swept


def _config_dirs(args: list[str]) -> list[Path]:
    """The `--config-dir DIR` / `-cd DIR` / `--config-dir=DIR` folders of argv."""
    found = [Path(value) for flag, value in itertools.pairwise(args) if flag in ("--config-dir", "-cd")]
    return found + [Path(a.split("=", 1)[1]) for a in args if a.startswith("--config-dir=")]


def _override_positions(args: list[str]) -> list[int]:
    """Where the overrides are in argv: not the flags, nor the values of flags such as `--config-name NAME`."""
    positions = []
    for i, token in enumerate(args):
        if "=" in token and not token.startswith("-") and (i == 0 or args[i - 1] not in _FLAGS_WITH_VALUE):
            positions.append(i)
    return positions


def checked_command(args: list[str]) -> list[str]:
    """The prepared command line as Hydra gets it, after grpo_lab.command's checks (nothing written before them):
    with `resume=<run folder>`, composed in that folder without a copy of the config there."""
    from grpo_lab import command

    return command.checked(args, _override_positions(args))


def run_hydra(app: Callable[[], Any], args: list[str]) -> None:
    """Run the `@hydra_app` function `app` on `args`.

    Hydra's main reads its arguments from sys.argv only, and prints an error escaping a run (a storage that
    cannot be opened, an output folder that cannot be created) with its own traceback unless
    HYDRA_FULL_ERROR=1, which makes it raise the error to our one-line :func:`report` instead.
    """
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = [sys.argv[0], *args]
    try:
        app()
    finally:  # the user's own setting again, for a later command in the same process
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def _redact_argv() -> None:
    """Once Hydra has read its arguments, keep only their redacted form in sys.argv: W&B records sys.argv in
    each run's metadata and has no setting to be given other arguments (wandb's `Settings._args` is computed
    from sys.argv), and an override may carry a secret (a storage URL's password, an API key)."""
    sys.argv = redact(sys.argv)


# -------------------------------------------------------------------------------------------------- job
def training_app(*, verbose: bool, swept: tuple[str, ...]) -> Callable[[], Any]:
    """The training command's Hydra app; `swept`: the keys a multirun varies, which name each job's run.

    The options travel inside the task function, so that jobs in other processes (the joblib or submitit
    launchers pickle it) get them too."""

    command = os.getpid()

    @hydra_app
    def task(cfg: DictConfig) -> Any:
        try:
            return run_job(cfg, verbose=verbose, swept=swept)
        except KeyboardInterrupt as e:
            if os.getpid() == command:  # the job ran in this command's process: the command stops
                raise
            raise interrupts.JobInterrupted(interrupts.signal_of(e) or 2) from None  # a worker's job: its result

    return task


def run_job(cfg: DictConfig, *, verbose: bool, swept: tuple[str, ...]) -> Any:
    """One Hydra job: validate, train, summarise; returns the objective. A user error of a single run ends
    the process with one line; in a multirun it is raised, for the sweeper to record the job as failed."""
    startup.pause()  # until the job's model is loaded (grpo_lab.startup); in a launcher's worker process too
    _redact_argv()
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        spec, result = _job(cfg, multirun=multirun, swept=swept)
    except Exception as e:
        from grpo_lab.config.problems import describe

        line = describe(e)
        if multirun:
            if line is not None:
                log.error("%s", line)
            if isinstance(e, ConfigError):  # refused by a check before it started (not a machine's own failure)
                _record_refusal(cfg, swept, line or str(e))
            raise
        if line is None or verbose:  # a bug (or asked for): the traceback, secrets masked by the log filter
            log.error("%s: %s", type(e).__name__, line or e, exc_info=e)
        else:
            log.error("%s", line)
        if isinstance(e, ConfigError) and cfg.get("resume") is None:  # refused: no folder of a run never started
            from hydra.core.hydra_config import HydraConfig

            from grpo_lab.run.folder import RunFolder

            RunFolder(Path(HydraConfig.get().runtime.output_dir)).remove_if_unstarted()
        sys.exit(1)
    finally:
        if multirun:  # the next job runs in this process: a job that failed before its model loaded resumes here
            startup.resume()
    from grpo_lab.run import summary
    from grpo_lab.run.folder import RunFolder
    from grpo_lab.run.train import ObjectiveValue

    if result is None:  # a machine other than 0 of a multi-machine job: machine 0 records and reports the run
        print("This machine's processes finished; machine 0 records the run (metrics.json, W&B).", flush=True)
        return ObjectiveValue(float("nan"), {})
    text = summary.format_run(result)
    summary_file = RunFolder(result.run_dir).write_summary(text)
    trial = spec.run.trial
    print(text if trial is None else summary.format_trial(result, trial.number, summary_file), flush=True)
    return ObjectiveValue(result.objective, result.metrics)


def _record_refusal(cfg: DictConfig, swept: tuple[str, ...], line: str) -> None:
    """A grid's or a sweep's job refused before it started: its folder says why (the leaderboard shows it)."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab.run.folder import RunFolder

    folder = RunFolder(Path(HydraConfig.get().runtime.output_dir))
    try:
        name = _job_identity(cfg, swept)[0]
        metric = str(cfg.objective.metric)
    except Exception:  # the config that was refused may not even say these
        name, metric = folder.path.name, ""
    folder.record_refused(name, metric, line)


def _job(cfg: DictConfig, *, multirun: bool, swept: tuple[str, ...]) -> tuple[Any, Any]:
    """The job's spec (every rule passed, before W&B or a model) and its RunResult, trained in this process or in
    `accelerate launch` children."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab import config as config_mod  # here, not at the top: `--cfg job` and `--help` never need it

    _redact_hydra_files(multirun)
    spec = _spec(config_mod.parse(cfg), cfg, swept)
    if spec.run.launcher.kind == "accelerate":
        from grpo_lab.launch import machines as machines_mod
        from grpo_lab.launch.processes import run_children

        machines = machines_mod.resolve(spec.run.launcher, os.environ)
        if machines.machine_rank == 0:  # the others may share machine 0's folder (Slurm, submitit)
            _check_new_folder(spec)
        slot = HydraConfig.get().job.get("num", 0) if multirun else 0
        startup.resume()  # this process only waits for its children, which load the model
        return spec, run_children(spec, machines, slot=int(slot or 0), env=dict(os.environ))
    from grpo_lab.run.train import run

    _check_new_folder(spec)
    return spec, run(spec)


def _spec(run: Any, cfg: DictConfig, swept: tuple[str, ...]) -> Any:
    """The job spec: where it runs (with `resume=<folder>`, that folder, under the run's first name) and every rule
    of the settings checked, TRL's own included (imports trl)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from grpo_lab import config as config_mod
    from grpo_lab import models
    from grpo_lab.run.folder import RunFolder

    name, group, overrides = _job_identity(cfg, swept)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    in_multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if run.resume is not None:  # the run's own spec, with what the command line may change (checked before Hydra)
        from grpo_lab.run.resume import resumed_spec

        spec, _ = resumed_spec(run.resume, overrides, cache_dir())
        run, run_dir, name, group, overrides = spec.run, spec.run_dir, spec.run_name, spec.group, list(spec.overrides)
        in_multirun = in_multirun or spec.in_multirun  # a grid's job resumed alone is still one of its jobs
        resolved = dict(spec.resolved_config)
    else:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    return config_mod.build_job(
        run,
        given={ov.key(o) for o in overrides},
        architecture=lambda: models.architecture(run.model, cache_dir()),
        run_dir=run_dir,
        output_dir=RunFolder(run_dir).trainer_dir,
        run_name=name,
        group=group,
        overrides=tuple(overrides),
        resolved_config=resolved,
        cache_dir=cache_dir(),
        in_multirun=in_multirun,
    )


def _check_new_folder(spec: Any) -> None:
    """A new job never writes into a folder that holds a run (a `hydra.run.dir` or a preset's fixed folder that
    grpo_lab.command could not see before Hydra resolved it); a resumed one continues its own."""
    from grpo_lab.run.folder import RunFolder

    folder, run_dir = RunFolder(spec.run_dir), spec.run_dir
    if spec.run.resume is None and (folder.job_file.exists() or folder.metrics_file.exists()):
        raise ConfigError(
            f"{run_dir} holds a run already, which this one would overwrite: give the job a new folder "
            f"(hydra.run.dir / hydra.sweep.dir), or resume={run_dir} to continue that run."
        )


def _job_identity(cfg: DictConfig, swept: tuple[str, ...]) -> tuple[str, str | None, list[str]]:
    """The run's name, its W&B group and the job's overrides (as the user typed them)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = [ov.as_typed(o) for o in hc.overrides.task]
    multirun = hc.mode == RunMode.MULTIRUN
    varied = [o for o in overrides if ov.key(o) in swept] if multirun else []
    if cfg.logger.name:
        name = str(cfg.logger.name)
    elif varied:
        name = ",".join(varied)
    else:
        shown = [o for o in overrides if ov.key(o) != "experiment"]
        name = cfg.name + (f"[{','.join(shown)}]" if shown else "")
    if cfg.logger.group:
        group = str(cfg.logger.group)
    elif multirun:
        sweep_dir = Path(hc.sweep.dir)
        group = f"{cfg.name}-multirun-{sweep_dir.parent.name}_{sweep_dir.name}"
    else:
        group = None
    return redact(name), redact(group), overrides  # the name reaches W&B, metrics.json and the console


def _redact_hydra_files(multirun: bool) -> None:
    """Mask secrets in Hydra's copies of the config (`.hydra/*.yaml`, `multirun.yaml`), written before the job."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab.run.folder import RunFolder

    hc = HydraConfig.get()
    sweep_dir = Path(hc.sweep.dir) if multirun else None
    RunFolder(Path(hc.runtime.output_dir)).redact_hydra_copies(hc.output_subdir, sweep_dir)


# ------------------------------------------------------------------------------------------------ errors
def report(error: Exception, *, verbose: bool) -> int:
    """Print an error that ended a command outside a training job (Hydra, the sweeper, a multirun, a side
    command) in one line, or with its traceback if `verbose` or a bug; returns the exit code."""
    import traceback

    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    from grpo_lab.config.problems import describe

    line = describe(error)
    if verbose or (line is None and not isinstance(error, CompactHydraException)):
        text = "".join(traceback.format_exception(error))
    elif isinstance(error, CompactHydraException) and line is None:  # Hydra's short messages (bad override...)
        text = f"{error}\n" + (f"{error.__cause__}\n" if isinstance(error.__cause__, OmegaConfBaseException) else "")
    else:
        text = f"Error: {line}\n"
    sys.stderr.write(redact(text))
    sys.stderr.flush()
    return 1


# ------------------------------------------------------------------------------------------ entry points
def main() -> None:
    """`python -m grpo_lab [--verbose] OVERRIDES...`: user and environment errors end in one line and exit 1;
    `--verbose` (or HYDRA_FULL_ERROR=1) prints their full traceback instead."""
    options, argv = parse_flags(sys.argv[1:])
    try:
        args, swept = prepare_overrides(argv)
        if (text := _fast_help(args)) is not None:
            print(text)
            return
        with interrupts.handling():  # SIGTERM raises like Ctrl-C; both end the run recorded as interrupted
            try:
                run_hydra(training_app(verbose=options.verbose, swept=tuple(swept)), checked_command(args))
            except Exception as e:  # a launcher's own error for a job stopped by the signal sent on to it
                if (signum := interrupts.received()) is None:
                    raise
                raise interrupts.Interrupted(signum) from e
            finally:
                interrupts.forward_to_children(False)
            interrupts.raise_if_received()  # a signal sent on to a multirun's workers, whose jobs all returned
    except KeyboardInterrupt as e:
        code = interrupts.exit_code_for(e)
        sys.stderr.write(f"Stopped by {interrupts.signal_name(interrupts.signal_of(e) or 2)} (exit {code}).\n")
        sys.exit(code)
    except Exception as e:
        from grpo_lab.compare import multirun_end

        multirun_end.finish_failed()  # a grid that a failed job ended: the others' results still shown
        sys.exit(report(e, verbose=options.verbose))


def _fast_help(args: list[str]) -> str | None:
    """`--help` with nothing but overrides (and `-m`): grpo_lab.help's text, without Hydra's slow group walk.
    None for anything else (`--hydra-help`, `--config-dir`, another config), which Hydra answers itself."""
    positions = set(_override_positions(args))
    flags = {a for i, a in enumerate(args) if i not in positions}
    if not flags & {"--help", "-h"} or not flags <= {"--help", "-h", "-m", "--multirun"}:
        return None
    from grpo_lab import help as help_mod

    # A grid's values (`lr=1e-5,2e-5`) cannot compose one config: the help shows the other overrides' values.
    return help_mod.app_help([args[i] for i in sorted(positions) if not ov.parse(args[i]).is_sweep_override()])


def side_command(app: Callable[[], Any], args: list[str], run_dir: str, *, verbose: bool) -> None:
    """Run a `@hydra_app` other than training (check_rewards, doctor) on the run's own overrides `args`, composed
    and validated exactly as `python -m grpo_lab` would, with its folder at `run_dir` and errors in one line."""
    try:
        if multirun := next((a for a in args if a in ("-m", "--multirun")), None):
            script = Path(sys.argv[0])  # .../grpo_lab/check_rewards.py, .../grpo_lab/doctor/__main__.py
            command = f"{script.parent.parent.name}.{script.parent.name}" if script.stem == "__main__" else ""
            command = command or f"{script.parent.name}.{script.stem}"
            raise ConfigError(
                f"{multirun}: {command} checks one run's config, not a grid or a sweep: drop {multirun} and give one "
                "value per key (the overrides of the run to check)."
            )
        prepared, _ = prepare_overrides(args)
        run_hydra(app, [*prepared, f"hydra.run.dir={run_dir}"])
    except Exception as e:
        sys.exit(report(e, verbose=verbose))


def throwaway_side_command(app: Callable[[], Any], args: list[str], *, prefix: str, verbose: bool) -> None:
    """`side_command` for a command that keeps nothing (doctor, vllm_server): its Hydra folder is a temporary one,
    removed afterwards, and Hydra writes no copy of the config there."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        side_command(app, [*args, "hydra.output_subdir=null"], folder, verbose=verbose)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def console_main() -> None:
    """The `grpo-lab` command: `python -m grpo_lab`, with the current directory importable as `-m` makes it
    (so that `_target_: my_rewards.fn` finds `./my_rewards.py`; user modules are imported only later, by
    Hydra's instantiate)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    main()


if __name__ == "__main__":
    main()
