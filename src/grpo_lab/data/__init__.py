"""Prompt datasets: what a run trains on and is evaluated on, from every source the config names.

Owns: the rows (``prompt``, ``question``, ``answer`` and a source's own columns), the seeded split and the size caps,
reading data files. May import: ``grpo_lab.config``, ``grpo_lab.errors``, ``grpo_lab.models.hub``,
``grpo_lab.rewards.parsing`` (a reference answer is parsed by the rewards' own rules) and ``grpo_lab.sandbox``
(a code problem's tests are checked as they load).

``load_datasets(cfg)`` returns a :class:`DataParts` (train, validation, test): arithmetic, GSM8K and JSONL prompts
(``text.py``), HumanEval and code problems (``code.py``); the prompt conversations (``prompts.py``) and the
splitting (``sets.py``) are shared.
"""

from __future__ import annotations

from grpo_lab.config import CodeJsonlData, DataConfig, HumanEvalData
from grpo_lab.data.prompts import WORKED_EXAMPLES, Message, WorkedExample, build_prompt, conversation, format_completion
from grpo_lab.data.sets import MIN_GRADED_ITEMS, DataParts, Row, check_graded_sizes
from grpo_lab.data.text import gsm8k_final_answer


def load_datasets(cfg: DataConfig) -> DataParts:
    """The train, validation and test prompt datasets ``cfg`` describes."""
    if isinstance(cfg, HumanEvalData | CodeJsonlData):
        from grpo_lab.data import code

        return code.load(cfg)
    from grpo_lab.data import text

    return text.load(cfg)


__all__ = [
    "MIN_GRADED_ITEMS",
    "WORKED_EXAMPLES",
    "DataParts",
    "Message",
    "Row",
    "WorkedExample",
    "build_prompt",
    "check_graded_sizes",
    "conversation",
    "format_completion",
    "gsm8k_final_answer",
    "load_datasets",
]
