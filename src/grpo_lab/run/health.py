"""Training health: the rules that watch reward, reward_std, KL, completion length and vLLM, live and after the fact.

A GRPO run is worth watching on four numbers, and each has a failure that burns GPU-hours quietly:
- a NaN/inf loss, grad_norm or reward (diverged: e.g. a reward returning inf turns advantages into NaN);
- `kl` above ~0.1 for a small model, for several logs (the policy runs away from the reference);
- no learning signal: `reward_std` ~ 0 or most groups with zero reward spread (every completion of a prompt
  scores the same, so GRPO's advantages and gradient are zero);
- the mean completion length jumping away from its rolling median (collapse, or rambling);
- `completions/clipped_ratio` near 1 (completions are cut off at max_completion_length);
- with vLLM generating, its log-probs of the sampled tokens far from the trainer's (stale weights: the
  completions come from another policy than the one trained);
- the training reward rising beyond its noise while a validation grader falls beyond its own, over the
  evaluations during training (`eval.every_n_steps`): the policy learns what the reward pays for and not what the
  task asks (reward hacking; TRL issue 2959: the reward reached 1.0 while accuracy collapsed).

:class:`Monitor` is a state machine over the trainer's log rows: training feeds it live (grpo_lab.run.train,
on the main process; a `stop` decision is broadcast to all ranks like pruning), and `compare` replays a
recorded history through it for runs recorded before events were (:func:`replay`). One owner of the rules.
Each rule fires once per run; its action (`health.<rule>`) is warn, stop or ignore.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from grpo_lab.config import HealthConfig

# rule -> the short flag compare's `health` column shows
FLAGS = {
    "nonfinite": "nan",
    "kl": "kl-high",
    "no_signal": "no-signal",
    "length": "length-jump",
    "clipped": "clipped",
    "vllm_mismatch": "vllm-mismatch",
    "divergence": "reward-vs-validation",
}
_LENGTH = "completions/mean_length"
# TRL logs these only when vLLM generates (and vllm_importance_sampling_correction is on, its default).
_LOGP_DIFF = "sampling/sampling_logp_difference/mean"
_IS_RATIO = "sampling/importance_sampling_ratio/mean"
_WINDOW = 10  # logs in the rolling median of the completion length
_MIN_EVALS = 3  # evaluations during training before the divergence rule may judge


@dataclass(frozen=True)
class Event:
    rule: str  # a key of FLAGS
    step: int
    action: str  # warn | stop
    message: str  # what happened and what to change
    values: dict[str, float]

    @property
    def flag(self) -> str:
        return FLAGS[self.rule]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    """A logged value as a float (TRL may log nan as a string in some paths); None if not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf"):
        return float(value)
    return None


