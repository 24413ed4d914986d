"""`python -m grpo_lab`: the only Hydra entry point, and the only module that reads argv and the environment.

The task function validates the composed config (no torch import), then hands a typed RunConfig to
``grpo_lab.train.run`` and returns the objective, so any Hydra sweeper can optimise it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from grpo_lab import config as config_mod
from grpo_lab.errors import GrpoLabError
from grpo_lab.paths import CONF_DIR, SWEEPS_DIR, cache_dir, config_groups

log = logging.getLogger("grpo_lab")

# Keys swept by a multirun (`-m lr=1e-5,2e-5` -> "lr"), passed to every job (jobs may run in other
# processes, e.g. the joblib launcher) so that each run is named after what differs.
SWEPT_ENV = "GRPO_LAB_SWEPT_KEYS"

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
    only add roots, not rename a folder into a group, so they are stored in Hydra's ConfigStore.
    """
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    names = []
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        store.store(
            group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_", provider="grpo_lab sweeps/"
        )
        names.append(path.stem)
    return names


register_sweeps()


def prepare_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Rewrite `key=value` overrides into `++key=value`, and list the swept keys.

    Hydra refuses a key that is not already in the composed config with "Could not override"; we want
    our own validation to see it instead, so that it can name the nearest valid key, and so that any
    TRL GRPOConfig field can be set as `trainer.<field>=...` without listing all ~200 in YAML.
    Group selections (`model=tiny`), `hydra.*` keys and explicit `+`/`~` overrides are left alone.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = config_groups()
    parser = OverridesParser.create()
    out: list[str] = []
    swept: list[str] = []
    skip_next = False
    for token in args:
        if skip_next or token.startswith("-") or "=" not in token:
            skip_next = token in _FLAGS_WITH_VALUE
            out.append(token)
            continue
        override = parser.parse_override(token)
        key = override.key_or_group
        if override.is_sweep_override() and not key.startswith("hydra"):
            swept.append(key.split("@")[0])
        plain = not (token.startswith(("+", "~")))
        is_group = key.split("@")[0] in groups or "/" in key
        if plain and not is_group and not key.startswith("hydra.") and override.package is None:
            token = "++" + token
        out.append(token)
    return out, swept


def _clean(override: str) -> str:
    return override.lstrip("+")


def _job_identity(cfg: DictConfig) -> tuple[str, str | None, list[str]]:
    """The run's name, its W&B group and the job's overrides (as the user typed them)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    overrides = [_clean(o) for o in hc.overrides.task]
    swept = [k for k in os.environ.get(SWEPT_ENV, "").split(",") if k]
    multirun = hc.mode == RunMode.MULTIRUN
    varied = [o for o in overrides if o.split("=", 1)[0] in swept] if multirun else []
    if cfg.logger.name:
        name = str(cfg.logger.name)
    elif varied:
        name = ",".join(varied)
    else:
        shown = [o for o in overrides if not o.startswith("experiment=")]
        name = cfg.name + (f"[{','.join(shown)}]" if shown else "")
    if cfg.logger.group:
        group = str(cfg.logger.group)
    elif multirun:
        sweep_dir = Path(hc.sweep.dir)
        group = f"{cfg.name}-multirun-{sweep_dir.parent.name}_{sweep_dir.name}"
    else:
        group = None
    return name, group, overrides


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def task(cfg: DictConfig) -> float:
    """One Hydra job: validate, train, summarise; returns the objective."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        run_cfg = config_mod.load(cfg)
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
            result = run_children(run_cfg, context, slot=int(slot or 0), env=dict(os.environ))
        else:
            result = run(run_cfg, context)
    except GrpoLabError as e:
        log.error("%s", e)
        if multirun:
            raise  # the sweeper records this job as failed and goes on
        sys.exit(1)
    print(summary.format_run(result), flush=True)
    return Objective(result.objective, result.metrics)


def main() -> None:
    args, swept = prepare_overrides(sys.argv[1:])
    if swept:
        os.environ[SWEPT_ENV] = ",".join(swept)
    sys.argv = [sys.argv[0], *args]
    task()


if __name__ == "__main__":
    main()
