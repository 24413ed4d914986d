"""`python -m grpo_lab`: the only Hydra entry point, and the only module that reads argv and the environment.

The task function validates the composed config (no torch import), then hands a typed RunConfig to
``grpo_lab.train.run`` and returns the objective, so any Hydra sweeper can optimise it.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from grpo_lab import interrupts, startup
from grpo_lab import overrides as ov
from grpo_lab.errors import describe
from grpo_lab.paths import CONF_DIR, CONFIG_ENV, SWEEPS_DIR, cache_dir, config_groups, sweep_files
from grpo_lab.redact import redact

log = logging.getLogger("grpo_lab")

# Keys swept by a multirun (`-m lr=1e-5,2e-5` -> "lr"), passed to every job (jobs may run in other
# processes, e.g. the joblib launcher) so that each run is named after what differs.
SWEPT_ENV = "GRPO_LAB_SWEPT_KEYS"

# "1": print the full traceback of any error (`--verbose`, or HYDRA_FULL_ERROR=1 when main() started);
# otherwise user and environment errors are one line. Passed on to jobs in other processes.
VERBOSE_ENV = "GRPO_LAB_VERBOSE"

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


def prepare_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Rewrite `key=value` overrides into `++key=value`, and list the swept keys.

    Hydra refuses a key that is not already in the composed config with "Could not override"; we want
    our own validation to see it instead, so that it can name the nearest valid key, and so that any
    TRL GRPOConfig field can be set as `trainer.<field>=...` without listing all ~200 in YAML.
    Group selections (`model=tiny`), `hydra.*` keys and explicit `+`/`~` overrides are left alone
    (the rule is :func:`grpo_lab.overrides.normalise`).
    """
    groups = config_groups(_config_dirs(args))  # a group only a `--config-dir` has is a group too
    out, swept = list(args), []
    for i in _override_positions(args):
        override = ov.parse(args[i])
        if (key := override.key_or_group) in ("hydra.sweeper.sampler.name", "hydra.sweeper.pruner.name"):
            from grpo_lab.sweep.samplers import renamed

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


def _job_identity(cfg: DictConfig) -> tuple[str, str | None, list[str]]:
    """The run's name, its W&B group and the job's overrides (as the user typed them)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = [ov.as_typed(o) for o in hc.overrides.task]
    swept = [k for k in os.environ.get(SWEPT_ENV, "").split(",") if k]
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


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def task(cfg: DictConfig) -> float:
    """One Hydra job: validate, train, summarise; returns the objective."""
    startup.pause()  # until the job's model is loaded (grpo_lab.startup); in a launcher's worker process too
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from grpo_lab import config as config_mod  # here, not at the top: `--cfg job` and `--help` never need it

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        _redact_hydra_files(multirun)
        run_cfg = config_mod.load(cfg)
        if run_cfg.resume is not None:  # no such folder or no checkpoint: one line in a second, before TRL loads
            from grpo_lab.records import find_resume

            find_resume(run_cfg.resume)
        from grpo_lab import trl_checks  # TRL's own checks, before W&B or a model (imports trl)

        trl_checks.check(run_cfg, num_processes=run_cfg.launcher.num_processes)
        name, group, overrides = _job_identity(cfg)
        resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        from grpo_lab import summary
        from grpo_lab.train import Objective, RunContext, run

        context = RunContext(
            run_dir=Path(HydraConfig.get().runtime.output_dir),
            run_name=name,
            group=group,
            overrides=overrides,
            resolved_config=resolved,
            cache_dir=cache_dir(),
        )
        if run_cfg.launcher.kind == "accelerate":
            from grpo_lab.launch import run_children

            slot = HydraConfig.get().job.get("num", 0) if multirun else 0
            startup.resume()  # this process only waits for its children, which load the model
            result = run_children(run_cfg, context, slot=int(slot or 0), env=dict(os.environ))
        else:
            result = run(run_cfg, context)
    except Exception as e:
        line = describe(e)
        if multirun:
            if line is not None:
                log.error("%s", line)
            raise  # the sweeper records this job as failed and goes on
        if line is None or _verbose():  # a bug (or asked for): the traceback, secrets masked
            log.error("%s: %s", type(e).__name__, line or e, exc_info=e)
        else:
            log.error("%s", line)
        sys.exit(1)
    finally:
        if multirun:  # the next job runs in this process: a job that failed before its model loaded resumes here
            startup.resume()
    from grpo_lab.records import write_summary

    text = summary.format_run(result)
    summary_file = write_summary(result.run_dir, text)
    trial = run_cfg.trial
    print(text if trial is None else summary.format_trial(result, trial.number, summary_file), flush=True)
    return Objective(result.objective, result.metrics)


def _redact_hydra_files(multirun: bool) -> None:
    """Mask secrets in Hydra's copies of the config (`.hydra/*.yaml`, `multirun.yaml`), written before the job."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab import records

    hc = HydraConfig.get()
    sweep_dir = Path(hc.sweep.dir) if multirun else None
    records.redact_hydra_files(Path(hc.runtime.output_dir), hc.output_subdir, sweep_dir)


