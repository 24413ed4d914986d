"""grpo_lab's Hydra sweeper on current Optuna: ask a trial, launch it as a Hydra job, tell the result.

The released hydra-optuna-sweeper pins optuna<3, cannot prune and leaves NaN trials RUNNING; this one
uses Optuna >= 5 with pruning from inside the training job, fault tolerance (a failing, NaN or killed
trial is recorded FAIL with its reason, the sweep goes on), resumable studies whose `n_trials` is a
target shared by all workers, and stable trial folders with a running `best.yaml`.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_lab import interrupts
from grpo_lab.config.sweep import DEFAULT_STORAGE, SweeperSettings
from grpo_lab.errors import GrpoLabError
from grpo_lab.paths import BEST_FILE, trial_name
from grpo_lab.redact import redact, share
from grpo_lab.sweep import identity

if TYPE_CHECKING:
    from grpo_lab.evaluation.ranking import Ranking
    from grpo_lab.sweep.plan import Plan
    from grpo_lab.sweep.storage import SweepStorage

log = logging.getLogger("grpo_lab")

# We use heartbeats and stale-trial failing outside Study.optimize on purpose (ask/tell across jobs).
warnings.filterwarnings("ignore", message=".*Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings(
    "ignore", message=r".*(heartbeat_interval|fail_stale_trials|set_metric_names|RetryHeartbeatStale).*experimental"
)


class SweepError(GrpoLabError, RuntimeError):
    """The sweep as a whole cannot go on (e.g. it fails everywhere)."""


def _outcome(ret: Any) -> tuple[Any, BaseException | None]:
    """(value, None) for a completed job, (None, its error) for a failed one, through Hydra's public
    `JobReturn.return_value`, which raises a failed job's error (and prints "Error executing job", wrong for a
    pruned trial: our own log line says what happened instead)."""
    if ret.status == JobStatus.COMPLETED:
        return ret.return_value, None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ret.return_value  # noqa: B018 (raises)
    except Exception as e:
        return None, e
    return None, RuntimeError(f"job ended {ret.status.name} without an error")


class GrpoOptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self._given = settings  # checked in setup, where a bad value is reported like any other config error
        self.settings: SweeperSettings = None  # type: ignore[assignment]
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.job_idx = 0

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        from grpo_lab.config.sweep import check

        self.settings = s = check(self._given)  # each hydra.sweeper.* value against its declared choices and range
        # Stable folders: outputs/sweeps/<study>/trial_<n>/, the same when the study is resumed.
        with open_dict(config):
            config.hydra.sweep.dir = str(Path(s.sweep_root) / s.study_name)
            # joblib: a batch is n_jobs trials; an idle worker only dies on Ctrl-C
            if "n_jobs" in config.hydra.launcher:
                config.hydra.launcher.n_jobs = s.n_jobs
        self.config = config
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # ------------------------------------------------------------------------------------------ sweep
    def sweep(self, arguments: list[str]) -> None:
        from grpo_lab.evaluation.ranking import from_trials
        from grpo_lab.sweep import retention

        s = self.settings
        plan = self._plan(arguments)
        self._run_until(s.n_trials, plan)
        if s.confirm.top_k > 0:
            self._run_until(s.n_trials + self._plan_confirmation(plan), plan)
        with plan.storage.lock(s.study_name):
            plan.storage.fail_stale(plan.study)
        ranking = from_trials(plan.study)
        kept = retention.apply(plan.study, s.keep_models, s.keep_top_k, ranking)
        self._report(plan, ranking, kept=kept)

    def _plan(self, arguments: list[str]) -> Plan:
        """Check the settings, open the storage and the study: the sweep's plan."""
        import optuna

        from grpo_lab.config import job, rules
        from grpo_lab.config import overrides as ov
        from grpo_lab.config.overrides import as_typed
        from grpo_lab.paths import config_groups
        from grpo_lab.sweep.plan import Plan
        from grpo_lab.sweep.space import check_values, expand_wildcards, parse_space
        from grpo_lab.sweep.storage import SweepStorage, quiet_deliberate_warnings

        quiet_deliberate_warnings()
        s = self.settings
        metrics = [o["metric"] for o in s.objectives]
        params = expand_wildcards(s.params or {}, self.config)
        space = parse_space(params, arguments, config_groups())
        distributions = {p.name: p.distribution for p in space.params}
        run = job.parse(self.config)  # the sweep's base settings: what every trial shares
        check_values(space, self.config)
        sweep = rules.SweepPlan(s, tuple(metrics), frozenset(distributions))
        rules.check(rules.Checking(run, run.launcher.num_processes, sweep=sweep), ("sweep",))
        storage = SweepStorage.open(
            s.storage or DEFAULT_STORAGE,
            heartbeat_interval=s.heartbeat_interval,
            grace_period=s.grace_period,
            max_retry=s.retry_failed,
        )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        given = {k: v for o in space.fixed if o.startswith("++") for k, v in ov.as_dict([o]).items()}
        fixed = identity.fixed_settings(job.with_values(self.config, given).model_dump(mode="json"), set(distributions))
        own = [o for o in self.config.hydra.overrides.hydra if str(o).startswith(("hydra.sweeper.", "hydra/"))]
        command = redact("python -m grpo_lab -m " + " ".join(as_typed(str(a)) for a in [*arguments, *own]))
        directions = [o["direction"] for o in s.objectives]
        study, worker, pruner = self._open_study(storage, metrics, directions, (fixed, command))
        return Plan(study, storage, space, metrics, worker, distributions, pruner)

    def _run_until(self, target: int, plan: Plan) -> None:
        """Claim and run batches of trials until the study holds `target` finished trials."""
        from grpo_lab.evaluation.ranking import from_trials
        from grpo_lab.sweep import retention
        from grpo_lab.sweep.report import write_best

        s, study = self.settings, plan.study
        while True:
            with interrupts.deferred():  # a claim cut in the middle would leave the database locked
                trials = plan.storage.claim(study, target=target, batch=s.n_jobs, distributions=plan.distributions)
            if not trials:
                return
            try:
                try:
                    self._run_batch(plan, trials)
                except Exception as e:  # the launcher's own error for a job stopped by the signal sent on to it
                    if (signum := interrupts.received()) is None:
                        raise
                    raise interrupts.Interrupted(signum) from e
                interrupts.raise_if_received()  # sent on to the trials' worker processes, which recorded themselves
            except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (grpo_lab.interrupts.Interrupted): stop the sweep
                self._interrupted(study, trials, e)
                raise
            with interrupts.deferred():
                ranking = from_trials(study)
                # Until the sweep ends, the configs it may still confirm keep their models (their test part is
                # graded over every seed of the one chosen).
                retention.apply(study, s.keep_models, s.keep_top_k, ranking, candidates=s.confirm.top_k)
                best = self.sweep_dir / BEST_FILE
                write_best(study, best, metrics=plan.metrics, storage=redact(plan.url), ranking=ranking)
            self._check_failures(study)

    def _plan_confirmation(self, plan: Plan) -> int:
        """Queue the confirmation trials (once per study, by the first worker whose search is over, after
        every search trial has ended: the top k must be known); their number."""
        import time

        from optuna.trial import TrialState

        from grpo_lab.sweep import confirm

        s, study = self.settings, plan.study
        while True:
            with plan.storage.lock(s.study_name):
                plan.storage.fail_stale(study)
                if (count := confirm.planned(study)) is not None:
                    return count
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if not running:
                    runs = confirm.plan(
                        study, top_k=s.confirm.top_k, seeds=s.confirm.seeds, base_seed=int(self.config.seed)
                    )
                    confirm.enqueue(study, runs)
                    log.info("Confirmation: %d configs x %d seeds.", len(runs) // s.confirm.seeds, s.confirm.seeds)
                    return len(runs)
            time.sleep(s.heartbeat_interval)  # another worker's search trial is still running

    def _open_study(
        self, storage: SweepStorage, metrics: list[str], directions: list[str], identified: tuple[dict[str, Any], str]
    ) -> tuple[Any, int, dict[str, Any] | None]:
        """Create or join the study (under the claim lock: several workers may start at once); this worker's
        number, its sampler (seed + worker number) and the pruner's config for the trials' jobs."""
        import optuna

        from grpo_lab.config.samplers import build_pruner, build_sampler, prunes

        s = self.settings
        multi = len(metrics) > 1
        with storage.lock(s.study_name):
            study = storage.create_or_load_study(
                s.study_name, directions=directions, sampler=optuna.samplers.RandomSampler(), pruner=None
            )
            fixed, command = identified  # the study's folder, settings and objectives, and its command
            identity.check_study(study, fixed, s.objectives, self.sweep_dir, command)
            worker = int(study.user_attrs.get("grpo_lab_workers", 0))
            study.set_user_attr("grpo_lab_workers", worker + 1)
            if worker == 0 and not study.get_trials(deepcopy=False):
                study.set_metric_names(metrics)  # so that dashboards and `grpo_lab.compare` can label values
                for params in s.enqueue or []:
                    study.enqueue_trial(params)
        # Each worker its own sampler seed, so that concurrent workers do not propose the same points.
        sampler, pruner = s.sampler, s.pruner
        seed = None if sampler.get("seed") is None else int(sampler["seed"]) + worker
        study.sampler = build_sampler(sampler, seed)
        # What a trial's job gets to build the same pruner; None: its trials are not pruned.
        pruner = None if multi or not prunes(pruner) else pruner
        study.pruner = build_pruner(pruner)
        if multi:
            log.info("Multi-objective sweep (%s): trials run without pruning.", ", ".join(metrics))
        log.info(
            "Study %r in %s: target %d finished trials, %d at a time (worker %d, sampler seed %s).",
            s.study_name,
            redact(storage.url),
            s.n_trials,
            s.n_jobs,
            worker,
            seed,
        )
        return study, worker, pruner

    def _report(self, plan: Plan, ranking: Ranking, kept: list) -> None:
        """The end of the sweep: the trials table, best.yaml, the best trial(s) and how to run them again."""
        from grpo_lab.sweep import confirm
        from grpo_lab.sweep.report import trials_table, write_best

        s, study, url, metrics = self.settings, plan.study, plan.url, plan.metrics
        print(f"\n== grpo_lab sweep `{s.study_name}` ({redact(url)}) ==", flush=True)
        print(trials_table(study, metrics, ranking), flush=True)
        if ranking.configs:
            print(f"\nConfirmation runs ({metrics[0]}, mean over seeds, 95% t-interval):", flush=True)
            print(confirm.table(ranking), flush=True)
            print(confirm.verdict(ranking), flush=True)
        best = write_best(study, self.sweep_dir / BEST_FILE, metrics=metrics, storage=redact(url), ranking=ranking)
        if best is not None:
            label = "Pareto-optimal trials" if len(metrics) > 1 else "Best trial"
            tie = f", tied with {', '.join('#' + str(e.trial) for e in ranking.tied)}" if ranking.tied else ""
            if ranking.one_seed:  # every trial is tied: say why, not the list
                tie = " (best on its one seed, which cannot tell configs apart: confirm.top_k re-runs the best)"
            print(f"\n{label}: {', '.join('#' + str(e.trial) for e in ranking.best)}{tie}  (details in {best})")
            for entry in ranking.best[:5]:
                print(f"  #{entry.trial}: {redact(entry.command)}")
        self._report_test(plan, ranking)
        if kept:
            print(f"Kept models (keep_models={s.keep_models}): " + ", ".join(str(p) for p in kept), flush=True)
        print(f"Dashboard: optuna-dashboard {redact(url)}", flush=True)  # the user knows the password

    def _report_test(self, plan: Plan, ranking: Ranking) -> None:
        """What the sweep chose, graded on the test part now that it is chosen (grpo_lab.run.test_report): every
        seed's run of a confirmed config, else the best trial; `test.json` beside best.yaml."""
        from grpo_lab.run.test_report import answer
        from grpo_lab.sweep.report import chosen_runs

        runs = chosen_runs(plan.study, ranking)
        if not runs:
            return
        if any(t.state.name == "RUNNING" for t in plan.study.get_trials(deepcopy=False)):
            print("\nTest part: graded by the worker that ends the sweep (another still runs trials).", flush=True)
            return
        chosen_by = plan.metrics[0] + (" (mean over seeds)" if ranking.configs else "")
        if lines := answer(runs, chosen_by, self.sweep_dir):
            print(redact("\n".join(lines)), flush=True)

    # ----------------------------------------------------------------------------------------- trials
    def _trial_overrides(self, plan: Plan, trial: Any, trial_id: int, arguments_keys: set[str]) -> list[str]:
        from grpo_lab.config.overrides import render
        from grpo_lab.sweep import confirm

        s = self.settings
        confirming = confirm.is_confirmation(trial)
        info = {
            "study": s.study_name,
            "storage": share(plan.url),  # masked; jobs get the real URL back with redact.reveal
            "number": trial.number,
            "id": trial_id,
            "pruner": None if confirming else plan.pruner,  # a pruned seed would bias the config's mean
        }
        extra = [
            render("++trial", info),
            render("hydra.sweep.dir", str(self.sweep_dir)),
            f"hydra.sweep.subdir={trial_name(trial.number)}",
        ]
        if len(s.objectives) == 1:  # the job prunes on what tracks the sweep's objective (sweep.trial)
            extra += [render("++objective.metric", s.objectives[0]["metric"])]
            extra += [render("++objective.direction", s.objectives[0]["direction"])]
        if "logger.group" not in arguments_keys:
            extra.append(render("++logger.group", s.study_name))
        if "logger.name" not in arguments_keys:
            extra.append(f"++logger.name={trial_name(trial.number)}")
        if s.keep_models == "none" and "output.save_model" not in arguments_keys:
            extra.append("++output.save_model=false")
        if confirming:
            tags = [*OmegaConf.to_container(self.config.logger.tags), "confirm"]
            extra += [f"++seed={trial.user_attrs[confirm.SEED]}", render("++logger.tags", tags)]
        return [*plan.space.overrides_for(trial.params), *extra]

    def _run_batch(self, plan: Plan, trials: list) -> None:
        from grpo_lab.config.overrides import as_typed, key
        from grpo_lab.evaluation.ranking import rerun_command

        space = plan.space
        keys = {key(o) for o in space.fixed}
        with interrupts.deferred():  # the study's database: see grpo_lab.interrupts.deferred
            ids = [plan.storage.trial_id(plan.study.study_name, t.number) for t in trials]
            batch = [self._trial_overrides(plan, t, i, keys) for t, i in zip(trials, ids, strict=True)]
            for trial, overrides in zip(trials, batch, strict=True):
                trial.set_user_attr("overrides", redact(overrides))
                trial.set_user_attr("worker", plan.worker)
                trial.set_user_attr("command", redact(rerun_command(overrides)))
                shown = " ".join(as_typed(o) for o in space.overrides_for(trial.params)[len(space.fixed) :])
                log.info("Trial %d: %s", trial.number, redact(shown))
        with plan.storage.heartbeats(ids):
            returns = self.launcher.launch(batch, initial_job_idx=self.job_idx)
        self.job_idx += len(batch)
        with interrupts.deferred():
            for trial, ret in zip(trials, returns, strict=True):
                self._tell(plan.study, trial, ret, plan.metrics)

    def _tell(self, study: Any, trial: Any, ret: Any, metrics: list[str]) -> None:
        import optuna
        from optuna.trial import TrialState

        if ret.hydra_cfg is not None:
            trial.set_user_attr("run_dir", str(ret.hydra_cfg.hydra.runtime.output_dir))
        value, error = _outcome(ret)
        if error is None:
            run_metrics = getattr(value, "metrics", None)
            try:
                if run_metrics is not None:
                    values = [float(run_metrics.get(m, float("nan"))) for m in metrics]
                elif len(metrics) == 1:
                    values = [float(value)]
                else:
                    raise TypeError(f"the task returned {type(value).__name__}, not one value per objective")
            except (TypeError, ValueError) as e:
                return self._fail(study, trial, f"{type(e).__name__}: {e}")
            bad = [m for m, v in zip(metrics, values, strict=True) if not math.isfinite(v)]
            if bad:
                return self._fail(study, trial, f"objective {', '.join(bad)} is {values[metrics.index(bad[0])]}")
            study.tell(trial, values)
            log.info("Trial %d finished: %s", trial.number, dict(zip(metrics, values, strict=True)))
            return None
        if isinstance(error, interrupts.JobInterrupted):  # its worker was signalled: recorded FAIL, interrupted
            return self._interrupted(study, [trial], error)
        if isinstance(error, KeyboardInterrupt):  # the sweep stops: _run_until records it
            return None
        if isinstance(error, optuna.TrialPruned):
            trial.set_user_attr("pruned", redact(str(error)))
            study.tell(trial, state=TrialState.PRUNED)
            log.info("Trial %d pruned: %s", trial.number, error)
            return None
        return self._fail(study, trial, f"{type(error).__name__}: {error}")

    def _interrupted(self, study: Any, trials: list, error: BaseException) -> None:
        """Record the batch's unfinished trials FAIL, reason `interrupted by SIGINT at step N`: FAIL trials do
        not count towards n_trials, so the same command again resumes the study."""
        from optuna.trial import TrialState

        from grpo_lab import interrupts
        from grpo_lab.files import RunFolderError
        from grpo_lab.run.folder import RunFolder

        name = interrupts.signal_name(interrupts.signal_of(error) or 2)
        states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
        for trial in trials:
            if states.get(trial.number) != TrialState.RUNNING:
                continue  # told already
            run_dir = self.sweep_dir / trial_name(trial.number)
            where = ""
            try:
                step = (RunFolder(run_dir).read_metrics() or {})["interrupted"]["step"]
                where = f" at step {step}"
            except (RunFolderError, KeyError, TypeError):
                pass
            trial.set_user_attr("run_dir", str(run_dir))
            self._fail(study, trial, f"interrupted by {name}{where}")

    @staticmethod
    def _fail(study: Any, trial: Any, reason: str) -> None:
        from optuna.trial import TrialState

        reason = redact(reason)
        trial.set_user_attr("error", reason[:2000])
        study.tell(trial, state=TrialState.FAIL)
        log.warning("Trial %d failed: %s", trial.number, reason.splitlines()[0] if reason else "")

    def _check_failures(self, study: Any) -> None:
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        failed = [t for t in trials if t.state == TrialState.FAIL]
        ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
        limit = self.settings.max_failure_fraction
        if len(ended) >= max(3, self.settings.n_jobs) and len(failed) / len(ended) > limit:
            reasons = collections.Counter(t.user_attrs.get("error", "?").splitlines()[0][:300] for t in failed)
            common, count = reasons.most_common(1)[0]
            raise SweepError(
                f"{len(failed)} of {len(ended)} trials failed (more than max_failure_fraction={limit}); "
                f"the most common error ({count}x): {common}"
            )
