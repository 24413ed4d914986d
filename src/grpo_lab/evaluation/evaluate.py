"""Held-out evaluation: greedy completions graded by the run's graders (`eval.graders`, grpo_lab.evaluation.graders).

Each grader's metric is the share of gradable items that pass, with its 95% Wilson interval and, between the
evaluations before and after training on the same items, the paired change; `mean_length` is the mean
completion length in tokens. With `eval.samples=n`, each item is also sampled n times and graded: pass@k for each k
of `eval.pass_k` (the unbiased estimator, grpo_lab.evaluation.stats.pass_at_k), its mean over items with a 95%
t-interval, and the paired change of those per-item values before -> after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.config import EvalConfig, pass_k_name
from grpo_lab.evaluation.graders import Grader, as_completions, columns, item_value
from grpo_lab.evaluation.stats import paired_change, pass_at_k, seed_mean, wilson


@dataclass(frozen=True)
class EvalResult:
    shares: dict[str, float]  # grader name -> share of the gradable items that pass (nan: none gradable)
    num_samples: int
    mean_length: float  # completion tokens
    # One per item, in the eval set's order: item, question, answer, completion, and 1/0/None per grader (and, with
    # eval.samples, `sampled`: how many of the item's samples passed each grader).
    samples: list[dict[str, Any]]
    # eval.samples: pass@k metric name (grpo_lab.evaluation.evaluate.pass_k_name) -> per gradable item, its pass@k
    # estimate.
    pass_k: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def scores(self) -> dict[str, float]:
        """The metrics an objective can name: what a periodic evaluation reports."""
        means = {name: seed_mean(values).mean for name, values in self.pass_k.items()}
        return {**self.shares, **means, "mean_length": self.mean_length}

    def outcomes(self, name: str) -> list[bool]:
        """Per gradable item, whether it passed grader `name`."""
        values = (item_value(s, name) for s in self.samples)
        return [bool(v) for v in values if v is not None]

    def every_outcome(self) -> dict[str, list[bool]]:
        """:meth:`outcomes` of every grader (what the divergence health rule compares item by item)."""
        return {name: self.outcomes(name) for name in self.shares}

    def metrics(self, prefix: str) -> dict[str, float]:
        """The scores, their 95% Wilson intervals and the sample count as metrics.json keys, e.g.
        `eval_after/accuracy`, `eval_after/accuracy_ci_low`, `eval_after/accuracy_ci_high`."""
        out = {f"{prefix}/{k}": v for k, v in self.scores().items()}
        for name in self.shares:
            outcomes = self.outcomes(name)
            out[f"{prefix}/{name}_ci_low"], out[f"{prefix}/{name}_ci_high"] = wilson(sum(outcomes), len(outcomes))
        for name, values in self.pass_k.items():  # a mean of per-item estimates: Student's t over the items, in [0, 1]
            interval = seed_mean(values)
            out[f"{prefix}/{name}_ci_low"] = max(0.0, interval.ci_low)
            out[f"{prefix}/{name}_ci_high"] = min(1.0, interval.ci_high)
        return out | {f"{prefix}/num_samples": float(self.num_samples)}


def change_metrics(before: EvalResult, after: EvalResult, prefix: str = "eval_change") -> dict[str, float]:
    """after - before on the same items: `eval_change/accuracy` (`test_change/...` for the test part) with its
    paired 95% interval, the exact McNemar p-value and the counts of items gained and lost."""
    out: dict[str, float] = {}
    for name in after.shares:
        pairs = [(item_value(b, name), item_value(a, name)) for b, a in zip(before.samples, after.samples, strict=True)]
        pairs = [(b, a) for b, a in pairs if b is not None and a is not None]  # items without a reference
        change = paired_change([bool(b) for b, _ in pairs], [bool(a) for _, a in pairs])
        out |= {
            f"{prefix}/{name}": change.change,
            f"{prefix}/{name}_ci_low": change.ci_low,
            f"{prefix}/{name}_ci_high": change.ci_high,
            f"{prefix}/{name}_p_value": change.p_value,
            f"{prefix}/{name}_gained": float(change.gained),
            f"{prefix}/{name}_lost": float(change.lost),
        }
    for name, after_values in after.pass_k.items():  # the same items in the same order, before and after
        if len(before.pass_k.get(name, ())) == len(after_values):
            change = seed_mean([a - b for a, b in zip(after_values, before.pass_k[name], strict=True)])
            out |= {
                f"{prefix}/{name}": change.mean,
                f"{prefix}/{name}_ci_low": change.ci_low,
                f"{prefix}/{name}_ci_high": change.ci_high,
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
) -> Iterator[list[tuple[str, int]]]:
    """(completion text, completion token count) for each conversation, batch by batch (a caller may stop
    between two), with a progress bar: greedy, or with `sampling` (generate()'s do_sample, temperature,
    num_return_sequences... : then each prompt's completions follow one another)."""
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
    graders: Sequence[Grader],
    order: list[int] | None = None,
    watch: Callable[[list[dict[str, Any]]], bool] | None = None,
    sampled: bool = True,
) -> EvalResult:
    """Greedy completions of every item, graded. `order`: evaluate the items in this order (a per-item pruner
    wants them shuffled per trial); `watch`: called with each batch's graded samples, stops the evaluation
    when it returns True (the result then holds the items evaluated so far). Samples come back in item order.
    `sampled`: also pass@k, when `cfg.samples` is set (a periodic evaluation leaves it out).
    """
    order = list(range(len(dataset))) if order is None else order
    data_columns = columns(dataset)
    prompts = list(dataset["prompt"])
    samples: list[dict[str, Any]] = []
    lengths: list[int] = []
    batches = generate(
        model,
        tokenizer,
        [prompts[i] for i in order],
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        desc=desc,
    )
    for batch in batches:
        items = order[len(samples) : len(samples) + len(batch)]
        graded = _grade(graders, items, [text for text, _ in batch], [prompts[i] for i in items], data_columns)
        samples += graded
        lengths += [n for _, n in batch]
        if watch is not None and watch(graded):
            batches.close()  # leaves generation, restoring the model's training mode
            sampled = False  # the pruner stopped it: no pass@k for a trial that ends here
            break
    samples.sort(key=lambda s: s["item"])
    pass_k = {}
    if sampled and cfg.samples is not None and samples and graders:
        pass_k = _sample_pass_k(model, tokenizer, dataset, cfg, desc, graders, samples)
    return EvalResult(
        shares={g.name: _share([s[g.name] for s in samples]) for g in graders},
        num_samples=len(samples),
        mean_length=sum(lengths) / len(lengths) if lengths else 0.0,
        samples=samples,
        pass_k=pass_k,
    )


