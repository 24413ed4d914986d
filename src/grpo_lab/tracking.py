"""The one owner of `wandb.init` / `wandb.finish`.

We open the run ourselves before the trainer exists, because transformers' WandbCallback reuses an
existing `wandb.run`: that lets us choose project, group, name and tags, and put the whole composed
Hydra config (nested) into the run config; TRL then adds its GRPOConfig flat. A W&B failure is
reported and training goes on without it: losing the tracker must never lose the run.
"""

from __future__ import annotations

import logging
import netrc
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from grpo_lab.config import LoggerConfig

log = logging.getLogger("grpo_lab")


def wandb_logged_in() -> bool:
    """An API key in the environment, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def choose_mode(cfg: LoggerConfig) -> str:
    """online | offline | disabled. `WANDB_MODE` in the environment wins over `logger.mode=auto`."""
    if cfg.backend == "none" or cfg.mode == "disabled":
        return "disabled"
    if cfg.mode != "auto":
        return cfg.mode
    env = os.environ.get("WANDB_MODE", "").lower()
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if wandb_logged_in() else "offline"


_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]+):[^@\s]+@")


def redact(value: Any) -> Any:
    """Hide passwords in URLs (an Optuna storage such as postgresql+psycopg2://user:secret@host/db)."""
    if isinstance(value, str):
        return _PASSWORD_IN_URL.sub(r"\1:***@", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


@dataclass
class TrackerInfo:
    mode: str  # online | offline | disabled | failed
    run_id: str | None = None
    url: str | None = None
    run_path: str | None = None  # the local folder of this W&B run
    sync_command: str | None = None


class Tracker:
    """One W&B run for one job (or nothing, with `logger=none`)."""

    def __init__(self, cfg: LoggerConfig, *, run_dir: Path, name: str, group: str | None, tags: list[str]) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.name = name
        self.group = group
        self.tags = tags
        self.mode = choose_mode(cfg)
        self.info = TrackerInfo(mode=self.mode)
        self._run: Any = None

    @property
    def report_to(self) -> list[str]:
        """TRL's `report_to`: W&B only while our run is open."""
        return ["wandb"] if self.mode in ("online", "offline") else []

    def start(self, config: dict[str, Any]) -> TrackerInfo:
        if self.mode == "disabled":
            return self.info
        try:
            import wandb

            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=self.cfg.project,
                entity=self.cfg.entity,
                group=self.group,
                name=self.name,
                job_type=self.cfg.job_type,
                tags=self.tags,
                config=redact(config),
                dir=str(self.run_dir),
                mode=self.mode,
                reinit="finish_previous",
            )
        except Exception as e:  # any W&B failure: keep training, say so once
            log.warning("W&B could not start (%s: %s); training goes on without it.", type(e).__name__, e)
            self.mode = "failed"
            self.info = TrackerInfo(mode="failed")
            return self.info
        run_path = Path(self._run.dir).parent
        self.info = TrackerInfo(
            mode=self.mode,
            run_id=self._run.id,
            url=self._run.url if self.mode == "online" else None,
            run_path=str(run_path),
            sync_command=f"wandb sync {run_path}" if self.mode == "offline" else None,
        )
        if self.mode == "offline":
            log.info(
                "W&B is offline (not logged in): the run is kept in %s; upload it with `wandb sync %s`",
                run_path,
                run_path,
            )
        return self.info

    def log(self, metrics: dict[str, Any]) -> None:
        """Log outside the trainer's steps (e.g. the evaluation before training)."""
        if self._run is not None:
            self._guard(lambda: self._run.log(metrics, commit=True))

    def summarize(self, values: dict[str, Any]) -> None:
        if self._run is not None:
            self._guard(lambda: self._run.summary.update(values))

    def add_tags(self, *tags: str) -> None:
        if self._run is not None:
            self._guard(lambda: setattr(self._run, "tags", (*self._run.tags, *tags)))

    def finish(self, *, failed: bool) -> None:
        """Close the run, marked failed when the job raised. Safe to call twice."""
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            run.finish(exit_code=1 if failed else 0)
        except Exception as e:
            log.warning("W&B could not finish cleanly (%s); the local files are kept in %s", e, self.info.run_path)

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as e:
            log.warning("W&B call failed (%s: %s); continuing.", type(e).__name__, e)
