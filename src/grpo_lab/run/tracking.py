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
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from grpo_lab.config import LoggerConfig
from grpo_lab.redact import redact

log = logging.getLogger("grpo_lab")


def wandb_base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def wandb_logged_in() -> bool:
    """An API key in the environment, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(wandb_base_url()).hostname or "api.wandb.ai"
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
        self.fell_back = False  # online was asked for, the host was unreachable: recorded offline
        self._links: dict[str, str] = {}  # the W&B folder's links before this run started (see discard)

    @property
    def report_to(self) -> list[str]:
        """TRL's `report_to`: W&B only while our run is open."""
        return ["wandb"] if self.mode in ("online", "offline") else []

    def start(self, config: dict[str, Any], *, resume_id: str | None = None) -> TrackerInfo:
        """Open the W&B run; `resume_id`: continue that run (a resumed job, `resume=<run folder>`)."""
        if self.mode == "disabled":
            return self.info
        try:
            import wandb

            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._links = _links(self.run_dir / "wandb")  # W&B repoints latest-run and its debug logs at a new run
            run_id = resume_id or uuid.uuid4().hex[:8]  # ours, so that an offline retry keeps it
            started = time.monotonic()
            earlier = set((self.run_dir / "wandb").glob(f"run-*-{run_id}"))  # a resumed run's online folders
            try:
                self._run = self._init(wandb, config, mode=self.mode, run_id=run_id, resume=resume_id is not None)
            except Exception as e:
                if self.mode != "online" or not _unreachable(e):
                    raise
                self._run = self._fall_back_offline(wandb, config, run_id, resume_id is not None, e, started, earlier)
        except Exception as e:  # any W&B failure: keep training, say so once
            log.warning("W&B could not start (%s: %s); training goes on without it.", type(e).__name__, _first_line(e))
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
        if self.fell_back:
            log.warning(
                "W&B is offline: the run is kept in %s; upload it once the network is back with `wandb sync %s`",
                run_path,
                run_path,
            )
        elif self.mode == "offline":
            log.info(
                "W&B is offline (not logged in): the run is kept in %s; upload it with `wandb sync %s`",
                run_path,
                run_path,
            )
        return self.info

    def _init(self, wandb: Any, config: dict[str, Any], *, mode: str, run_id: str, resume: bool) -> Any:
        settings: dict[str, Any] = {"quiet": self.cfg.quiet}
        if mode == "online" and not os.environ.get("WANDB_INIT_TIMEOUT"):
            settings["init_timeout"] = INIT_TIMEOUT_S
        # W&B also records sys.argv in the run's metadata: the CLI leaves only its redacted form there.
        return wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=redact(self.group),
            name=redact(self.name),
            job_type=self.cfg.job_type,
            tags=redact(list(self.tags)),
            config=redact(config),
            dir=str(self.run_dir),
            mode=mode,
            reinit="finish_previous",
            id=run_id,
            resume="allow" if resume else None,
            settings=wandb.Settings(**settings),
        )

    def _fall_back_offline(
        self,
        wandb: Any,
        config: dict[str, Any],
        run_id: str,
        resume: bool,
        error: Exception,
        started: float,
        earlier: set[Path],
    ) -> Any:
        """Online, but the W&B host cannot be reached: record the same run (same id) offline, to sync later."""
        log.warning(
            "W&B could not reach %s within %.0f s (%s: %s); the run goes on offline.",
            os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"),
            time.monotonic() - started,
            type(error).__name__,
            _first_line(error),
        )
        wandb.teardown()  # the failed attempt still holds the run id in W&B's service process
        for attempt in set((self.run_dir / "wandb").glob(f"run-*-{run_id}")) - earlier:
            shutil.rmtree(attempt, ignore_errors=True)  # the failed attempt's folder: no data, only its logs
        run = self._init(wandb, config, mode="offline", run_id=run_id, resume=resume)
        self.mode = "offline"
        self.fell_back = True
        return run

    def log(self, metrics: dict[str, Any]) -> None:
        """Log outside the trainer's steps (e.g. the evaluation before training)."""
        if self._run is not None:
            self._guard(lambda: self._run.log(metrics, commit=True))

    def summarize(self, values: dict[str, Any]) -> None:
        if self._run is not None:
            self._guard(lambda: self._run.summary.update(redact(values)))

    def alert(self, title: str, text: str) -> None:
        """A W&B alert (email / Slack, as the user set them up); online runs only: offline there is no one to tell."""
        if self._run is not None and self.mode == "online":
            self._guard(lambda: self._run.alert(title=redact(title), text=redact(text)))

    def add_tags(self, *tags: str) -> None:
        if self._run is not None:
            self._guard(lambda: setattr(self._run, "tags", (*self._run.tags, *tags)))

    def finish(self, *, failed: bool, exit_code: int | None = None) -> None:
        """Close the run, marked failed when the job raised (`exit_code`, e.g. 130 after Ctrl-C, else 1).
        Safe to call twice."""
        if self._run is None:
            return
        run, self._run = self._run, None
        try:
            run.finish(exit_code=exit_code if exit_code is not None else (1 if failed else 0))
        except Exception as e:
            log.warning("W&B could not finish cleanly (%s); the local files are kept in %s", e, self.info.run_path)

    def discard(self) -> None:
        """Close the run and remove this attempt's local W&B files (a resume attempt that trained nothing): the
        folder's W&B files are as they were. An online run's server copy keeps the attempt, as W&B keeps any."""
        self.finish(failed=False)
        wandb_dir = self.run_dir / "wandb"
        if self.info.run_path and Path(self.info.run_path).parent == wandb_dir:
            shutil.rmtree(self.info.run_path, ignore_errors=True)
            for name in set(_links(wandb_dir)) | set(self._links):
                (wandb_dir / name).unlink(missing_ok=True)
                if name in self._links:
                    (wandb_dir / name).symlink_to(self._links[name])

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as e:
            log.warning("W&B call failed (%s: %s); continuing.", type(e).__name__, _first_line(e))


def _links(folder: Path) -> dict[str, str]:
    """The symbolic links in `folder` and what they point at."""
    return {p.name: os.readlink(p) for p in folder.iterdir() if p.is_symlink()} if folder.is_dir() else {}


# Seconds `wandb.init` waits for an online W&B host before the run is recorded offline instead (W&B adds
# 10 s of grace of its own: an unreachable host costs ~26 s in all). `WANDB_INIT_TIMEOUT` overrides it.
INIT_TIMEOUT_S = 15.0


def _unreachable(error: Exception) -> bool:
    """A network failure (host down, refused, timed out), as opposed to a refused login or a bad setting."""
    from wandb.errors import CommError

    text = str(error).lower()
    return isinstance(error, CommError | TimeoutError | ConnectionError) or any(
        word in text for word in ("timed out", "connection refused", "no such host", "network is unreachable")
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return redact(text.splitlines()[0] if text else "")
