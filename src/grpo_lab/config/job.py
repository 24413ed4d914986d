"""From a composed config to a checked job: the typed settings (:func:`load`), every rule run once, and the job
spec that everything downstream reads (:class:`JobSpec`).

``load(cfg)`` turns Hydra's DictConfig into the frozen pydantic models of grpo_lab.config.schema (pydantic does the
type, range, choice and unknown-key checks from the declarations; its errors become our words: the nearest valid
name, the aliases other libraries use) and runs the rules of grpo_lab.config.rules. Past it no code calls
``cfg.get``. :func:`build_job` does the same for a job that will train, with the rules that import TRL, and returns
its :class:`JobSpec`: built once by the parent, read back by the ``accelerate launch`` children (which never compose
again) and kept in the run folder (``job.json``, secrets masked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_lab.config.problems import Problem, alias, fail, problems
from grpo_lab.config.schema import RunConfig
from grpo_lab.errors import ConfigError


def _container(cfg: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, DictConfig):
        return {k: v for k, v in dict(cfg).items() if k != "hydra"}
    raw = {}
    for k in cfg:  # `hydra` is Hydra's (a sweep's has values resolved only per job): never resolved here
        if k == "hydra":
            continue
        try:
            node = cfg[k]
            raw[k] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception as e:  # an interpolation that does not resolve; OmegaConf names the key
            key = str(getattr(e, "full_key", "") or k)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # OmegaConf adds key lines
            raise fail(Problem(key, "rule", must=f"does not resolve: {first}")) from e
    if unset := _mandatory(raw, ""):  # `???` in conf/: a value only the user can give (e.g. data=jsonl's path)
        raise fail(
            *(Problem(key, "rule", must=f"needs a value: give it on the command line, `{key}=...`") for key in unset)
        )
    return raw


def _mandatory(node: Any, prefix: str) -> list[str]:
    """The dotted keys whose value is OmegaConf's MISSING (`???`)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _mandatory(value, f"{prefix}{key}.")]
    return [prefix[:-1]] if node == "???" else []


def parse(cfg: Any) -> RunConfig:
    """The typed settings of a composed config (DictConfig or plain mapping): the declarations' checks only."""
    raw = _container(cfg)
    if missing := [group for group in ("reward", "trainer") if group not in raw]:
        raise fail(*(Problem(group, "missing", note="(a group of conf/config.yaml)") for group in missing))
    raw["trainer"] = raw["trainer"] or {}  # `trainer:` with every key left to TRL's defaults
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise fail(*problems(e, RunConfig, aliases=alias)) from None


def with_values(cfg: Any, values: Mapping[str, Any]) -> RunConfig:
    """The settings of `cfg` (parsed settings, or a composed config as :func:`parse` takes it) with dotted keys set
    as a command line would set them (`{"lr": 2e-5, "reward.functions.length.ideal_length": 40}`), checked by the
    declarations."""
    raw = cfg.model_dump(mode="json") if isinstance(cfg, RunConfig) else _container(cfg)
    return parse(set_keys(raw, values))