class Monitor:
    """Feed it every trainer log (`observe`); it returns the events that fire at that step."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.events: list[Event] = []
        self._streak = {"kl": 0, "no_signal": 0, "clipped": 0, "vllm_mismatch": 0}
        self._lengths: list[float] = []
        # Whether any log so far showed a learning signal (reward spread within groups): a trial that never
        # had one is dead, one whose signal faded for a few logs (e.g. 1 prompt a step, all right) is not.
        self.signal_seen = False
        # The divergence rule's inputs: each logged training reward, and each evaluation during training as
        # its step and, per grader, which validation items passed (the same items every time).
        self._rewards: list[tuple[int, float]] = []
        self._evals: list[tuple[int, dict[str, list[bool]]]] = []
        self._judged = 0  # evaluations the divergence rule has judged

    @property
    def stop(self) -> Event | None:
        """The first event whose action is `stop` (training should end), if any."""
        return next((e for e in self.events if e.action == "stop"), None)

    def observe(self, step: int, logs: dict[str, Any]) -> list[Event]:
        if (reward := _number(logs.get("reward"))) is not None and math.isfinite(reward):
            self._rewards.append((step, reward))
        rules = (self._nonfinite(step, logs), *self._streaks(step, logs), self._length(step, logs), self._divergence())
        fired = [e for e in rules if e]
        self.events += fired
        return fired

    def observe_eval(self, step: int, outcomes: dict[str, list[bool]]) -> None:
        """An evaluation during training (or before it: step 0): per grader, whether each validation item passed.
        Judged with the next log, which carries the reward of the evaluation's step."""
        self._evals.append((step, outcomes))
        if step == 0:
            self._judged = len(self._evals)  # a baseline: nothing to judge yet

    # -------------------------------------------------------------------------------------- the rules
    def _fire(self, rule: str, step: int, message: str, values: dict[str, float]) -> Event | None:
        action = getattr(self.cfg, rule)
        if action == "ignore" or any(e.rule == rule for e in self.events):
            return None
        return Event(rule, step, action, message, values)

    def _nonfinite(self, step: int, logs: dict[str, Any]) -> Event | None:
        bad = {k: v for k in ("loss", "grad_norm", "reward") if (v := _number(logs.get(k))) is not None}
        bad = {k: v for k, v in bad.items() if not math.isfinite(v)}
        if not bad:
            return None
        what = ", ".join(f"{k} = {v}" for k, v in bad.items())
        return self._fire(
            "nonfinite",
            step,
            f"{what}: the run has diverged. Lower `lr` (or `optimizer.max_grad_norm`), and check that every reward "
            "returns finite numbers (None marks a reward as not applicable to a sample).",
            bad,
        )

    def _streaks(self, step: int, logs: dict[str, Any]) -> list[Event | None]:
        """The rules that must hold for `health.patience` logs in a row (one noisy log is not a trend)."""
        c = self.cfg
        kl, std = _number(logs.get("kl")), _number(logs.get("reward_std"))
        zero_std, clipped = _number(logs.get("frac_reward_zero_std")), _number(logs.get("completions/clipped_ratio"))
        reward = _number(logs.get("reward"))
        logp_diff, is_ratio = _number(logs.get(_LOGP_DIFF)), _number(logs.get(_IS_RATIO))
        holds = {
            "kl": kl is not None and kl > c.kl_max,
            "no_signal": (std is not None and std < c.reward_std_min)
            or (zero_std is not None and zero_std > c.frac_zero_std_max),
            "clipped": clipped is not None and clipped >= c.clipped_max,
            "vllm_mismatch": _vllm_mismatch(logp_diff, is_ratio, c),
        }
        for rule, now in holds.items():
            self._streak[rule] = self._streak[rule] + 1 if now else 0
        self.signal_seen |= (std is not None or zero_std is not None) and not holds["no_signal"]
        due = {rule for rule, n in self._streak.items() if n >= c.patience}
        # Each rule's message and the values it quotes, worded only when the rule fires.
        words = {
            "kl": lambda: (
                f"kl = {kl:.3g} above health.kl_max = {c.kl_max} for {c.patience} logs: the policy drifts from the "
                "reference model. Lower `lr`, or raise `beta` (the KL coefficient).",
                {"kl": kl},
            ),
            "no_signal": lambda: (
                _no_signal(reward, std, zero_std, c.patience),
                _present(reward=reward, reward_std=std, frac_reward_zero_std=zero_std),
            ),
            "clipped": lambda: (
                f"completions are cut off: {100 * clipped:.0f}% hit max_completion_length for {c.patience} logs. "
                "Raise `trainer.max_completion_length` (and `eval.max_new_tokens`).",
                {"completions/clipped_ratio": clipped},
            ),
            "vllm_mismatch": lambda: (
                _vllm_message(logp_diff, is_ratio, c),
                _present(**{_LOGP_DIFF: logp_diff, _IS_RATIO: is_ratio}),
            ),
        }
        return [self._fire(rule, step, *words[rule]()) if rule in due else None for rule in holds]

    def _divergence(self) -> Event | None:
        """The reward rose beyond its noise (Welch's t-test, the reward logs up to the grader's best evaluation so
        far against those up to the latest one) while a grader fell beyond its own (McNemar's exact test on the
        same validation items, the best evaluation so far against the latest, Bonferroni-corrected for picking the
        best of several): not a raw drop, two real changes in opposite directions. Judged once per evaluation, from
        the third on (the one before training counts)."""
        from grpo_lab.evaluation.stats import ALPHA, paired_change, welch_p

        if len(self._evals) == self._judged:
            return None
        self._judged = len(self._evals)
        if len(self._evals) < _MIN_EVALS:
            return None
        (step, now), earlier = self._evals[-1], self._evals[:-1]
        for name, passed in now.items():
            runs = [(s, o[name]) for s, o in earlier if len(o.get(name, ())) == len(passed) and passed]
            if not runs:
                continue
            best_step, best = max(runs, key=lambda r: sum(r[1]) / len(r[1]))  # the first best: the earliest
            change = paired_change(best, passed)
            # The best of len(runs) evaluations is itself a pick: Bonferroni over them keeps the alarm's false
            # positives at ALPHA however many evaluations a run makes.
            if not (change.change < 0 and change.p_value * len(runs) < ALPHA):
                continue
            then, latest = self._window(best_step), self._window(step)
            if len(then) < 2 or len(latest) < 2 or _mean(latest) <= _mean(then):
                continue
            if not (p_reward := welch_p([r for _, r in then], [r for _, r in latest])) < ALPHA:
                continue
            r0, r1 = _mean(then), _mean(latest)
            return self._fire(
                "divergence",
                step,
                f"the training reward rose from {r0:.3g} (steps {then[0][0]}-{then[-1][0]}) to {r1:.3g} (steps "
                f"{latest[0][0]}-{latest[-1][0]}; Welch p = {p_reward:.2g}) while validation `{name}` fell from "
                f"{change.before:.1%} at step "
                f"{best_step} to {change.after:.1%} (the same {change.n} items: {change.lost} lost, {change.gained} "
                f"gained, McNemar p = {change.p_value:.2g}): the policy learns what the reward pays for, not what "
                "the grader checks (reward hacking). Read the completions (W&B's completions table, or "
                "`trainer.log_completions=true`), fix the reward, or train for fewer steps.",
                {"reward_then": r0, "reward_now": r1, f"eval/{name}_best": change.before, f"eval/{name}": change.after},
            )
        return None

    def _window(self, step: int) -> list[tuple[int, float]]:
        """The reward logs of the evaluation interval that ends at `step` (back to the evaluation before it); for
        the evaluation before training (step 0), the first interval's: the reward as training started."""
        if step == 0:
            step = min((s for s, _ in self._evals if s > 0), default=step)
        start = max((s for s, _ in self._evals if s < step), default=0)
        return [(s, r) for s, r in self._rewards if start < s <= step]

    def _length(self, step: int, logs: dict[str, Any]) -> Event | None:
        length = _number(logs.get(_LENGTH))
        if length is None or not math.isfinite(length):
            return None
        history, self._lengths = self._lengths[-_WINDOW:], [*self._lengths, length]
        if len(history) < 3:
            return None
        median, ratio = statistics.median(history), self.cfg.length_ratio
        if median <= 0 or median / ratio <= length <= median * ratio:
            return None
        way = "collapsed" if length < median else "jumped"
        return self._fire(
            "length",
            step,
            f"the mean completion length {way} to {length:.0f} tokens from a median of {median:.0f} over the last "
            f"{len(history)} logs (health.length_ratio = {ratio}): look at the completions (W&B's table, or "
            "`trainer.log_completions=true`); a collapse often follows a too-high `lr`.",
            {_LENGTH: length, "median": median},
        )