def _sample_pass_k(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    cfg: EvalConfig,
    desc: str,
    graders: Sequence[Grader],
    samples: list[dict[str, Any]],
) -> dict[str, list[float]]:
    """`cfg.samples` sampled completions of each evaluated item, graded: each sample row gets `sampled` (passes per
    grader); returns the first grader's (the headline's) pass@k per-item estimates, over the items it could grade."""
    n, items = cfg.samples, [s["item"] for s in samples]
    prompts = [dataset["prompt"][i] for i in items]
    data_columns = columns(dataset)
    sampling = {"do_sample": True, "temperature": cfg.sample_temperature, "num_return_sequences": n}
    batches = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=max(1, cfg.batch_size // n),
        desc=f"{desc}, {n} samples",
        sampling=sampling,
    )
    texts = [text for batch in batches for text, _ in batch]
    repeated = [i for i in items for _ in range(n)]
    graded = _grade(graders, repeated, texts, [p for p in prompts for _ in range(n)], data_columns)
    names = [g.name for g in graders]
    for j, sample in enumerate(samples):
        own = graded[j * n : (j + 1) * n]
        sample["sampled"] = {g: None if own[0][g] is None else sum(s[g] or 0 for s in own) for g in names}
    return _pass_k(samples, names, n, cfg.pass_k)


def _pass_k(samples: list[dict[str, Any]], names: list[str], n: int, ks: Sequence[int]) -> dict[str, list[float]]:
    """The first grader's pass@k estimates per item, from each sample's `sampled` passes out of `n`."""
    first = names[0]
    out: dict[str, list[float]] = {pass_k_name(first, k, names): [] for k in ks}
    for sample in samples:
        passed = (sample.get("sampled") or {}).get(first)
        if passed is not None:
            for k in ks:
                out[pass_k_name(first, k, names)].append(pass_at_k(n, passed, k))
    return out


def read_back(samples: list[dict[str, Any]], names: list[str], mean_length: float, cfg: EvalConfig) -> EvalResult:
    """An evaluation as its `<name>.jsonl` recorded it (graded samples), for the paired change of a resumed run."""
    sampled = bool(cfg.samples) and bool(names) and any("sampled" in s for s in samples)
    return EvalResult(
        shares={name: _share([s.get(name) for s in samples]) for name in names},
        num_samples=len(samples),
        mean_length=mean_length,
        samples=samples,
        pass_k=_pass_k(samples, names, cfg.samples, cfg.pass_k) if sampled else {},
    )


def _grade(
    graders: Sequence[Grader], items: list[int], texts: list[str], prompts: list[Any], columns: dict[str, list[Any]]
) -> list[dict[str, Any]]:
    """One sample per completion: `item` (its position in the eval set, so that two runs on the same set can be
    compared item by item), its question and answer when the data has them, the completion, each grader's 1/0/None."""
    batch_columns = {c: [values[i] for i in items] for c, values in columns.items()}
    completions = as_completions(texts, prompts)
    verdicts = {g.name: g.grade(completions, prompts, batch_columns) for g in graders}
    return [
        {
            "item": item,
            **{c: batch_columns[c][k] for c in ("question", "answer") if c in batch_columns},
            "completion": text,
            **{name: values[k] for name, values in verdicts.items()},
        }
        for k, (item, text) in enumerate(zip(items, texts, strict=True))
    ]


def _share(values: list[int | None]) -> float:
    graded = [v for v in values if v is not None]
    return sum(graded) / len(graded) if graded else float("nan")
