"""`run(cfg, ctx) -> RunResult`: one GRPO training job, top to bottom.

Stages, in order: set up (resume point, model source check, data, rewards, GRPOConfig: everything that
can fail from bad input, before W&B or a model) -> track (W&B run, sweep trial) -> load the model ->
evaluate before -> train (GRPOTrainer with grpo_lab.run.callbacks: history.jsonl live, periodic evals, health,
pruning, each recording on one Outcome why training stopped early) -> save -> evaluate after -> close. One
:class:`Recorder` keeps the run's metrics and closes it (finished, failed, pruned, interrupted, or stopped or
diverged by a health rule): metrics.json (grpo_lab.run.folder) and the tracker's end, in one place. No argv
or environment reading: the CLI passes everything in, so a test can call this directly.

Ctrl-C or SIGTERM (grpo_lab.interrupts) ends a run as `interrupted`, with the signal and the step reached;
`resume=<run folder>` continues such a run from its last `trainer/checkpoint-*`, in the same folder and
the same W&B run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab import data as data_mod
from grpo_lab import interrupts, models, startup
from grpo_lab.config import JobSpec, RunConfig
from grpo_lab.config import trl as config_trl
from grpo_lab.config.schedule import of_run as reward_schedule
from grpo_lab.errors import ConfigError, GrpoLabError, one_line
from grpo_lab.evaluation.evaluate import EvalResult, change_metrics, evaluate, read_back
from grpo_lab.evaluation.graders import Grader, check_can_judge
from grpo_lab.evaluation.graders import build as build_graders
from grpo_lab.rewards import build_rewards
from grpo_lab.run import health
from grpo_lab.run.folder import RunFolder, RunResult
from grpo_lab.run.resume import Resume, find_resume
from grpo_lab.run.tracking import Tracker
from grpo_lab.vllm_engine.sync import rendezvous_env_kept

if TYPE_CHECKING:
    from grpo_lab.run.callbacks import Outcome  # transformers: imported with the trainer, not with this module

log = logging.getLogger("grpo_lab")

# Logged steps averaged for the reward at the start and at the end of a run: single steps are noisy.
_REWARD_WINDOW = 5


class TrainingHalted(GrpoLabError, RuntimeError):
    """A health rule with action `stop` ended training (grpo_lab.run.health): its message says why and what to do."""


# What torch's gloo backend says when a peer rank's connection drops ("Connection closed by peer",
# "Connection reset by peer"): the process that failed is another one.
_PEER_GONE = "by peer"


class ObjectiveValue(float):
    """What the Hydra task returns: the objective's value as a float (any sweeper can use it), carrying all of the
    run's metrics for sweepers that optimise several (grpo_lab's Optuna sweeper reads `.metrics`)."""

    metrics: dict[str, float]

    def __new__(cls, value: float, metrics: dict[str, float]) -> ObjectiveValue:
        obj = super().__new__(cls, value)
        obj.metrics = dict(metrics)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # joblib/submitit launchers pickle job results
        return (ObjectiveValue, (float(self), self.metrics))


def _resume_hint(run_dir: Path) -> str:
    try:
        point = find_resume(str(run_dir))
    except GrpoLabError:
        return ""
    return f" Continue it from step {point.step} with `resume={run_dir}`."


# ------------------------------------------------------------------------------------------ metrics
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


# ----------------------------------------------------------------------------------------- set up
@dataclass
class _Job:
    """What the set-up stage built from the config, before W&B or a model."""

    spec: JobSpec  # with `resume=`, the resumed run's folder and name
    resume: Resume | None
    pair: Any  # data.DataParts: train, validation (`eval`) and test
    reward_funcs: list[Any]
    graders: list[Grader]  # held-out evaluation (eval.graders)
    tracker: Tracker
    grpo_args: Any  # trl.GRPOConfig
    schedule: Any  # grpo_lab.config.schedule.Schedule: the reward weights over training (falsy: fixed)

    @property
    def cfg(self) -> RunConfig:
        return self.spec.run

    @property
    def ctx(self) -> JobSpec:
        """Where and under which name the job runs (the spec's)."""
        return self.spec

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.ctx.run_dir)

    @property
    def main(self) -> bool:
        """With several processes (grpo_lab.launch.processes), only the main one records, tracks, evaluates and
        reports."""
        return self.grpo_args.process_index == 0

    @property
    def grades_test(self) -> bool:
        """The main process of a single run grades the test part (a grid's or sweep's jobs leave it to the winner)."""
        return self.main and self.cfg.eval.test and not self.spec.in_multirun

    @property
    def talks_to_vllm_server(self) -> bool:
        """The process that generates through a vLLM server (`vllm_mode=server`: only the main one does)."""
        return self.main and self.grpo_args.use_vllm and self.grpo_args.vllm_mode == "server"


