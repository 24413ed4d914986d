"""`run(cfg, ctx) -> RunResult`: one GRPO training job, top to bottom.

seed -> data -> rewards -> model source check -> GRPOConfig -> W&B -> model -> eval before ->
GRPOTrainer.train -> eval after -> save -> metrics.json. No argv or environment reading: the CLI
passes everything in, so a test can call this directly.

Ctrl-C or SIGTERM (grpo_lab.interrupts) ends a run as `interrupted`, with the signal and the step reached;
`resume=<run folder>` continues such a run from its last `trainer/checkpoint-*`, in the same folder and
the same W&B run.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import data as data_mod
from grpo_lab import interrupts, models, records
from grpo_lab.config import RunConfig, to_grpo_config
from grpo_lab.errors import ConfigError
from grpo_lab.evaluate import EvalResult, evaluate
from grpo_lab.rewards import build_rewards
from grpo_lab.tracking import Tracker, TrackerInfo

log = logging.getLogger("grpo_lab")

# Logged steps averaged for the reward at the start and at the end of a run: single steps are noisy.
_REWARD_WINDOW = 5


@dataclass(frozen=True)
class RunContext:
    run_dir: Path
    run_name: str
    group: str | None
    overrides: list[str]
    resolved_config: dict[str, Any]  # the whole composed config, nested, for W&B and config.yaml
    cache_dir: Path
    extra_tags: tuple[str, ...] = ()


class Objective(float):
    """What the Hydra task returns: the objective as a float (any sweeper can use it), carrying all of the
    run's metrics for sweepers that optimise several (grpo_lab's Optuna sweeper reads `.metrics`)."""

    metrics: dict[str, float]

    def __new__(cls, value: float, metrics: dict[str, float]) -> Objective:
        obj = super().__new__(cls, value)
        obj.metrics = dict(metrics)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # joblib/submitit launchers pickle job results
        return (Objective, (float(self), self.metrics))


@dataclass
class RunResult:
    status: str  # finished | failed | pruned | interrupted
    objective: float
    objective_metric: str
    metrics: dict[str, float]
    run_dir: Path
    run_name: str
    tracker: TrackerInfo
    history: list[dict[str, Any]] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def result_from_metrics(data: dict[str, Any], run_dir: Path) -> RunResult:
    """A RunResult from a run folder's metrics.json (how a multi-process job's parent learns the result)."""

    def number(value: Any) -> float:
        return float(value) if value is not None else float("nan")  # NaN is stored as the string "nan"

    objective = data.get("objective") or {}
    return RunResult(
        status=data["status"],
        objective=number(objective.get("value")),
        objective_metric=objective.get("metric", ""),
        metrics={k: number(v) for k, v in (data.get("metrics") or {}).items()},
        run_dir=run_dir,
        run_name=data.get("run_name", ""),
        tracker=TrackerInfo(**(data.get("wandb") or {"mode": "disabled"})),
        durations=data.get("durations_s") or {},
        error=data.get("error") or data.get("pruned"),
    )


# ------------------------------------------------------------------------------------------- resume
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Resume:
    """Where `resume=<run folder>` continues: the folder, its last complete checkpoint, the W&B run."""

    run_dir: Path
    checkpoint: Path
    step: int
    wandb_id: str | None
    previous: dict[str, Any]  # the folder's metrics.json, {} when the run left none (e.g. killed)


def find_resume(folder: str) -> Resume:
    """The last complete `trainer/checkpoint-N` of a run folder; a one-line ConfigError if there is none."""
    run_dir = Path(folder).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"resume={folder}: no such run folder.")
    trainer_dir = run_dir / "trainer"
    found = [
        (int(m.group(1)), p)
        for p in (trainer_dir.iterdir() if trainer_dir.is_dir() else [])
        if (m := _CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()  # written last: complete
    ]
    if not found:
        raise ConfigError(f"no checkpoint in {trainer_dir}: run with trainer.save_strategy=steps trainer.save_steps=N")
    step, checkpoint = max(found)
    metrics_file = run_dir / "metrics.json"
    previous = records.read_json(metrics_file) if metrics_file.is_file() else {}
    wandb_id = (previous.get("wandb") or {}).get("run_id")
    if wandb_id is None:  # no metrics.json (SIGKILL): the W&B folder's name ends with the run id
        runs = sorted((run_dir / "wandb").glob("*run-*-*"))
        wandb_id = runs[-1].name.rsplit("-", 1)[1] if runs else None
    return Resume(run_dir, checkpoint, step, wandb_id, previous)


def _resumed_history(path: Path, upto: int) -> list[dict[str, Any]]:
    """The history rows up to the checkpoint's step; later rows (logged after the last checkpoint,
    before the interruption) are trained again, so they are dropped from the file."""
    import json

    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("step", 0) <= upto]
    path.unlink()
    for row in rows:
        records.append_jsonl(path, row)
    return rows


def resume_context(cfg: RunConfig, ctx: RunContext) -> tuple[RunContext, Resume | None]:
    """With `resume=<folder>`, the job writes into that folder, whatever Hydra's run dir is, under the
    run's first name (not one that spells out `resume=...`)."""
    if cfg.resume is None:
        return ctx, None
    point = find_resume(cfg.resume)
    if point.run_dir != ctx.run_dir:
        log.info("Resuming into %s (Hydra's own folder for this job is %s).", point.run_dir, ctx.run_dir)
    name = point.previous.get("run_name") or ctx.run_name
    return dataclasses.replace(ctx, run_dir=point.run_dir, run_name=name), point


