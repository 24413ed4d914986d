"""Code rewards: does the completion's code parse, pass the problem's tests, stay simple, come in one fenced block.

The code is the completion's first fenced block (```python, or a bare ```), the text after an opening fence that was
never closed (a completion cut at max_completion_length), or, without any fence, the whole completion. A problem may
carry a ``preamble`` column (HumanEval: its prompt, the imports, helpers and the stub with its docstring) that is put
before the code, so that a completion may rewrite the whole function or write only its body.

``tests`` runs each completion with its problem's ``tests`` (and ``entry_point``) in grpo_lab.sandbox, the one place
model-written code runs (the tests run in a second sandbox that the completion cannot reach, and use the preamble's
helpers, not the completion's); the other three never execute the code.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_lab.errors import RewardError
from grpo_lab.rewards.parsing import Completion, completion_text

# An opening fence at the start of a line: ``` or ~~~, a language word or nothing, then the newline.
_OPEN = re.compile(r"^[ \t]*(```|~~~)[ \t]*([\w+-]*)[^\n]*\n", re.MULTILINE)
_PYTHON = ("python", "py", "python3", "")


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, closed) for every fenced block, in order."""
    found, at = [], 0
    while match := _OPEN.search(text, at):
        fence, language = match.group(1), match.group(2).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence)}[ \t]*$", re.MULTILINE).search(text, match.end())
        if close is None:
            found.append((language, text[match.end() :], False))
            break
        found.append((language, text[match.end() : close.start()], True))
        at = close.end()
    return found


def extract_code(completion: Completion) -> str:
    """The completion's code (see the module docstring).

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    >>> extract_code("```python\\ndef f():\\n    return")  # cut off before the closing fence
    'def f():\\n    return'
    >>> extract_code("def f(): return 1")
    'def f(): return 1'
    """
    text = completion_text(completion)
    blocks = _blocks(text)
    python = [code for language, code, _ in blocks if language in _PYTHON]
    if python:
        return python[0]
    return blocks[0][1] if blocks else text


def _source(code: str, preamble: str | None) -> str:
    from grpo_lab.sandbox.plan import program  # the program the sandbox runs (its `from __future__` lines first)

    return program(preamble, code)[0]


