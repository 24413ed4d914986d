"""From the overrides a user types to a checked job: grpo_lab's settings, their checks, and the job spec.

Owns: each setting's declaration (type, range, choices: ``schema.py``; TRL's fields read from TRL: ``trl_fields.py``,
with the ranges TRL does not declare: ``limits.py``), every check as one ordered list of rules (``rules.py``), the
settings in TRL's, transformers' and peft's terms (``trl.py``), the metrics' names (``metrics.py``), reward schedules
(``schedule.py``), the sweeper's settings and its samplers and pruners (``sweep.py``, ``samplers.py``), parsing and
rendering overrides (``overrides.py``), one way to report a bad value (``problems.py``), and the job spec built from
them all (``job.py``). May import: ``grpo_lab.errors``, ``grpo_lab.paths``, ``grpo_lab.redact``; TRL, transformers and
peft only inside the functions that need them. Nothing else of grpo_lab imports lower than this package.

Importing the package is light (for ``--help`` and ``--cfg``): its names load their module when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "schema": (
        "ArithmeticData CodeJsonlData DataConfig EvalConfig GraderConfig Gsm8kData HealthConfig HumanEvalData "
        "JsonlData LauncherConfig LoggerConfig LoraConfig ModelConfig Objective OptimizerConfig OutputConfig "
        "RewardConfig RewardFunction RunConfig SandboxConfig TrialConfig VllmServerConfig"
    ),
    "job": "JobSpec build_job check_all load parse",
    "metrics": "EVAL_EXTRA_METRICS check_metric_name eval_metric_names pass_k_name",
    "trl": "grpo_config grpo_kwargs lora_config user_key",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo_lab.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"grpo_lab.config.{module}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