def set_keys(config: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A plain (JSON) copy of the nested mapping `config` with the dotted keys of `values` set."""
    import json

    out = json.loads(json.dumps(config, default=str))
    for key, value in values.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = json.loads(json.dumps(value, default=str))
    return out


def load(
    cfg: Any,
    *,
    given: Iterable[str] = (),
    architecture: Callable[[], Any] | None = None,
    libraries: bool = False,
) -> RunConfig:
    """The typed settings of a composed config, every rule of grpo_lab.config.rules passed (those that import TRL,
    transformers and peft too with `libraries`); a broken one raises one ConfigError, one line."""
    from grpo_lab.config import rules  # TRL's, transformers' and peft's checks: not for a config that fails to parse

    run = parse(cfg)
    checking = rules.Checking(run, run.launcher.num_processes, frozenset(given), architecture)
    rules.check(checking, rules.JOB if libraries else ("settings",))
    return run


def check_all(cfg: Any, *, architecture: Callable[[], Any] | None = None) -> tuple[RunConfig, Any]:
    """The typed settings with every rule passed, TRL's own included, and the GRPOConfig that check built (a command
    that reads it without training: the doctor, which reports the packages a switch needs in rows of its own)."""
    from grpo_lab.config import rules

    run = parse(cfg)
    checking = rules.Checking(run, run.launcher.num_processes, architecture=architecture)
    rules.check(checking, ("settings", "libraries"))
    return run, checking.grpo_config()


@dataclass(frozen=True)
class JobSpec:
    """What one job runs, decided once: its settings, every rule passed, and where and under which name it runs."""

    run: RunConfig
    run_dir: Path  # the run's folder (a resumed run's own)
    output_dir: Path  # TRL's output_dir: the run folder's trainer/ (checkpoints)
    run_name: str
    group: str | None
    overrides: tuple[str, ...]  # as the user typed them
    resolved_config: Mapping[str, Any]  # the whole composed config, for W&B and config.yaml
    cache_dir: Path
    extra_tags: tuple[str, ...] = ()
    # One job of a grid or sweep: its test part is not graded (a choice among the jobs could lean on it).
    in_multirun: bool = False
    _built: list[Any] = field(default_factory=list, compare=False, repr=False)

    FILE = "job.json"

    def grpo_config(self) -> Any:
        """TRL's GRPOConfig for this job, built once in this process (its report_to is set when tracking starts)."""
        if not self._built:
            from grpo_lab.config import trl

            self._built.append(
                trl.grpo_config(self.run, output_dir=str(self.output_dir), report_to=[], run_name=self.run_name)
            )
        return self._built[0]

    def as_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "run": self.run.model_dump(mode="json"),
            "run_dir": str(self.run_dir),
            "output_dir": str(self.output_dir),
            "run_name": self.run_name,
            "group": self.group,
            "overrides": list(self.overrides),
            "resolved_config": dict(self.resolved_config),
            "cache_dir": str(self.cache_dir),
            "extra_tags": list(self.extra_tags),
            "in_multirun": self.in_multirun,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec a parent (or an earlier run) wrote; its settings are parsed again (types only: its rules passed)."""
        return cls(
            run=_recorded_run(data["run"]),
            run_dir=Path(data["run_dir"]),
            output_dir=Path(data["output_dir"]),
            run_name=data["run_name"],
            group=data["group"],
            overrides=tuple(data["overrides"]),
            resolved_config=data["resolved_config"],
            cache_dir=Path(data["cache_dir"]),
            extra_tags=tuple(data["extra_tags"]),
            in_multirun=data.get("in_multirun", False),  # absent from an earlier release's job.json
        )


def _recorded_run(data: Any) -> RunConfig:
    """A recorded run's settings; one line when an earlier release wrote them without keys this one needs."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        kind = (data.get("data") or {}).get("kind")  # pydantic's location names the data union's member too
        missing = [".".join(str(p) for p in err["loc"] if p != kind) for err in e.errors() if err["type"] == "missing"]
        if not missing:
            raise
        raise ConfigError(
            f"This run was recorded by an earlier grpo_lab, without {', '.join(f'`{k}`' for k in missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''} (its data had no test part, for one): this release cannot continue "
            "or grade it as it ran. Run it again, or use the release that recorded it."
        ) from e


def build_job(
    cfg: Any,
    *,
    given: Iterable[str] = (),
    architecture: Callable[[], Any] | None = None,
    **where: Any,
) -> JobSpec:
    """The job spec of a composed config, or of its parsed settings, every rule passed, TRL's own included. `where`:
    JobSpec's run_dir, output_dir, run_name, group, overrides, resolved_config and cache_dir. The GRPOConfig the check
    builds is the job's when it trains in this process; a job of several processes checks with one of its own (each
    process builds its own: the world size is theirs)."""
    from grpo_lab.config import rules

    run = cfg if isinstance(cfg, RunConfig) else parse(cfg)
    spec = JobSpec(run=run, **where)
    several = run.launcher.kind == "accelerate"
    build = None if several else (lambda _: spec.grpo_config())
    checking = rules.Checking(run, run.launcher.num_processes, frozenset(given), architecture, build=build)
    rules.check(checking, rules.JOB)
    return spec
