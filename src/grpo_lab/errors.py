"""Every error grpo_lab raises on purpose derives from :class:`GrpoLabError`.

The CLI prints these as one clear message (no traceback); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class GrpoLabError(Exception):
    """Base class: a problem the user can fix from the message alone."""


class ConfigError(GrpoLabError, ValueError):
    """The composed config is invalid: unknown key, wrong type or value, impossible batch shape."""


class DataError(GrpoLabError):
    """A dataset could not be loaded or lacks the columns grpo_lab needs."""


class ModelError(GrpoLabError):
    """A model could not be found, reached or built."""


class RewardError(GrpoLabError):
    """A reward function could not be resolved or called."""