def _history_callback(path: Path, rows: list[dict[str, Any]]) -> Any:
    """A TrainerCallback that appends each log to history.jsonl as it happens (survives a crash)."""
    from transformers import TrainerCallback

    class HistoryWriter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and state.is_world_process_zero and "reward" in logs:
                row = {"step": state.global_step, **logs}
                rows.append(row)
                records.append_jsonl(path, row)

    return HistoryWriter()


# Shown beside TRL's progress bar instead of a 40-key dict per step (the full logs go to W&B and history.jsonl).
_BAR_KEYS = {"reward": "reward", "reward_std": "std", "kl": "kl", "completions/mean_length": "len"}


def _quiet_progress_bar() -> Any:
    """transformers' ProgressCallback, with the key metrics as the bar's postfix instead of printed dicts."""
    from transformers.trainer_callback import ProgressCallback

    class MetricsProgressBar(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs:
                shown = {short: f"{logs[key]:.3g}" for key, short in _BAR_KEYS.items() if key in logs}
                if shown:
                    self.training_bar.set_postfix(shown, refresh=False)

    return MetricsProgressBar


def _monitor_callback(
    cfg: RunConfig, tracker: Tracker, eval_set: Any, reporter: Any, evals: list, stop: dict[str, bool]
) -> Any:
    """Periodic held-out evaluation (`eval.every_n_steps`) and Optuna pruning, as one TrainerCallback.

    Only the main process evaluates and talks to Optuna; its decision to stop is broadcast at every log,
    so that all processes stop at the same step.
    """
    from transformers import TrainerCallback

    class TrainingMonitor(TrainerCallback):
        pending = False

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            every = cfg.eval.every_n_steps
            step = state.global_step
            if not every or step % every or step >= state.max_steps or not state.is_world_process_zero:
                return
            result = evaluate(model, processing_class, eval_set, cfg.eval, desc=f"eval at step {step}")
            metrics = {"accuracy": result.accuracy, "format": result.format, "mean_length": result.mean_length}
            evals.append({"step": step, **metrics})
            tracker.log({f"eval/{k}": v for k, v in metrics.items()} | {"train/global_step": step})
            if reporter is not None and reporter.observe_eval(step, metrics):
                self.pending = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            decision = self.pending
            if reporter is not None and logs and "reward" in logs:
                decision = reporter.observe_log(state.global_step, logs) or decision
            if args.world_size > 1:  # every process logs at the same steps, so all of them meet here
                from accelerate.utils import broadcast_object_list

                decision = broadcast_object_list([decision], from_process=0)[0]
            if decision:
                stop["pruned"] = True
                control.should_training_stop = True

    return TrainingMonitor()


def _window_mean(rows: list[dict[str, Any]], key: str, first: bool) -> float:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if not values:
        return float("nan")
    k = max(1, min(_REWARD_WINDOW, len(values) // 2))
    chosen = values[:k] if first else values[-k:]
    return sum(chosen) / len(chosen)


def training_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The last logged value of every numeric trainer key, plus reward means at the start and end."""
    out: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                out[f"train/{key}"] = float(value)
    out["train/reward_start"] = _window_mean(rows, "reward", first=True)
    out["train/reward_end"] = _window_mean(rows, "reward", first=False)
    out["train/steps"] = float(rows[-1]["step"]) if rows else 0.0
    return out


def _save_eval(run_dir: Path, name: str, result: EvalResult) -> None:
    path = run_dir / f"{name}.jsonl"
    path.unlink(missing_ok=True)
    for sample in result.samples:
        records.append_jsonl(path, sample)


def run(cfg: RunConfig, ctx: RunContext) -> RunResult:
    """One job; SIGINT/SIGTERM raise `interrupts.Interrupted` meanwhile (the run is recorded as interrupted)."""
    with interrupts.handling():
        return _run(cfg, ctx)


def _run(cfg: RunConfig, ctx: RunContext) -> RunResult:
    started = time.monotonic()
    durations: dict[str, float] = {}

    # Everything that can fail from bad input fails here, before W&B or a model.
    ctx, resume = resume_context(cfg, ctx)
    run_dir = ctx.run_dir
    source = models.resolve_source(cfg.model.name_or_path)
    models.check_available(source)
    pair = data_mod.load_datasets(cfg.data)
    reward_funcs = build_rewards(cfg.reward.functions)
    tracker = Tracker(
        cfg.logger,
        run_dir=run_dir,
        name=ctx.run_name,
        group=ctx.group,
        tags=[cfg.name, *cfg.logger.tags, *ctx.extra_tags],
    )
    grpo_args = to_grpo_config(
        cfg, output_dir=str(run_dir / "trainer"), report_to=tracker.report_to, run_name=ctx.run_name
    )
    durations["setup"] = time.monotonic() - started
    # With several processes (grpo_lab.launch), only the main one records, tracks, evaluates and reports.
    main = grpo_args.process_index == 0
    if main:
        records.write_start(run_dir, ctx.resolved_config, ctx.overrides)

    rows: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    stop = {"pruned": False}
    metrics: dict[str, float] = {}
    record: dict[str, Any] = {}  # extra metrics.json keys
    trainer: Any = None
    history_path = run_dir / "history.jsonl"
    if resume is not None:
        record["resumed_from"] = {"checkpoint": str(resume.checkpoint), "step": resume.step}
        log.info("Resuming from %s (step %d).", resume.checkpoint, resume.step)
    try:
        reporter = None
        if cfg.trial is not None and main:
            from grpo_lab.sweep.trial import TrialReporter, intermediate_source

            reporter = TrialReporter(cfg.trial, intermediate_source(cfg))

        if main:
            tracker.start(
                ctx.resolved_config | {"world_size": grpo_args.world_size, "launcher": cfg.launcher.kind},
                resume_id=resume.wandb_id if resume is not None else None,
            )
        if not tracker.report_to:
            grpo_args.report_to = []

        from transformers import set_seed
        from trl import GRPOTrainer

        set_seed(cfg.seed)
        t = time.monotonic()
        model, tokenizer = models.load_model_and_tokenizer(cfg.model, ctx.cache_dir)
        total, trainable = models.count_parameters(model)
        durations["model_load"] = time.monotonic() - t
        log.info("Model %s: %s parameters", cfg.model.name_or_path, f"{total:,}")

        if resume is not None:  # the evaluation before training belongs to the first part of the run
            before_keys = (resume.previous.get("metrics") or {}).items()
            metrics |= {k: float(v) for k, v in before_keys if k.startswith("eval_before/") and v is not None}
        elif cfg.eval.before and main:
            t = time.monotonic()
            before = evaluate(model, tokenizer, pair.eval, cfg.eval, desc="eval before")
            durations["eval_before"] = time.monotonic() - t
            metrics |= before.metrics("eval_before")
            _save_eval(run_dir, "eval_before", before)
            tracker.log({k: v for k, v in metrics.items()})

        if main and resume is not None:
            rows.extend(_resumed_history(history_path, resume.step))
        elif main:
            history_path.unlink(missing_ok=True)
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=reward_funcs,
            args=grpo_args,
            train_dataset=pair.train,
            peft_config=models.lora_config(cfg.model),
            callbacks=[
                _history_callback(history_path, rows),
                _monitor_callback(cfg, tracker, pair.eval, reporter, evals, stop),
            ],
        )
        if not grpo_args.disable_tqdm:
            from transformers.trainer_callback import ProgressCallback

            trainer.remove_callback(ProgressCallback)
            trainer.add_callback(_quiet_progress_bar())
        t = time.monotonic()
        trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume is not None else None)
        durations["train"] = time.monotonic() - t
        metrics |= training_metrics(rows)
        if stop["pruned"]:
            if main:
                return _pruned(cfg, ctx, tracker, reporter, metrics, rows, durations, started)
            return RunResult("pruned", float("nan"), cfg.objective.metric, {}, run_dir, ctx.run_name, tracker.info)

        if cfg.output.save_model:  # every process: sharded (DeepSpeed/FSDP) weights are gathered here
            trainer.save_model(str(run_dir / "model"))
            if main:
                tokenizer.save_pretrained(str(run_dir / "model"))
        if not main:
            return RunResult("finished", float("nan"), cfg.objective.metric, {}, run_dir, ctx.run_name, tracker.info)

        if cfg.eval.after:
            t = time.monotonic()
            after = evaluate(trainer.model, tokenizer, pair.eval, cfg.eval, desc="eval after")
            durations["eval_after"] = time.monotonic() - t
            metrics |= after.metrics("eval_after")
            _save_eval(run_dir, "eval_after", after)

        objective = metrics.get(cfg.objective.metric, float("nan"))
        if cfg.objective.metric not in metrics:
            log.warning(
                "Objective metric %r was not produced by this run (e.g. eval.after=false); it is NaN.",
                cfg.objective.metric,
            )
        durations["total"] = time.monotonic() - started
        result = RunResult(
            status="finished",
            objective=objective,
            objective_metric=cfg.objective.metric,
            metrics=metrics,
            run_dir=run_dir,
            run_name=ctx.run_name,
            tracker=tracker.info,
            history=rows,
            durations=durations,
        )
        _write_metrics(result, params={"total": total, "trainable": trainable}, **record)
        tracker.summarize({**metrics, "objective": objective, "status": "finished"})
        tracker.finish(failed=False)
        return result
    except BaseException as e:
        signum = interrupts.signal_of(e)
        if stop["pruned"] or not main:
            if signum is not None and not isinstance(e, KeyboardInterrupt):
                raise interrupts.Interrupted(signum) from e
            raise  # pruned: recorded already; other processes: the main one records
        durations["total"] = time.monotonic() - started
        status = "failed" if signum is None else "interrupted"
        failed = RunResult(
            status=status,
            objective=float("nan"),
            objective_metric=cfg.objective.metric,
            metrics=metrics | training_metrics(rows),
            run_dir=run_dir,
            run_name=ctx.run_name,
            tracker=tracker.info,
            history=rows,
            durations=durations,
        )
        if signum is None:
            error = f"{type(e).__name__}: {e}"
            _write_metrics(failed, error=error, **record)
            tracker.summarize({"status": "failed", "error": error})
            tracker.finish(failed=True)
            raise
        # The trainer's step (a resumed one is 0 until its checkpoint is loaded), else the last logged one.
        step = max(trainer.state.global_step if trainer is not None else 0, rows[-1]["step"] if rows else 0)
        name = interrupts.signal_name(signum)
        _write_metrics(failed, interrupted={"signal": name, "step": step}, **record)
        tracker.summarize({"status": "interrupted", "interrupted/signal": name, "interrupted/step": step})
        tracker.finish(failed=True, exit_code=128 + signum)
        log.warning(
            "Interrupted by %s at step %d of %d: %s records it.%s",
            name,
            step,
            cfg.max_steps,
            run_dir / "metrics.json",
            _resume_hint(run_dir),
        )
        if isinstance(e, KeyboardInterrupt):
            raise
        raise interrupts.Interrupted(signum) from e


def _resume_hint(run_dir: Path) -> str:
    try:
        point = find_resume(str(run_dir))
    except ConfigError:
        return ""
    return f" Continue it from step {point.step} with `resume={run_dir}`."


def _pruned(cfg, ctx, tracker, reporter, metrics, rows, durations, started) -> RunResult:
    """Training stopped early on the pruner's word: record it, close W&B tagged `pruned`, tell the sweeper."""
    from grpo_lab.sweep.trial import pruned_error

    durations["total"] = time.monotonic() - started
    step, value = reporter.last
    error = pruned_error(reporter)
    result = RunResult(
        status="pruned",
        objective=float("nan"),
        objective_metric=cfg.objective.metric,
        metrics=metrics | {"pruned/step": float(step), "pruned/intermediate_value": value},
        run_dir=ctx.run_dir,
        run_name=ctx.run_name,
        tracker=tracker.info,
        history=rows,
        durations=durations,
    )
    _write_metrics(result, pruned=str(error))
    tracker.add_tags("pruned")
    tracker.summarize({"status": "pruned", "pruned/step": step, "pruned/intermediate_value": value})
    tracker.finish(failed=False)
    raise error


def _write_metrics(result: RunResult, **extra: Any) -> None:
    records.write_json(
        result.run_dir / "metrics.json",
        {
            "status": result.status,
            "run_name": result.run_name,
            "objective": {"metric": result.objective_metric, "value": result.objective},
            "metrics": result.metrics,
            "durations_s": result.durations,
            "wandb": vars(result.tracker),
            **extra,
        },
    )
