"""Reward functions for GRPO, and the registry that turns ``reward.functions`` config into TRL rewards.

The contract (TRL's): a reward is called once per batch with keyword arguments ``completions`` (strings, or
lists of chat messages), ``prompts``, ``completion_ids``, every dataset column but ``prompt`` (here ``answer``:
a reference string, or None), ``trainer_state`` and more, so it must accept ``**kwargs``. It returns one
score per completion: an *unweighted* float, or None where it does not apply. TRL multiplies by the
configured weight and logs the mean as ``rewards/<name>/mean``.

>>> completions = [[{"role": "assistant", "content": "<reasoning>\\n6*7\\n</reasoning>\\n<answer>\\n42\\n</answer>"}]]
>>> correctness(completions, answer=["42"])
[1.0]
"""

from grpo_lab.rewards.format import regex_format, soft_format, strict_format, xmlcount
from grpo_lab.rewards.length import length
from grpo_lab.rewards.math import correctness, int_answer
from grpo_lab.rewards.registry import BUILTIN_REWARDS, NamedReward, build_rewards, resolve_target

__all__ = [
    "BUILTIN_REWARDS",
    "NamedReward",
    "build_rewards",
    "correctness",
    "int_answer",
    "length",
    "regex_format",
    "resolve_target",
    "soft_format",
    "strict_format",
    "xmlcount",
]