def _compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning on invalid escapes: not our console's business
            compile(source, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return False
    return True


def _per_item(values: Sequence[Any] | None, n: int, name: str) -> list[Any]:
    if values is None:
        return [None] * n
    if isinstance(values, str) or len(values) != n:
        raise RewardError(f"the code rewards need one `{name}` per completion ({n}), got {values!r:.200}")
    return list(values)


def syntax(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion has code and it compiles (after the problem's preamble), else 0.0. Never runs it.

    >>> syntax(["```python\\ndef f(x):\\n    return x\\n```", "```python\\ndef f(x) return x\\n```", "", "Sure!"])
    [1.0, 0.0, 0.0, 0.0]
    """
    preambles = _per_item(kwargs.get("preamble"), len(completions), "preamble")
    scores: list[float | None] = []
    for completion, pre in zip(completions, preambles, strict=True):
        code = extract_code(completion)
        scores.append(1.0 if code.strip() and _compiles(_source(code, pre)) else 0.0)
    return scores


def fenced_block(completions: Sequence[Completion], **kwargs: Any) -> list[float | None]:
    """1.0 for exactly one closed fenced Python block (```python or a bare ```) holding code, else 0.0.

    >>> one, two = "```python\\nx = 1\\n```", "```python\\nx = 1\\n```\\n```python\\ny = 2\\n```"
    >>> fenced_block([one, two, "x = 1", "```py\\nx"])
    [1.0, 0.0, 0.0, 0.0]
    """
    scores: list[float | None] = []
    for completion in completions:
        blocks = _blocks(completion_text(completion))
        one = len(blocks) == 1 and blocks[0][2] and blocks[0][0] in _PYTHON and blocks[0][1].strip()
        scores.append(1.0 if one else 0.0)
    return scores


def complexity(completions: Sequence[Completion], max_complexity: float = 15, **kwargs: Any) -> list[float | None]:
    """``max(0, 1 - c / max_complexity)``, c being the highest cognitive complexity (complexipy, the measure of
    SonarSource's paper; its default limit is 15) of a function the code defines (a body-only answer: within the
    problem's ``preamble``); 0.0 when the code does not parse or defines no function, so that an empty or broken answer
    is never the simplest.

    >>> flat, no_function = "```python\\ndef f(x):\\n    return x\\n```", "```python\\nx = 1\\n```"
    >>> complexity([flat, no_function, "def f("], max_complexity=10)
    [1.0, 0.0, 0.0]
    """
    if not (isinstance(max_complexity, int | float) and math.isfinite(max_complexity) and max_complexity > 0):
        raise RewardError(f"complexity: `max_complexity` must be a positive number, got {max_complexity!r}")
    from complexipy import code_complexity

    preambles = _per_item(kwargs.get("preamble"), len(completions), "preamble")
    scores: list[float | None] = []
    for completion, pre in zip(completions, preambles, strict=True):
        code = extract_code(completion)
        if code.strip() and pre and not _compiles(code):  # a body-only answer: measured inside the problem's stub
            code = _source(code, pre)
        if not code.strip() or not _compiles(code):
            scores.append(0.0)
            continue
        try:
            functions = code_complexity(code).functions
        except Exception:  # complexipy's own parser refusing what CPython accepts: no score, not a crash
            scores.append(0.0)
            continue
        worst = max((f.complexity for f in functions), default=None)
        scores.append(0.0 if worst is None else max(0.0, 1.0 - worst / max_complexity))
    return scores


def tests(
    completions: Sequence[Completion],
    tests: Sequence[str] | None = None,
    sandbox: Mapping[str, Any] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """The share of the problem's tests that the completion's code passes, run in grpo_lab.sandbox (all of a step's
    completions side by side); 0.0 for an empty completion or code that does not compile, None for a problem without
    tests.

    `tests` (a dataset column): assert lines, or HumanEval's ``check(candidate)`` with the ``entry_point`` column;
    an optional ``preamble`` column goes before the code. `sandbox`:
    ``reward.sandbox`` (isolation, limits, workers). When TRL passes `log_metric`, the call logs ``sandbox/seconds``
    (its wall time), ``sandbox/passed`` (the share of completions passing every test) and ``sandbox/<error>`` (the
    share of completions that ended in a timeout, memory, syntax... error).
    """
    from grpo_lab import sandbox as sandbox_mod

    n = len(completions)
    problems = _per_item(tests, n, "tests")
    # Optional columns, read from kwargs: a grader's check (grpo_lab.evaluation.graders) requires only the named ones.
    entry_points = _per_item(kwargs.get("entry_point"), n, "entry_point")
    preambles = _per_item(kwargs.get("preamble"), n, "preamble")
    settings = dict(sandbox or {})
    isolation, workers = settings.pop("isolation", "bwrap"), settings.pop("workers", None)
    limits = sandbox_mod.Limits(**settings)

    scores: list[float | None] = [None] * n
    jobs, where = [], []
    for i, (completion, test, entry, pre) in enumerate(
        zip(completions, problems, entry_points, preambles, strict=True)
    ):
        if test is None:
            continue
        code = extract_code(completion)
        if not code.strip():
            scores[i] = 0.0  # nothing to run
            continue
        # Code that does not compile runs too: the sandbox's verdict (error "syntax") is what sandbox/syntax counts.
        # The preamble goes before the code in the completion's sandbox, and its helpers are the tests' own.
        jobs.append((code, test, entry, pre))
        where.append(i)
    started = time.monotonic()
    verdicts = sandbox_mod.run_many(jobs, workers, limits=limits, isolation=isolation) if jobs else []
    for i, verdict in zip(where, verdicts, strict=True):
        scores[i] = verdict.reward
    if log_metric is not None and jobs:
        _log_verdicts(log_metric, verdicts, time.monotonic() - started)
    return scores


def _log_verdicts(log_metric: Callable[[str, float], None], verdicts: Sequence[Any], seconds: float) -> None:
    from grpo_lab import sandbox as sandbox_mod

    log_metric("sandbox/seconds", seconds)
    log_metric("sandbox/passed", sum(v.reward == 1.0 for v in verdicts) / len(verdicts))
    for error in sandbox_mod.ERRORS:
        log_metric(f"sandbox/{error}", sum(v.error == error for v in verdicts) / len(verdicts))


__all__ = ["complexity", "extract_code", "fenced_block", "syntax", "tests"]
