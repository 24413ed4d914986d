"""The test part of what a grid or a sweep chose, graded after choosing: the one number of its answer no choice read.

A grid's and a sweep's jobs grade validation only (grpo_lab.data: validation chooses, test reports). Once the answer
is decided, the winner's kept model (`model/` in its run folder) is graded on the test part of its own data, with its
own evaluation settings and graders; for a config confirmed over seeds, each seed's run is, and the answer reports
the mean over seeds with its 95% t-interval. The graded items go to `test_after.jsonl` in each run folder; the
run's metrics.json is left as the run wrote it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.config import JobSpec
from grpo_lab.errors import one_line
from grpo_lab.evaluation.stats import seed_mean
from grpo_lab.run.folder import RunFolder

log = logging.getLogger("grpo_lab")

FILE = "test_after"  # <run folder>/test_after.jsonl: the graded items


@dataclass
class TestReport:
    """Each graded run's test metrics (`test_after/<grader>` ...); the runs that could not be graded, and why."""

    chosen_by: str  # the validation metric the choice read
    graded: dict[str, dict[str, float]] = field(default_factory=dict)  # run folder -> its test_after/* metrics
    missing: dict[str, str] = field(default_factory=dict)  # run folder -> why it was not graded

    def lines(self) -> list[str]:
        """The answer's block: each grader's test result (and, over several seeds, their mean), and that the
        choice did not read it."""
        lines = [f"Test part, graded after choosing (the choice read {self.chosen_by}, never these items):"]
        graders = list(
            dict.fromkeys(k.removesuffix("_ci_low") for m in self.graded.values() for k in m if k.endswith("_ci_low"))
        )
        for run, m in self.graded.items():
            n = int(m.get(f"{FILE}/num_samples", 0))
            shown = ", ".join(
                f"{k.partition('/')[2]} {m[k]:.1%} [{m[k + '_ci_low']:.0%}, {m[k + '_ci_high']:.0%}]"
                for k in graders
                if k in m
            )
            lines.append(f"  {shown} on {n} items  ({run})")
        if len(self.graded) > 1:
            for key in graders:
                mean = seed_mean([m[key] for m in self.graded.values() if key in m])
                lines.append(
                    f"  {key.partition('/')[2]}: mean over {mean.n} seeds {mean.mean:.1%} "
                    f"[{mean.ci_low:.1%}, {mean.ci_high:.1%}] (95% t-interval)"
                )
        lines += [f"  not graded: {run}: {why}" for run, why in self.missing.items()]
        return lines if len(lines) > 1 else []

    def as_json(self) -> dict[str, Any]:
        return {"chosen_by": self.chosen_by, "graded": self.graded, "missing": self.missing}


def grade(run_dirs: list[Path], chosen_by: str) -> TestReport:
    """Grade the test part of each run's kept model (never raises for a run that cannot be graded: it is listed)."""
    report = TestReport(chosen_by)
    for run_dir in (Path(d).resolve() for d in run_dirs):
        try:
            report.graded[str(run_dir)] = _grade_one(RunFolder(run_dir))
        except _NotGradable as e:
            report.missing[str(run_dir)] = str(e)
        except Exception as e:  # its data or model cannot be loaded again: the others are still graded
            report.missing[str(run_dir)] = one_line(e)
    return report


def answer(run_dirs: list[Path], chosen_by: str, out_dir: Path) -> list[str]:
    """The end of a grid's or a sweep's answer: grade what it chose, write `test.json` into `out_dir`, and the lines
    to print (a blank one first; none when nothing was graded). Never raises: the answer stands without its test
    part, with one line saying why."""
    from grpo_lab import files

    try:
        report = grade(run_dirs, chosen_by)
        files.write_json(out_dir / "test.json", report.as_json())
    except Exception as e:  # the data or the model cannot be loaded again, the folder cannot be written
        return ["", f"Test part not graded: {one_line(e)}"]
    lines = report.lines()
    return ["", *lines] if lines else []


class _NotGradable(Exception):
    pass


def _grade_one(folder: RunFolder) -> dict[str, float]:
    from grpo_lab import data as data_mod
    from grpo_lab import models
    from grpo_lab.evaluation.evaluate import evaluate
    from grpo_lab.evaluation.graders import build as build_graders

    if not folder.job_file.is_file():
        raise _NotGradable("no job.json (a run of an earlier release)")
    adapter = (folder.model_dir / "adapter_config.json").is_file()
    if not (folder.model_dir / "config.json").is_file() and not adapter:
        raise _NotGradable("it kept no model (output.save_model=false, or the sweep's keep_models deleted it)")
    spec = JobSpec.from_json(json.loads(folder.job_file.read_text()))
    cfg = spec.run
    if not cfg.eval.test:
        raise _NotGradable("its eval.test=false")
    test = data_mod.load_datasets(cfg.data).test
    graders = build_graders(cfg.eval.graders)
    if adapter:  # a LoRA run saved its adapter: the base model it trained, with the adapter on it
        from peft import PeftModel

        model, tokenizer = models.load_model_and_tokenizer(cfg.model, spec.cache_dir)
        model = PeftModel.from_pretrained(model, str(folder.model_dir))
    else:
        kept = cfg.model.model_copy(update={"name_or_path": str(folder.model_dir)})
        model, tokenizer = models.load_model_and_tokenizer(kept, spec.cache_dir)
    result = evaluate(model, tokenizer, test, cfg.eval, desc="test after choosing", graders=graders)
    folder.write_eval(FILE, result.samples)
    return result.metrics(FILE)


__all__ = ["FILE", "TestReport", "answer", "grade"]