def _verbose() -> bool:
    default = "1" if os.environ.get("HYDRA_FULL_ERROR") == "1" else "0"
    return os.environ.get(VERBOSE_ENV, default) == "1"


def _report(error: Exception) -> int:
    """Print an error that ended the command outside a job (Hydra, the sweeper, a multirun); the exit code."""
    import traceback

    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    line = describe(error)
    if _verbose() or (line is None and not isinstance(error, CompactHydraException)):
        text = "".join(traceback.format_exception(error))
    elif isinstance(error, CompactHydraException) and line is None:  # Hydra's short messages (bad override...)
        text = f"{error}\n" + (f"{error.__cause__}\n" if isinstance(error.__cause__, OmegaConfBaseException) else "")
    else:
        text = f"Error: {line}\n"
    sys.stderr.write(redact(text))
    sys.stderr.flush()
    return 1


def main() -> None:
    """`python -m grpo_lab [--verbose] OVERRIDES...`: user and environment errors end in one line and exit 1;
    `--verbose` (or HYDRA_FULL_ERROR=1) prints their full traceback instead."""
    argv = sys.argv[1:]
    verbose = "--verbose" in argv or os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    # Hydra prints errors escaping a run (a storage that cannot be opened, an output folder that cannot be
    # created) with their traceback; this makes it raise them to us instead.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        args, swept = prepare_overrides([a for a in argv if a != "--verbose"])
        if (text := _fast_help(args)) is not None:
            print(text)
            return
        if swept:
            os.environ[SWEPT_ENV] = ",".join(swept)
        sys.argv = [sys.argv[0], *_resume_run_dir(args)]
        with interrupts.handling():  # SIGTERM raises like Ctrl-C; both end the run recorded as interrupted
            task()
    except KeyboardInterrupt as e:
        code = interrupts.exit_code_for(e)
        sys.stderr.write(f"Stopped by {interrupts.signal_name(interrupts.signal_of(e) or 2)} (exit {code}).\n")
        sys.exit(code)
    except Exception as e:
        from grpo_lab.compare import multirun_end

        multirun_end.finish_failed()  # a grid that a failed job ended: the others' results still shown
        sys.exit(_report(e))


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


def side_command(task_fn: Any, argv: list[str], run_dir: str) -> None:
    """Run a Hydra app other than training (check_rewards, doctor) on the run's own overrides, composed and
    validated exactly as `python -m grpo_lab` would, with its folder at `run_dir` and errors in one line."""
    verbose = "--verbose" in argv or os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach _report: one line, as in `python -m grpo_lab`
    try:
        args, _ = prepare_overrides([a for a in argv if a != "--verbose"])
        sys.argv = [sys.argv[0], *args, f"hydra.run.dir={run_dir}"]
        task_fn()
    except Exception as e:
        sys.exit(_report(e))


def console_main() -> None:
    """The `grpo-lab` command: `python -m grpo_lab`, with the current directory importable as `-m` makes it
    (so that `_target_: my_rewards.fn` finds `./my_rewards.py`; user modules are imported only later, by
    Hydra's instantiate)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    main()


def _resume_run_dir(args: list[str]) -> list[str]:
    """`resume=<run folder>` of a single run: Hydra's run dir becomes that folder, so that continuing a run
    does not leave a second, empty run folder behind (unless the user set `hydra.run.dir` themselves)."""
    given = ov.as_dict(args[i] for i in _override_positions(args))
    resume = given.get("resume")
    if "-m" in args or "--multirun" in args or "hydra.run.dir" in given or resume in (None, "", "None"):
        return args
    return [*args, ov.render("hydra.run.dir", str(resume))] if Path(str(resume)).is_dir() else args


if __name__ == "__main__":
    main()