def _mean(logs: list[tuple[int, float]]) -> float:
    return statistics.fmean(r for _, r in logs)


def _vllm_mismatch(logp_diff: float | None, is_ratio: float | None, cfg: HealthConfig) -> bool:
    # Comparisons, not `not min <= x <= max`: a NaN (nothing measured) never counts as a mismatch.
    if logp_diff == 0 and is_ratio == 0:  # TRL logs both as 0 when no completion token was scored
        return False
    return (logp_diff is not None and logp_diff > cfg.logp_diff_max) or (
        is_ratio is not None and (is_ratio < cfg.is_ratio_min or is_ratio > cfg.is_ratio_max)
    )


def _vllm_message(logp_diff: float | None, is_ratio: float | None, cfg: HealthConfig) -> str:
    seen = ", ".join(f"{k} = {v:.3g}" for k, v in _present(**{_LOGP_DIFF: logp_diff, _IS_RATIO: is_ratio}).items())
    return (
        f"vLLM's log-probs of the sampled tokens disagree with the trainer's for {cfg.patience} logs ({seen}; "
        f"health.logp_diff_max = {cfg.logp_diff_max}, IS ratio band [{cfg.is_ratio_min}, {cfg.is_ratio_max}]): "
        "the completions come from other weights than the ones trained. Check that vLLM's weights are synced "
        "to the policy after each step (a stale vLLM model measures ~0.3) and that vLLM and the trainer use the "
        "same dtype (`model.dtype` against the checkpoint's, which vLLM loads); "
        "`trainer.vllm_importance_sampling_correction` (TRL's default: on) corrects a small gap, not this one."
    )


def _present(**values: float | None) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}


def _no_signal(reward: float | None, std: float | None, zero_std: float | None, patience: int) -> str:
    seen = ", ".join(
        f"{k} = {v:.3g}" for k, v in _present(reward=reward, reward_std=std, frac_reward_zero_std=zero_std).items()
    )
    return f"no learning signal for {patience} logs ({seen}): {no_signal_diagnosis(reward)}."


def no_signal_diagnosis(mean_reward: float | None) -> str:
    """Why GRPO has nothing to learn from when the completions of each prompt score alike, and the likely fixes.
    Judged on the mean weighted total reward (TRL's logged `reward`), which both the live rule and
    `check_rewards` have, so that they give the same diagnosis for the same rewards."""
    if mean_reward is not None and abs(mean_reward) < 1e-9:
        return (
            "every reward is 0, so the expected format is never produced: add worked examples (`data.num_shots=1`), "
            "raise `trainer.max_completion_length`, or use easier problems"
        )
    return (
        "every completion of a prompt scores the same: raise `trainer.temperature` or `num_generations`, "
        "or use a reward that grades more finely"
    )


def replay(rows: list[dict[str, Any]], cfg: HealthConfig | None = None) -> list[Event]:
    """The events a run's recorded history (history.jsonl rows) gives under `cfg` (grpo_lab's defaults)."""
    monitor = Monitor(cfg or default_config())
    for row in rows:
        monitor.observe(int(row.get("step", 0)), row)
    return monitor.events


def default_config() -> HealthConfig:
    """conf/health/default.yaml, for runs whose config does not say (recorded before health existed)."""
    from omegaconf import OmegaConf

    from grpo_lab.paths import CONF_DIR

    return HealthConfig.model_validate(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "health" / "default.yaml")))


__all__ = ["FLAGS", "Event", "Monitor", "default_config", "no_signal_diagnosis", "replay"]