def _set_up(spec: JobSpec) -> _Job:
    """Everything that can fail from bad input fails here, before W&B or a model (the settings' rules have passed:
    grpo_lab.config.job)."""
    cfg, ctx = spec.run, spec
    resume = find_resume(cfg.resume) if cfg.resume is not None else None
    models.check_available(models.resolve_source(cfg.model.name_or_path))
    pair = data_mod.load_datasets(cfg.data)
    reward_funcs = build_rewards(cfg.reward.functions)
    graders = build_graders(cfg.eval.graders)
    if cfg.eval.before or cfg.eval.after or cfg.eval.every_n_steps:
        data_mod.check_graded_sizes(pair, test=cfg.eval.test)
        check_can_judge(graders, pair.eval)
        if cfg.eval.test:
            check_can_judge(graders, pair.test)
    if cfg.reward.sandbox is not None:  # bubblewrap missing or broken: one line now, not at the first step
        from grpo_lab.sandbox import check_isolation

        check_isolation(cfg.reward.sandbox.isolation)
    unisolated = ["sandbox-unisolated"] if cfg.reward.sandbox and cfg.reward.sandbox.isolation != "bwrap" else []
    schedule = reward_schedule(cfg)
    if resume is not None and schedule and cfg.reward.schedule_unit == "fraction":
        _check_resumed_length(resume, cfg.max_steps)
    tracker = Tracker(
        cfg.logger,
        run_dir=ctx.run_dir,
        name=ctx.run_name,
        group=ctx.group,
        tags=[cfg.name, *cfg.logger.tags, *ctx.extra_tags, *unisolated],
    )
    grpo_args = spec.grpo_config()  # built once in this process (the check built it, in a single-process job)
    grpo_args.report_to = tracker.report_to
    _check_enough_prompts(len(pair.train), grpo_args)
    return _Job(spec, resume, pair, reward_funcs, graders, tracker, grpo_args, schedule)


def _check_enough_prompts(size: int, grpo_args: Any) -> None:
    """TRL's sampler drops an incomplete batch of prompts: a training set smaller than one batch trains 0 steps."""
    needed = grpo_args.generation_batch_size // grpo_args.num_generations
    if size < needed:
        raise ConfigError(
            f"The training set has {size} prompt(s), but each generation batch takes {needed} "
            f"(generation_batch_size {grpo_args.generation_batch_size} / num_generations {grpo_args.num_generations}): "
            f"it would train 0 steps. Give the data at least {needed} training prompts (data.train_size, "
            "data.eval_fraction, a longer file), or a smaller trainer.per_device_train_batch_size."
        )


def _check_resumed_length(resume: Resume, max_steps: int) -> None:
    """A schedule in fractions of max_steps would stretch if a resumed run changed max_steps: its weights would move
    back. Steps (`reward.schedule_unit=steps`) keep their place."""
    import json

    state = resume.checkpoint / "trainer_state.json"
    before = json.loads(state.read_text()).get("max_steps") if state.is_file() else None
    if before is not None and before != max_steps:
        raise ConfigError(
            f"`max_steps={max_steps}` resumes a run of max_steps={before} whose reward.schedule is in fractions of "
            f"max_steps: its weights would be stretched over the new length. Resume with max_steps={before}, or "
            f"give the schedule in steps (reward.schedule_unit=steps, points' x in steps)."
        )


