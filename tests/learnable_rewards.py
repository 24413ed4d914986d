"""A reward the tiny random model can learn within seconds: GRPO's learning shown in CI (test_learning.py)."""


def digit_share(completions, **kwargs):
    """The share of a completion's characters that are digits (the tiny tokenizer has many digit tokens)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]


def few_digits(completions, **kwargs):
    """A grader that digit_share works against: an item passes when under a fifth of its characters are digits.
    A run rewarded by digit_share scores ever higher while this grader falls: reward hacking, as the
    divergence health rule must see it (test_health.py)."""
    return [1.0 if share < 0.2 else 0.0 for share in digit_share(completions)]
