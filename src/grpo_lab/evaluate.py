"""Held-out evaluation: greedy completions graded by the same functions the rewards use.

accuracy = share of completions whose <answer> equals the reference (`correctness`);
format   = share that follow the exact tag layout (`strict_format`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from grpo_lab.config import EVAL_METRICS, EvalConfig
from grpo_lab.records import EVAL_ITEM_KEYS as PROPORTIONS  # each gets its 95% interval and a paired change
from grpo_lab.rewards.format import strict_format
from grpo_lab.rewards.math import correctness
from grpo_lab.stats import paired_change, wilson


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    format: float
    num_samples: int
    mean_length: float  # completion tokens
    samples: list[dict[str, Any]]  # one per item, in the eval set's order: item, correct, format, completion

    def scores(self) -> dict[str, float]:
        """The metrics an objective can name (`config.EVAL_METRICS`): what a periodic evaluation reports."""
        return {name: getattr(self, name) for name in EVAL_METRICS}

    def outcomes(self, name: str) -> list[bool]:
        """Per item, 0/1 for `accuracy` (items with a gradable reference only) or `format`."""
        key = PROPORTIONS[name]
        return [bool(s[key]) for s in self.samples if s[key] is not None]

    def metrics(self, prefix: str) -> dict[str, float]:
        """The scores, their 95% Wilson intervals and the sample count as metrics.json keys, e.g.
        `eval_after/accuracy`, `eval_after/accuracy_ci_low`, `eval_after/accuracy_ci_high`."""
        out = {f"{prefix}/{k}": v for k, v in self.scores().items()}
        for name in PROPORTIONS:
            outcomes = self.outcomes(name)
            out[f"{prefix}/{name}_ci_low"], out[f"{prefix}/{name}_ci_high"] = wilson(sum(outcomes), len(outcomes))
        return out | {f"{prefix}/num_samples": float(self.num_samples)}


def change_metrics(before: EvalResult, after: EvalResult) -> dict[str, float]:
    """after - before on the same items: `eval_change/accuracy` with its paired 95% interval, the exact
    McNemar p-value and the counts of items gained and lost."""
    out: dict[str, float] = {}
    for name, key in PROPORTIONS.items():
        pairs = [(b[key], a[key]) for b, a in zip(before.samples, after.samples, strict=True)]
        pairs = [(b, a) for b, a in pairs if b is not None and a is not None]  # items without a reference
        change = paired_change([bool(b) for b, _ in pairs], [bool(a) for _, a in pairs])
        out |= {
            f"eval_change/{name}": change.change,
            f"eval_change/{name}_ci_low": change.ci_low,
            f"eval_change/{name}_ci_high": change.ci_high,
            f"eval_change/{name}_p_value": change.p_value,
            f"eval_change/{name}_gained": float(change.gained),
            f"eval_change/{name}_lost": float(change.lost),
        }
    return out


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[dict]],
    *,
    max_new_tokens: int,
    batch_size: int,
    desc: str,
    sampling: dict[str, Any] | None = None,
) -> list[Any]:
    """(completion text, completion token count) for each conversation, in batches, with a progress bar:
    greedy, or with `sampling` (generate()'s do_sample, temperature, num_return_sequences... : then each
    prompt's completions follow one another)."""
    batches = _batches(model, tokenizer, prompts, max_new_tokens, batch_size, desc, sampling)
    return [out for batch in batches for out in batch]


def _batches(
    model: Any,
    tokenizer: Any,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    desc: str,
    sampling: dict[str, Any] | None,
) -> Iterator[list[tuple[str, int]]]:
    """generate()'s batches one by one, so that a caller can stop between two."""
    import torch
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    try:
        for start in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch"):
            batch = prompts[start : start + batch_size]
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in batch]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    **(sampling or {"do_sample": False}),
                    pad_token_id=tokenizer.pad_token_id,
                    use_cache=True,
                )
            new_tokens = out[:, enc["input_ids"].shape[1] :]
            rows = [[t for t in row.tolist() if t != tokenizer.pad_token_id] for row in new_tokens]
            yield [(tokenizer.decode(ids, skip_special_tokens=True), len(ids)) for ids in rows]
    finally:
        model.train(was_training)


def evaluate(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    cfg: EvalConfig,
    desc: str,
    *,
    order: list[int] | None = None,
    watch: Callable[[list[dict[str, Any]]], bool] | None = None,
) -> EvalResult:
    """Greedy completions of every item, graded. `order`: evaluate the items in this order (a per-item pruner
    wants them shuffled per trial); `watch`: called with each batch's graded samples, stops the evaluation
    when it returns True (the result then holds the items evaluated so far). Samples come back in item order.
    """
    order = list(range(len(dataset))) if order is None else order
    questions, answers, prompts = (list(dataset[c]) for c in ("question", "answer", "prompt"))
    samples: list[dict[str, Any]] = []
    lengths: list[int] = []
    batches = _batches(
        model, tokenizer, [prompts[i] for i in order], cfg.max_new_tokens, cfg.batch_size, desc, sampling=None
    )
    for batch in batches:
        items = order[len(samples) : len(samples) + len(batch)]
        texts = [text for text, _ in batch]
        correct = correctness(completions=texts, answer=[answers[i] for i in items])
        formatted = strict_format(completions=texts)
        # `item`: the position in the eval set, so that two runs on the same set can be compared item by item.
        graded = [
            {"item": i, "question": questions[i], "answer": answers[i], "completion": t, "correct": c, "format": f}
            for i, t, c, f in zip(items, texts, correct, formatted, strict=True)
        ]
        samples += graded
        lengths += [n for _, n in batch]
        if watch is not None and watch(graded):
            batches.close()  # leaves generation, restoring the model's training mode
            break
    samples.sort(key=lambda s: s["item"])
    graded_correct = [s["correct"] for s in samples if s["correct"] is not None]
    return EvalResult(
        accuracy=sum(graded_correct) / len(graded_correct) if graded_correct else float("nan"),
        format=sum(s["format"] for s in samples) / len(samples) if samples else float("nan"),
        num_samples=len(samples),
        mean_length=sum(lengths) / len(lengths) if lengths else 0.0,
        samples=samples,
    )
