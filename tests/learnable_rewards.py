"""A reward the tiny random model can learn within seconds: GRPO's learning shown in CI (test_learning.py)."""


def digit_share(completions, **kwargs):
    """The share of a completion's characters that are digits (the tiny tokenizer has many digit tokens)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]
