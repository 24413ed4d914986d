"""A reward that raises, to prove that one failed job does not take a multirun's other results with it."""


def explode(completions, **kwargs):
    raise RuntimeError("this reward fails on purpose")


def nan_reward(completions, **kwargs):
    """NaN for every completion: the per-reward mean TRL logs is then NaN."""
    return [float("nan")] * len(completions)


def inf_reward(completions, **kwargs):
    """inf for every completion: GRPO's advantages (reward - mean) / std and then the loss become NaN."""
    return [float("inf")] * len(completions)


def words(completions, **kwargs):
    """A verdict in words, not a number: TRL cannot weigh it."""
    return ["yes"] * len(completions)
