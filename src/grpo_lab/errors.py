"""Every error grpo_lab raises on purpose derives from :class:`GrpoLabError`.

The CLI prints these as one clear message (no traceback); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class GrpoLabError(Exception):
    """Base class: a problem the user can fix from the message alone."""


class ConfigError(GrpoLabError, ValueError):
    """The composed config is invalid: unknown key, wrong type or value, impossible batch shape.

    ``key`` is the config key as the user types it and ``kind`` what is wrong there (see
    :mod:`grpo_lab.config.problems`, which builds these); ``problems`` lists every problem found at once.
    """

    def __init__(self, message: str, *, key: str | None = None, kind: str = "rule", problems: tuple = ()) -> None:
        super().__init__(message)
        self.key, self.kind, self.problems = key, kind, tuple(problems)


class DataError(GrpoLabError):
    """A dataset could not be loaded or lacks the columns grpo_lab needs."""


class ModelError(GrpoLabError):
    """A model could not be found, reached or built."""


class RewardError(GrpoLabError):
    """A reward function could not be resolved or called."""


# ------------------------------------------------------------------------------- one line per error
# Words in the message of a failed write that mean "the disk is full", from libraries that do not raise
# OSError for it (safetensors: "IoError(... StorageFull ...)", torch.save: "file write failed").
_DISK_FULL = ("no space left on device", "storagefull", "disk quota exceeded", "file write failed")


def one_line(error: BaseException, limit: int = 500) -> str:
    """`error`'s message on one line, secrets masked, SQLAlchemy's "(Background on this error at: ...)" and
    driver prefixes such as "(psycopg2.OperationalError)" dropped.

    >>> one_line(ValueError("(psycopg2.OperationalError) connection refused\\n\\tIs the server running?\\n\\n"
    ...                     "(Background on this error at: https://sqlalche.me/e/21/e3q8)"))
    'connection refused Is the server running?'
    """
    import re

    text = re.sub(r"^\([\w.]+\)\s*", "", _tidy(str(error)))
    text = " ".join(text.split())
    # Masked before it is cut: a secret cut in half would no longer be recognised.
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tidy(text: str) -> str:
    """Secrets masked, SQLAlchemy's "(Background on this error at: ...)" dropped, a driver's continuation lines
    ("\n\tIs the server running...?") joined to their line; lines added on purpose are kept."""
    import re

    from grpo_lab.redact import redact

    text = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", text)
    text = re.sub(r"\n\t+", " ", text.strip())
    return redact(re.sub(r"\n\s*\n", "\n", text))


def _os_error(error: OSError) -> str:
    import errno

    where = f" {error.filename!r}" if error.filename else ""
    reason = error.strerror or one_line(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"No space left on the device while writing{where}: free some space or write elsewhere."
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{reason}:{where or ' (no path given)'}: choose a folder you can write (e.g. hydra.run.dir=DIR)."
    return f"{reason}:{where}" if where else one_line(error)


def describe(error: BaseException) -> str | None:
    """One clear line for a user or environment error; None for anything else (a bug keeps its traceback).

    User errors are :class:`GrpoLabError`; environment errors are an ``OSError`` (a folder that cannot be
    written, a full disk, a file that vanished), also when a library wrapped it in its own exception. (A command that
    composes a config also words Hydra's refusals: grpo_lab.config.problems.describe.)
    """
    if isinstance(error, GrpoLabError):  # our own messages: kept as written (a few add lines on purpose)
        return _tidy(str(error))
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return _os_error(current)
        current = current.__cause__ or current.__context__
    text = str(error).lower()
    if any(word in text for word in _DISK_FULL):
        return f"No space left on the device while writing ({type(error).__name__}: {one_line(error, 300)})."
    return None
