"""An own task as a user would bring it: plain prompts without tags, and a grader of one's own (test_graders.py)."""


def exact(completions, answer, **kwargs):
    """1 when the completion, stripped, is the reference answer; None where there is no reference. Written as
    docs/runs.md shows it: completions of conversation prompts are lists of messages, as TRL gives rewards."""
    texts = [c[0]["content"] for c in completions]
    return [None if ref is None else float(text.strip() == str(ref)) for text, ref in zip(texts, answer, strict=True)]


def digits(completions, **kwargs):
    """The share of a completion's characters that are digits: a reward, and with a threshold a grader."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]
