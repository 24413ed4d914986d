"""A reward that raises, to prove that one failed job does not take a multirun's other results with it."""


def explode(completions, **kwargs):
    raise RuntimeError("this reward fails on purpose")
