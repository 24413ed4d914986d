"""From config to TRL: resolve each ``reward.functions`` entry to a named, picklable callable.

TRL logs a reward under ``get_callable_name(func)``, i.e. its ``__name__``; :class:`NamedReward` carries the
config name there, so ``rewards/<name>/mean`` uses the name the user chose, not the function's.
"""

from __future__ import annotations

import importlib
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo_lab.config.problems import nearest
from grpo_lab.errors import RewardError, one_line

if TYPE_CHECKING:
    from grpo_lab.config import RewardFunction

# Short name -> dotted path, so that a target may be written `correctness` instead of the full path.
BUILTIN_REWARDS: dict[str, str] = {
    "correctness": "grpo_lab.rewards.math.correctness",
    "int_answer": "grpo_lab.rewards.math.int_answer",
    "strict_format": "grpo_lab.rewards.format.strict_format",
    "soft_format": "grpo_lab.rewards.format.soft_format",
    "xmlcount": "grpo_lab.rewards.format.xmlcount",
    "regex_format": "grpo_lab.rewards.format.regex_format",
    "length": "grpo_lab.rewards.length.length",
    "syntax": "grpo_lab.rewards.code.syntax",
    "tests": "grpo_lab.rewards.code.tests",
    "complexity": "grpo_lab.rewards.code.complexity",
    "fenced_block": "grpo_lab.rewards.code.fenced_block",
}


def _nearest(name: str, candidates: Sequence[str]) -> str:
    close = nearest(name, candidates)
    return f"; did you mean `{close}`?" if close else ""


def _is_score(value: Any) -> bool:
    """A number TRL can weigh (a Python or numpy number, a 0-d tensor), or None."""
    if value is None or isinstance(value, numbers.Real):
        return True
    return getattr(value, "ndim", None) == 0 and getattr(getattr(value, "dtype", None), "is_complex", False) is False


class NamedReward:
    """A reward function bound to its config name and kwargs.

    A module-level class with plain attributes (no closure, no lambda) so that it pickles, which TRL and
    multi-process launchers need.

    >>> from grpo_lab.rewards.format import regex_format
    >>> reward = NamedReward("digits", regex_format, {"pattern": r"\\d+"})
    >>> reward.__name__, reward(completions=["42", "forty-two"])
    ('digits', [1.0, 0.0])
    """

    def __init__(self, name: str, func: Callable[..., Sequence[float | None]], kwargs: Mapping[str, Any] | None = None):
        self.__name__ = name
        self.func = func
        self.kwargs = dict(kwargs or {})

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        # A config kwarg that TRL also passes (a dataset column, `completion_ids`...) would be ambiguous.
        clash = sorted(set(self.kwargs) & set(kwargs))
        if clash:
            raise RewardError(
                f"Reward `{self.__name__}`: config kwargs {clash} clash with the arguments TRL passes; rename them."
            )
        try:
            scores = self.func(completions=completions, **self.kwargs, **kwargs)
        except Exception as exc:  # a reward that raises fails the run, naming itself and the completion
            raise self._error(exc, completions, kwargs) from exc
        if not isinstance(scores, list | tuple) or len(scores) != len(completions):
            got = f"{len(scores)} scores" if isinstance(scores, list | tuple) else repr(type(scores).__name__)
            raise RewardError(
                f"Reward `{self.__name__}` ({_describe(self.func)}) must return a list with one score per "
                f"completion ({len(completions)}), got {got}"
            )
        if bad := next(((i, s) for i, s in enumerate(scores) if not _is_score(s)), None):
            i, score = bad
            raise RewardError(
                f"Reward `{self.__name__}` ({_describe(self.func)}) must return numbers (None: no score for that "
                f"completion), got {repr(score)[:80]} ({type(score).__name__}) for completion #{i}: "
                f"{_completion_text(completions[i])!r}"
            )
        return list(scores)

    def __repr__(self) -> str:
        return f"NamedReward({self.__name__!r}, {_describe(self.func)}, {self.kwargs!r})"

    def _error(self, exc: Exception, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> RewardError:
        """A RewardError naming this reward, the exception and the first completion that raises it alone.

        The batch is replayed one completion at a time (with the matching item of every per-completion
        argument, such as a dataset column) to find which completion is to blame.
        """
        what = f"reward `{self.__name__}` raised {type(exc).__name__}: {one_line(exc, 300)}"
        n = len(completions)
        for i in range(n):
            single = {k: [v[i]] if isinstance(v, list | tuple) and len(v) == n else v for k, v in kwargs.items()}
            try:
                self.func(completions=[completions[i]], **self.kwargs, **single)
            except Exception:
                return RewardError(f"{what} on completion #{i}: {_completion_text(completions[i])!r}")
        return RewardError(f"{what} on a batch of {n} completions (no single one raises it alone)")


def _completion_text(completion: Any, limit: int = 200) -> str:
    """The first `limit` characters of a completion: text, or a conversation's message contents."""
    if isinstance(completion, list):
        text = "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    else:
        text = str(completion)
    return text[:limit] + ("..." if len(text) > limit else "")


def _describe(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', type(func).__name__)}"


def resolve_target(dotted: str) -> Callable[..., Any]:
    """The callable at ``dotted`` (``module.attribute``), or at a built-in short name from :data:`BUILTIN_REWARDS`.

    >>> resolve_target("grpo_lab.rewards.math.correctness").__name__
    'correctness'
    >>> resolve_target("xmlcount").__name__
    'xmlcount'
    """
    if "." not in dotted:
        if dotted not in BUILTIN_REWARDS:
            raise RewardError(
                f"Unknown built-in reward `{dotted}`{_nearest(dotted, list(BUILTIN_REWARDS))} "
                f"(built-ins: {', '.join(BUILTIN_REWARDS)}; or give a dotted path like `my_pkg.rewards.fn`)"
            )
        dotted = BUILTIN_REWARDS[dotted]
    module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise RewardError(f"Reward target `{dotted}` must be a dotted path like `my_pkg.rewards.fn`")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Tell "the module does not exist" apart from "it exists but imports something missing".
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise RewardError(f"Reward target `{dotted}`: module `{module_name}` not found") from exc
        raise RewardError(f"Reward target `{dotted}`: importing `{module_name}` failed: {exc}") from exc
    except ImportError as exc:
        raise RewardError(f"Reward target `{dotted}`: importing `{module_name}` failed: {exc}") from exc
    try:
        func = getattr(module, attr)
    except AttributeError:
        public = [name for name in dir(module) if not name.startswith("_")]
        raise RewardError(
            f"Reward target `{dotted}`: module `{module_name}` has no attribute `{attr}`{_nearest(attr, public)}"
        ) from None
    if not callable(func):
        raise RewardError(f"Reward target `{dotted}` is a {type(func).__name__}, not a callable")
    return func


def build_rewards(functions: Mapping[str, RewardFunction]) -> list[NamedReward]:
    """One :class:`NamedReward` per config entry, in the mapping's order (the order of TRL's ``reward_weights``).

    >>> from grpo_lab.config import RewardFunction
    >>> fmt, ok = RewardFunction(target="soft_format", kwargs={}), RewardFunction(target="correctness", kwargs={})
    >>> rewards = build_rewards({"fmt": fmt, "ok": ok})
    >>> [r.__name__ for r in rewards]
    ['fmt', 'ok']
    """
    return [NamedReward(name, resolve_target(spec.target), spec.kwargs) for name, spec in functions.items()]