# --------------------------------------------------------------------------------------- recorder
class Recorder:
    """The run's record: its metrics, logged steps, periodic evaluations and durations, and the one place
    that ends it (metrics.json, then the tracker's summary and finish) as finished, failed, pruned,
    interrupted, stopped or diverged. Only the main process writes; the others keep nothing."""

    def __init__(self, job: _Job, started: float) -> None:
        self.job = job
        self.folder = RunFolder(job.ctx.run_dir)
        self.main = job.main
        self.started = started
        self.durations: dict[str, float] = {"setup": time.monotonic() - started}
        self.metrics: dict[str, float] = {}
        self.rows: list[dict[str, Any]] = []  # history.jsonl
        self.evals: list[dict[str, Any]] = []  # eval_periodic.jsonl
        # eval_before / eval_after (validation), test_before / test_after: for the paired change
        self.held_out: dict[str, EvalResult] = {}
        self.extra: dict[str, Any] = {}  # more metrics.json keys: resumed_from, params
        self.trainer: Any = None  # for the step reached when interrupted
        self.health: list[dict[str, Any]] = []  # grpo_lab.run.health events, as they fired
        self.keeper: Any = None  # grpo_lab.run.keep.Keeper, with output.keep=best|top_k
        self.closed = False
        self.rss_start_mb = _rss_mb()
        # A resumed run's record as it was: put back if this attempt ends before training a step.
        self.undo = self.folder.snapshot() if job.resume is not None and self.main else None

    def start(self) -> None:
        """The run folder's first files (config, overrides, environment)."""
        job = self.job
        if self.main:
            self.folder.write_start(job.ctx.resolved_config, job.ctx.overrides)
            self.folder.write_job(job.spec)
        if (sandbox := job.cfg.reward.sandbox) is not None:  # metrics.json, the summary and W&B say where code ran
            isolated = sandbox.isolation == "bwrap"
            self.metrics["sandbox/isolated"] = float(isolated)
            self.extra["sandbox"] = {"isolation": sandbox.isolation, "isolated": isolated}
            if not isolated:
                log.warning(
                    "reward.sandbox.isolation=%s: model-written code runs NOT isolated (rlimits only): it can reach "
                    "the network and this user's files. Install bubblewrap (apt-get install bubblewrap) to isolate it.",
                    sandbox.isolation,
                )
        if job.schedule:
            self.extra["reward_schedule"] = job.schedule.record()
        if job.resume is not None:
            self.extra["resumed_from"] = {"checkpoint": str(job.resume.checkpoint), "step": job.resume.step}
            log.info("Resuming from %s (step %d).", job.resume.checkpoint, job.resume.step)

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """`durations_s[stage]`, for a stage that completes."""
        t = time.monotonic()
        yield
        self.durations[stage] = time.monotonic() - t

    def restart_logs(self) -> None:
        """history.jsonl and eval_periodic.jsonl start empty, or, resumed, keep the rows up to the checkpoint."""
        if not self.main:
            return
        upto = self.job.resume.step if self.job.resume is not None else None
        rows, evals = self.folder.restart_logs(upto)
        self.rows.extend(rows)
        self.evals.extend(evals)

    def log_step(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.folder.append_history(row)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        """A periodic evaluation: eval_periodic.jsonl now, metrics.json's `eval_periodic` at the end, W&B."""
        row = {"step": step, **metrics}
        self.evals.append(row)
        self.folder.append_eval_periodic(row)
        self.job.tracker.log({f"eval/{k}": v for k, v in metrics.items()} | {"train/global_step": step})

    def add_eval(self, name: str, result: EvalResult) -> None:
        """An evaluation before or after training: its metrics, and its graded completions as `<name>.jsonl`."""
        self.metrics |= result.metrics(name)
        self.folder.write_eval(name, result.samples)
        self.held_out[name] = result
        part, when = name.rsplit("_", 1)
        if when == "after" and f"{part}_before" in self.held_out:  # the same items, before and after
            self.metrics |= change_metrics(self.held_out[f"{part}_before"], result, f"{part}_change")

    def result(self, status: str, objective: float = float("nan"), **metrics: float) -> RunResult:
        job = self.job
        return RunResult(
            status=status,
            objective=objective,
            objective_metric=job.cfg.objective.metric,
            metrics=self.metrics | training_metrics(self.rows) | metrics if self.main else {},
            run_dir=job.ctx.run_dir,
            run_name=job.ctx.run_name,
            tracker=job.tracker.info,
            history=self.rows,
            durations=self.durations,
            health=self.health,
        )

    def _close(self, result: RunResult, summary: dict[str, Any], *, exit_code: int, **extra: Any) -> RunResult:
        """metrics.json, then the tracker's summary and end: the one place a run is closed."""
        result.durations["total"] = time.monotonic() - self.started
        # The process's memory as the job started and as it ends (a colocated vLLM engine released by then):
        # in a grid or a sweep, one job's end is the next one's start.
        self.extra["memory_mb"] = {"rss_start": self.rss_start_mb, "rss_end": _rss_mb()}
        periodic = {"eval_periodic": self.evals} if self.evals else {}
        self.folder.write_metrics(result, **extra, **self.extra, **periodic)
        self.closed = True  # a failure to write it (a full disk) is recorded as failed, if it can be
        # Every ending's W&B summary says which health rules fired, and when (a failed run's too).
        self.job.tracker.summarize(summary | {f"health/{e['rule']}": e["step"] for e in self.health})
        self.job.tracker.finish(failed=exit_code != 0, exit_code=exit_code)
        return result

    def finished(self) -> RunResult:
        metric = self.job.cfg.objective.metric
        if not self.main:
            return self.result("finished")
        if metric not in self.metrics:
            log.warning("Objective metric %r was not produced by this run (e.g. eval.after=false); it is NaN.", metric)
        result = self.result("finished", self.metrics.get(metric, float("nan")))
        summary = {**result.metrics, "objective": result.objective, "status": "finished"}
        return self._close(result, summary, exit_code=0)

    def health_event(self, event: health.Event) -> None:
        """A health rule fired (main process): once to the console and, when online, as a W&B alert; into
        metrics.json and the W&B summary when the run is closed."""
        self.health.append(event.as_dict())
        self.metrics[f"health/{event.rule}"] = float(event.step)
        if event.action == "warn":  # a stop is reported once, by the error that ends the run
            log.warning("Health (%s) at step %d: %s", event.flag, event.step, event.message)
        self.job.tracker.alert(f"grpo_lab {self.job.ctx.run_name}: {event.flag} at step {event.step}", event.message)

    def close_halted(self, outcome: Outcome) -> str:
        """Training stopped on a health rule: record the run `diverged` (NaN/inf) or `stopped`; returns why."""
        event = outcome.event or {}
        message = (
            f"Training {outcome.status} at step {event.get('step')} "
            f"(health.{event.get('rule')}={event.get('action')}): {event.get('message')}"
        )
        if (kept := self.metrics.get("keep/step")) is not None:
            graded_after = (("validation", "eval_after"), ("test", "test_after"))
            parts = [part for part, prefix in graded_after if f"{prefix}/num_samples" in self.metrics]
            graded = f", graded on the {' and '.join(parts)} part{'s' * (len(parts) > 1)}" if parts else ""
            message += f" The run ends with step {int(kept)}'s model (output.keep={self.job.cfg.output.keep}){graded}."
        if self.main:
            self.job.tracker.add_tags(outcome.status)
            result = self.result(outcome.status)  # with the kept step's evaluations, if it kept one
            summary = {**result.metrics, "status": outcome.status, "error": message}
            self._close(result, summary, exit_code=1, error=message)
        self.closed = True
        return message

    def close_pruned(self, where: dict[str, float], reason: str) -> None:
        """Training (or the evaluation after it) stopped early on the pruner's word: record it, W&B tagged
        `pruned`, with the reason in its summary as a failed run's `error`."""
        result = self.result("pruned", **where)
        self.job.tracker.add_tags("pruned")
        self._close(result, {"status": "pruned", **where, "pruned/reason": reason}, exit_code=0, pruned=reason)

    def _trained_on(self) -> bool:
        """Whether this resumed attempt trained a step beyond its checkpoint."""
        resumed = self.job.resume.step if self.job.resume is not None else 0
        trained = self.trainer.state.global_step if self.trainer is not None else 0
        return max(trained, self.rows[-1]["step"] if self.rows else 0) > resumed

    def _undo(self, error: BaseException, as_interrupt: BaseException) -> BaseException:
        """A resume attempt that ends before its first step changes nothing: the record files and W&B's local files
        as they were (its lines stay in the run's log). Returns the error to raise: a failure of its own (e.g. a
        damaged checkpoint) in one line."""
        self.job.tracker.discard()
        self.folder.restore(self.undo)
        self.closed = True
        log.warning("Resuming %s ended before training a step: the run's record is as it was.", self.job.ctx.run_dir)
        if isinstance(error, GrpoLabError) or interrupts.signal_of(error) is not None:
            return as_interrupt
        checkpoint = self.job.resume.checkpoint if self.job.resume is not None else "?"
        return GrpoLabError(
            f"Resuming from {checkpoint} failed before training a step ({type(error).__name__}: "
            f"{one_line(error, 300)}). If that checkpoint is damaged, remove it to resume from the one before "
            "(--verbose shows the traceback)."
        )

    def close_on(self, error: BaseException) -> BaseException:
        """Record a run that raised as failed or interrupted; returns the exception to raise (an interrupt
        seen through another exception, e.g. a collective that failed on a peer's signal, as Interrupted)."""
        signum = interrupts.signal_of(error)
        as_interrupt = (
            error if signum is None or isinstance(error, KeyboardInterrupt) else interrupts.Interrupted(signum)
        )
        if self.closed or not self.main:  # pruned: recorded already; other processes: the main one records
            return as_interrupt
        if self.undo is not None and not self._trained_on():
            return self._undo(error, as_interrupt)
        if signum is None:
            message = f"{type(error).__name__}: {error}"
            if _PEER_GONE in str(error):  # gloo's words for a rank that died or stopped elsewhere
                message = f"another process of the job ended first (see its machine's log): {message}"
            self._close(self.result("failed"), {"status": "failed", "error": message}, exit_code=1, error=message)
            return error
        # The trainer's step (a resumed one is 0 until its checkpoint is loaded), else the last logged one.
        trained = self.trainer.state.global_step if self.trainer is not None else 0
        step = max(trained, self.rows[-1]["step"] if self.rows else 0)
        name = interrupts.signal_name(signum)
        summary = {"status": "interrupted", "interrupted/signal": name, "interrupted/step": step}
        self._close(
            self.result("interrupted"), summary, exit_code=128 + signum, interrupted={"signal": name, "step": step}
        )
        run_dir = self.job.ctx.run_dir
        log.warning(
            "Interrupted by %s at step %d of %d: %s records it.%s",
            name,
            step,
            self.job.cfg.max_steps,
            RunFolder(run_dir).metrics_file,
            _resume_hint(run_dir),
        )
        return as_interrupt


# ----------------------------------------------------------------------------------------- stages
def run(spec: JobSpec) -> RunResult:
    """One job; SIGINT/SIGTERM raise `interrupts.Interrupted` meanwhile (the run is recorded as interrupted)."""
    trainer = spec.run.trainer
    colocated = bool(trainer.get("use_vllm")) and trainer.get("vllm_mode", "colocate") == "colocate"  # TRL's default
    with interrupts.handling(), rendezvous_env_kept(colocated):
        started = time.monotonic()
        job = _set_up(spec)
        recorder = Recorder(job, started)
        recorder.start()
        try:
            return _train_and_evaluate(job, recorder)
        except BaseException as e:
            _release_vllm(recorder.trainer)
            error = recorder.close_on(e)
            if error is e:
                raise
            raise error from e


def _train_and_evaluate(job: _Job, recorder: Recorder) -> RunResult:
    reporter = _start_tracking(job)
    with contextlib.closing(reporter) if reporter is not None else contextlib.nullcontext():  # its study's database
        with _vllm_server(job, recorder) as server:
            model, tokenizer = _load_model(job, recorder)
            startup.resume()  # imports and loading are done; before any generation (grpo_lab.startup)
            _evaluate_before(job, recorder, model, tokenizer)
            from grpo_lab.run.callbacks import Outcome

            outcome = Outcome()
            trainer = _fit(job, recorder, model, tokenizer, reporter, outcome, server)
        # A health rule that stopped training (e.g. the divergence alarm) with output.keep=best|top_k: the best step
        # before it is what the run was kept for, so it ends as a finished one does (model, graded validation and
        # test parts), still recorded as stopped. Not for a pruned trial: the pruner ended it for its sweep.
        ends_with_kept = outcome.status in ("stopped", "diverged") and _has_kept(recorder)
        ends_as_finished = outcome.status is None or ends_with_kept
        if ends_as_finished:
            _keep(recorder, trainer)
            if job.cfg.output.save_model:  # every process: sharded (DeepSpeed/FSDP) weights are gathered here
                trainer.save_model(str(job.folder.model_dir))
                if job.main:
                    tokenizer.save_pretrained(str(job.folder.model_dir))
            if job.main and job.cfg.eval.after:
                # A halted run's last evaluation is never pruned: its trial fails on the health rule anyway.
                _evaluate_after(job, recorder, trainer.model, tokenizer, None if ends_with_kept else reporter, outcome)
        _release_vllm(trainer)
        if recorder.keeper is not None and ends_as_finished:
            recorder.keeper.prune(latest=None)  # the run is over: only the kept checkpoints stay
        return _close(job, recorder, outcome, reporter)


def _has_kept(recorder: Recorder) -> bool:
    """Whether output.keep=best|top_k has a scored step to keep."""
    return recorder.keeper is not None and recorder.keeper.best_step is not None


def _keep(recorder: Recorder, trainer: Any) -> None:
    """output.keep=best|top_k: the kept checkpoint's weights into the model that is saved and graded last."""
    if recorder.keeper is None:
        return
    from grpo_lab.run.keep import load_kept

    step = load_kept(trainer, recorder.keeper)
    if step is not None:
        recorder.metrics |= {"keep/step": float(step), "keep/candidates": float(len(recorder.keeper.scores))}
        recorder.extra["keep"] = recorder.keeper.summary()


def _close(job: _Job, recorder: Recorder, outcome: Outcome, reporter: Any) -> RunResult:
    """The run ends as its outcome says: finished; pruned (the main process raises `optuna.TrialPruned` for the
    sweeper); or halted by a health rule (every process raises TrainingHalted)."""
    if outcome.status is None:
        return recorder.finished()
    if outcome.status != "pruned":
        raise TrainingHalted(recorder.close_halted(outcome))
    if not job.main:
        return recorder.result("pruned")
    from grpo_lab.run.trial import pruned_error

    error = pruned_error(reporter)
    recorder.close_pruned(reporter.pruned_metrics(), str(error))
    raise error


def _evaluate_after(job: _Job, recorder: Recorder, model: Any, tokenizer: Any, reporter: Any, outcome: Outcome) -> None:
    """The held-out evaluation after training; a per-item pruner (Wilcoxon) may stop it as the trial is pruned."""
    eval_set = job.pair.eval
    per_item = reporter is not None and reporter.per_item
    with recorder.timed("eval_after"):
        after = evaluate(
            model,
            tokenizer,
            eval_set,
            job.cfg.eval,
            desc="eval after",
            graders=job.graders,
            order=reporter.item_order(len(eval_set)) if per_item else None,
            watch=(lambda batch: reporter.observe_items(batch, len(eval_set))) if per_item else None,
        )
    if per_item and reporter.pruned:
        outcome.propose("pruned")
        return
    recorder.add_eval("eval_after", after)
    if job.grades_test:  # after validation, which a sweep's pruner reads: the test part never prunes
        with recorder.timed("test_after"):
            test = evaluate(model, tokenizer, job.pair.test, job.cfg.eval, desc="test after", graders=job.graders)
        recorder.add_eval("test_after", test)


@contextlib.contextmanager
def _vllm_server(job: _Job, recorder: Recorder) -> Iterator[Any]:
    """The main process's vLLM server for `vllm_mode=server` (grpo_lab.vllm_engine.server): checked or started here,
    stopped when training ends; None for every other job."""
    if not job.talks_to_vllm_server:
        yield None
        return
    from grpo_lab.vllm_engine import server as vllm_server

    with contextlib.ExitStack() as stack:
        with recorder.timed("vllm_server_start"):
            log_file = job.folder.vllm_server_log
            server = stack.enter_context(vllm_server.for_job(job.cfg, job.grpo_args, job.ctx.cache_dir, log_file))
        yield server


def _start_tracking(job: _Job) -> Any:
    """The sweep trial's reporter (main process, in a sweep) and the W&B run; returns the reporter or None."""
    reporter = None
    if job.cfg.trial is not None and job.main:
        from grpo_lab.run.trial import TrialReporter, intermediate_source

        reporter = TrialReporter(job.cfg.trial, intermediate_source(job.cfg))
    if job.main:
        job.tracker.start(
            job.ctx.resolved_config | {"world_size": job.grpo_args.world_size, "launcher": job.cfg.launcher.kind},
            resume_id=job.resume.wandb_id if job.resume is not None else None,
        )
    if not job.tracker.report_to:
        job.grpo_args.report_to = []
    return reporter


def _load_model(job: _Job, recorder: Recorder) -> tuple[Any, Any]:
    from transformers import set_seed

    set_seed(job.cfg.seed)
    with recorder.timed("model_load"):
        model, tokenizer = models.load_model_and_tokenizer(job.cfg.model, job.ctx.cache_dir)
        total, trainable = models.count_parameters(model)
    recorder.extra["params"] = {"total": total, "trainable": trainable}
    log.info("Model %s: %s parameters", job.cfg.model.name_or_path, f"{total:,}")
    return model, tokenizer


def _graded_parts(job: _Job) -> dict[str, Any]:
    """The held-out parts this process grades before and after training, by metric prefix: validation, and the
    test part where this job reports it."""
    return {"eval": job.pair.eval} | ({"test": job.pair.test} if job.grades_test else {})


def _evaluate_before(job: _Job, recorder: Recorder, model: Any, tokenizer: Any) -> None:
    if job.resume is not None:  # the evaluation before training belongs to the first part of the run
        previous = (job.resume.previous.get("metrics") or {}).items()
        for part in _graded_parts(job):
            name = f"{part}_before"
            recorder.metrics |= {k: float(v) for k, v in previous if k.startswith(f"{name}/") and v is not None}
            samples = job.folder.read_eval(name) if job.main else []
            if samples:  # its graded items, for the paired change after training
                length = recorder.metrics.get(f"{name}/mean_length", float("nan"))
                names = [g.name for g in job.graders]
                recorder.held_out[name] = read_back(samples, names, length, job.cfg.eval)
    elif job.cfg.eval.before and job.main:
        for part, dataset in _graded_parts(job).items():
            name = f"{part}_before"
            with recorder.timed(name):
                result = evaluate(
                    model, tokenizer, dataset, job.cfg.eval, desc=name.replace("_", " "), graders=job.graders
                )
            recorder.add_eval(name, result)
        job.tracker.log(dict(recorder.metrics))


def _callbacks(job: _Job, recorder: Recorder, reporter: Any, outcome: Outcome) -> list[Any]:
    """One TrainerCallback per concern (grpo_lab.run.callbacks); StopSync last, to share what the others decided."""
    from grpo_lab.run import callbacks

    found: list[Any] = [callbacks.HistoryWriter(recorder)]
    if job.schedule:  # every process: each scores its own completions
        found.append(callbacks.RewardWeights(job.schedule, recorder))
    if job.main:
        run_eval = functools.partial(
            evaluate, dataset=job.pair.eval, cfg=job.cfg.eval, graders=job.graders, sampled=False
        )
        monitor = health.Monitor(job.cfg.health)
        if (before := recorder.held_out.get("eval_before")) is not None:  # the divergence rule's baseline
            monitor.observe_eval(0, before.every_outcome())
        every = job.cfg.eval.every_n_steps
        if job.cfg.output.keep != "last":
            from grpo_lab.run.keep import Keeper

            recorder.keeper = Keeper(job.cfg, job.folder, recorder.evals)
        found.append(callbacks.PeriodicEval(every, run_eval, recorder, reporter, outcome, monitor, recorder.keeper))
        if recorder.keeper is not None:
            from grpo_lab.run.keep import KeepCheckpoints

            found.append(KeepCheckpoints(recorder.keeper))
        watch = callbacks.HealthWatch(monitor, recorder, outcome)
        found.append(watch)
        if reporter is not None:
            found.append(callbacks.SweepPruning(reporter, watch, outcome))
    return [*found, callbacks.StopSync(outcome)]


def _fit(
    job: _Job, recorder: Recorder, model: Any, tokenizer: Any, reporter: Any, outcome: Outcome, server: Any
) -> Any:
    """GRPOTrainer.train; the callbacks record on `outcome` whether and why training stopped early."""
    from transformers.trainer_callback import ProgressCallback
    from trl import GRPOTrainer

    from grpo_lab.run.callbacks import MetricsProgressBar

    recorder.restart_logs()
    # trainer_init: with vLLM colocated, mostly its engine's start (benchmarks/generation.py reports it).
    with recorder.timed("trainer_init"), _vllm_client(job.grpo_args):
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=job.reward_funcs,
            args=job.grpo_args,
            train_dataset=job.pair.train,
            peft_config=config_trl.lora_config(job.cfg.model),
            callbacks=_callbacks(job, recorder, reporter, outcome),
        )
    recorder.trainer = trainer
    if job.grpo_args.use_vllm:  # vLLM's CPU build needs its in-place reload for TRL's weight sync
        from grpo_lab.vllm_engine.sync import reload_in_place

        reload_in_place(trainer)
    if not job.grpo_args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(MetricsProgressBar)
    resume_from = str(job.resume.checkpoint) if job.resume is not None else None
    with recorder.timed("train"), _server_watch(job, server):
        trainer.train(resume_from_checkpoint=resume_from)
    recorder.metrics |= training_metrics(recorder.rows)
    return trainer


def _release_vllm(trainer: Any) -> None:
    """A colocated vLLM engine goes now, not with the trainer: the next job of a grid or sweep starts without it."""
    if trainer is not None and trainer.args.use_vllm:
        from grpo_lab.vllm_engine.sync import release

        release(trainer)


def _rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


def _vllm_client(grpo_args: Any) -> contextlib.AbstractContextManager[Any]:
    """While GRPOTrainer is built: a CPU trainer's vLLM server client sends weights through a file."""
    if not grpo_args.use_vllm:
        return contextlib.nullcontext()
    from grpo_lab.vllm_engine.sync import server_client

    return server_client(grpo_args)


def _server_watch(job: _Job, server: Any) -> contextlib.AbstractContextManager[Any]:
    """While training against a vLLM server: stop within seconds, with one line, if it goes away."""
    if not job.talks_to_vllm_server:
        return contextlib.nullcontext()
    from grpo_lab.vllm_engine import server as vllm_server

    return vllm_server.watched(vllm_server.base_url_of(job.grpo_args), server)
