"""Reward functions and the reward registry, on real completions (including those that break naive regexes)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pickle

import pytest

from grpo_lab.config import RewardFunction
from grpo_lab.errors import RewardError
from grpo_lab.rewards import (
    BUILTIN_REWARDS,
    NamedReward,
    build_rewards,
    correctness,
    int_answer,
    length,
    regex_format,
    resolve_target,
    soft_format,
    strict_format,
    xmlcount,
)
from grpo_lab.rewards.parsing import completion_text, extract_answer, normalize_reference, parse_number

from conftest import one_line_naming

GOOD = "<reasoning>\nShe buys 6 packs of 7.\n6 * 7 = 42\n</reasoning>\n<answer>\n42\n</answer>"


def msg(content: str | None) -> list[dict]:
    return [{"role": "assistant", "content": content}]


# ------------------------------------------------------------------------------------------------ parsing
def test_completion_text_forms():
    assert completion_text("plain") == "plain"
    assert completion_text(msg("hi")) == "hi"
    assert completion_text(msg(None)) == ""
    assert completion_text({"role": "assistant", "content": "single dict"}) == "single dict"
    # Only the model's own turns count; several assistant turns are concatenated.
    turns = [
        {"role": "assistant", "content": "<answer>"},
        {"role": "tool", "content": "ignored"},
        {"role": "assistant", "content": "7</answer>"},
    ]
    assert completion_text(turns) == "<answer>7</answer>"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "parts"}]}]) == "parts"
    with pytest.raises(RewardError) as error:
        completion_text(None)  # type: ignore[arg-type]
    one_line_naming(error.value, "NoneType")  # what it got


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("<answer>\n  42 \n</answer>", "42"),
        # A greedy `.*` would return "1</answer> ... <answer>2"; the first match would return "1".
        ("<answer>1</answer> wait, no: <answer>2</answer>", "2"),
        ("<answer>1 <answer>2</answer>", "2"),
        ("<answer>1</answer> then <answer>3", "1"),
        ("<answer>42", None),
        ("42</answer>", None),
        ("no tags at all", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        (" -3 ", -3.0),
        ("+5", 5.0),
        ("1,234", 1234.0),
        ("1,234,567.25", 1234567.25),
        ("$12", 12.0),
        ("-$12", -12.0),
        ("$-12", -12.0),
        ("12.", 12.0),
        ("12.50", 12.5),
        (".5", 0.5),
        ("\u22127", -7.0),
        ("3/4", None),
        ("forty", None),
        ("forty-two", None),
        ("", None),
        ("   ", None),
        ("12 apples", None),
        ("12,34", None),
        ("1,2345", None),
        ("-$-12", None),
        ("50%", None),
        ("1e5", None),
        ("inf", None),
        ("nan", None),
        (".", None),
        ("$", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_normalize_reference():
    gsm8k = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 1,210 + 24 = 1,234.\n#### 1,234"
    assert normalize_reference(gsm8k) == "1234"
    assert normalize_reference("a #### b #### 7 ") == "7"
    assert normalize_reference(" 42\n") == "42"
    assert normalize_reference(42) == "42"
    assert normalize_reference(None) is None
    assert normalize_reference("####  ") is None


# ------------------------------------------------------------------------------------------------ math
def test_correctness_numbers():
    completions = [
        GOOD,
        "<answer>\n  42.0 \n</answer>",
        "<answer>$42</answer>",
        "<answer>41</answer>",
        "<answer>forty-two</answer>",
        "The answer is 42",  # right number, but no answer tag
        "<answer>42",  # missing closing tag
        "<answer>42</answer> hmm <answer>43</answer>",  # the last answer counts
        "<answer>43</answer> hmm <answer>42</answer>",
    ]
    expected = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert correctness(completions, answer=["42"] * len(completions)) == expected


def test_correctness_gsm8k_reference_commas_negatives_and_none():
    completions = ["<answer>1,234</answer>", "<answer>1234</answer>", "<answer>-5</answer>", "<answer>5</answer>", GOOD]
    answers = ["#### 1,234", "So the total is\n#### 1,234", "-5", "-5", None]
    assert correctness(completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, None]


def test_correctness_messages_and_strings_agree():
    assert correctness([msg(GOOD)], answer=["42"]) == correctness([GOOD], answer=["42"]) == [1.0]
    assert correctness([msg(None)], answer=["42"]) == [0.0]


def test_correctness_text_reference():
    # Compared as text, case-sensitively; commas are dropped on both sides as from the reference.
    completions = ["<answer> Paris </answer>", "<answer>paris</answer>", "<answer>Paris, France</answer>"]
    assert correctness(completions, answer=["Paris", "Paris", "Paris, France"]) == [1.0, 0.0, 1.0]


def test_correctness_without_answer_column_and_bad_lengths():
    assert correctness([GOOD, GOOD]) == [None, None]
    # The reward, the column, how many completions and the references it got.
    with pytest.raises(RewardError) as error:
        correctness([GOOD, GOOD], answer=["7"])
    one_line_naming(error.value, "correctness", "answer", "2", "['7']")
    with pytest.raises(RewardError) as error:
        correctness([GOOD], answer="4")
    one_line_naming(error.value, "correctness", "answer", "1", "'4'")


def test_correctness_accepts_trl_kwargs():
    out = correctness(
        completions=[msg(GOOD)],
        prompts=[[{"role": "user", "content": "6*7?"}]],
        completion_ids=[[1, 2, 3]],
        answer=["42"],
        trainer_state=None,
    )
    assert out == [1.0]


def test_int_answer():
    completions = [
        GOOD,
        "<answer>-1,234</answer>",
        "<answer> +7 </answer>",
        "<answer>12.5</answer>",
        "<answer>12.0</answer>",
        "<answer>$12</answer>",
        "<answer>forty-two</answer>",
        "<answer>12,34</answer>",
        "<answer>3 apples</answer>",
        "<answer>42",
        "42",
        msg("<answer>7</answer>"),
    ]
    assert int_answer(completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------ format
FORMAT_CASES = [
    # (completion, strict, soft)
    (GOOD, 1.0, 1.0),
    ("\n  " + GOOD + "\n\n", 1.0, 1.0),  # surrounding whitespace is fine for both
    ("Sure! " + GOOD, 0.0, 1.0),  # text before
    (GOOD + "\nHope that helps.", 0.0, 1.0),  # text after
    ("<reasoning>6*7</reasoning><answer>42</answer>", 0.0, 1.0),  # missing newlines
    ("<reasoning>\n6*7\n</reasoning>\n\n<answer>\n42\n</answer>", 0.0, 1.0),  # blank line between blocks
    ("<reasoning>\n6*7\n</reasoning>\n<answer>\n42</answer>", 0.0, 1.0),  # no newline before </answer>
    ("<answer>\n42\n</answer>\n<reasoning>\n6*7\n</reasoning>", 0.0, 0.0),  # wrong order
    ("<reasoning>\n6*7\n</reasoning>\n<answer>\n42\n", 0.0, 0.0),  # missing closing tag
    ("<reasoning>\n6*7\n<answer>\n42\n</answer>", 0.0, 0.0),  # missing </reasoning>
    ("42", 0.0, 0.0),
    # A second answer inside the reasoning: the layout matches, but each tag must appear once.
    ("<reasoning>\n<answer>\n1\n</answer>\n</reasoning>\n<answer>\n42\n</answer>", 0.0, 1.0),
]


@pytest.mark.parametrize(("completion", "strict", "soft"), FORMAT_CASES)
def test_strict_and_soft_format(completion, strict, soft):
    assert strict_format([completion]) == [strict]
    assert soft_format([completion]) == [soft]
    assert strict_format([msg(completion)]) == [strict]


def test_xmlcount():
    completions = [
        GOOD,
        GOOD + "\n",  # a final newline is free
        GOOD + "\nThe end.",  # 8 characters after </answer>
        "<reasoning>\n6*7",  # one tag only
        "<reasoning>\n6*7\n</reasoning>\n",  # two
        "<reasoning>6*7</reasoning><answer>42</answer>",  # no newlines: none of the four pieces
        "<reasoning>\n6*7\n</reasoning>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>",  # answer tags twice
        "no tags",
        "<answer>\n42\n</answer>" + "x" * 5000,  # penalty capped: never below 0
    ]
    scores = xmlcount(completions)
    assert scores[:2] == [4.0, 4.0]
    assert scores[2] == pytest.approx(4.0 - 0.008)
    assert scores[3:8] == [1.0, 2.0, 0.0, 2.0, 0.0]
    assert scores[8] == 0.0
    assert xmlcount([msg(GOOD)]) == [4.0]


def test_regex_format():
    pattern = r"<think>.+?</think>\s*\\boxed\{-?\d+\}"
    completions = [
        "<think>\n6*7\n</think>\n\\boxed{42}\n",
        "<think>6*7</think> \\boxed{forty}",
        "prefix <think>6*7</think> \\boxed{42}",  # fullmatch: no text before
        msg("<think>a\nb</think>\\boxed{-1}"),  # DOTALL: the think block may span lines
    ]
    assert regex_format(completions, pattern=pattern) == [1.0, 0.0, 0.0, 1.0]


def test_regex_format_invalid_pattern():
    pattern = "<answer>([0-9]+"
    with pytest.raises(RewardError) as error:
        regex_format(["x"], pattern=pattern)
    one_line_naming(error.value, "regex_format", pattern)


# ------------------------------------------------------------------------------------------------ length
def test_length_tokens():
    ids = [[1] * 4, [1] * 8, [1] * 12, [1] * 16, [1] * 30, []]
    assert length(["x"] * 6, ideal_length=8, completion_ids=ids) == [0.5, 1.0, 0.5, 0.0, 0.0, 0.0]


def test_length_chars():
    completions = ["abcd", msg("abcdefgh"), "a" * 10, msg(None)]
    # completion_ids are ignored when counting characters
    assert length(completions, ideal_length=8, unit="chars", completion_ids=[[1]] * 4) == [0.5, 1.0, 0.75, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        # The argument and its offending value; the valid choices; the way out; both counts.
        ({"ideal_length": 0, "completion_ids": [[1]]}, ["ideal_length", "0"]),
        ({"ideal_length": -5, "completion_ids": [[1]]}, ["ideal_length", "-5"]),
        ({"ideal_length": float("nan"), "completion_ids": [[1]]}, ["ideal_length", "nan"]),
        ({"ideal_length": "48", "completion_ids": [[1]]}, ["ideal_length", "'48'"]),
        ({"ideal_length": 8, "unit": "words", "completion_ids": [[1]]}, ["unit", "words", "tokens", "chars"]),
        ({"ideal_length": 8}, ["completion_ids", "unit='chars'"]),
        ({"ideal_length": 8, "completion_ids": [[1], [2]]}, ["completion_ids", "2", "1"]),
    ],
)
def test_length_errors(kwargs, names):
    with pytest.raises(RewardError) as error:
        length(["x"], **kwargs)
    one_line_naming(error.value, "length", *names)


# ------------------------------------------------------------------------------------------------ registry
def test_named_reward_calls_with_config_kwargs():
    reward = NamedReward("format", regex_format, {"pattern": r"<answer>\d+</answer>"})
    assert reward.__name__ == "format"
    assert reward.func is regex_format
    assert reward.kwargs == {"pattern": r"<answer>\d+</answer>"}
    out = reward(completions=[msg("<answer>4</answer>"), "no"], prompts=["p", "p"], completion_ids=[[1], [2]])
    assert out == [1.0, 0.0]


def test_named_reward_pickles():
    reward = NamedReward("len", length, {"ideal_length": 4, "unit": "chars"})
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "len"
    assert clone.func is length
    assert clone(completions=["abcd", "ab"], answer=[None, None]) == [1.0, 0.5]
    assert "len" in repr(clone)


def test_named_reward_name_is_what_trl_logs():
    from trl.trainer.utils import get_callable_name, is_async_callable

    reward = build_rewards({"my_accuracy": RewardFunction(target="grpo_lab.rewards.math.correctness", kwargs={})})[0]
    assert get_callable_name(reward) == "my_accuracy"
    assert not is_async_callable(reward)  # TRL runs it on its synchronous path


def wrong_count(completions, **kwargs):
    return [1.0, 1.0]


def not_a_list(completions, **kwargs):
    return 1.0


def test_named_reward_checks_output():
    # The reward's config name, its function, and what it returned against what was expected.
    with pytest.raises(RewardError) as error:
        NamedReward("bad", wrong_count)(completions=["a", "b", "c"])
    one_line_naming(error.value, "bad", "wrong_count", "3", "2")
    with pytest.raises(RewardError) as error:
        NamedReward("worse", not_a_list)(completions=["a"])
    one_line_naming(error.value, "worse", "not_a_list", "float")


def test_named_reward_kwarg_clash():
    reward = NamedReward("accuracy", correctness, {"answer": ["42"]})
    with pytest.raises(RewardError) as error:
        reward(completions=[GOOD], answer=["42"])
    one_line_naming(error.value, "accuracy", "answer")  # the reward, and the kwarg that TRL passes too


def test_build_rewards_order_and_targets():
    functions = {
        "xml": RewardFunction(target="grpo_lab.rewards.format.xmlcount", kwargs={}),
        "accuracy": RewardFunction(target="correctness", kwargs={}),
        "fmt": RewardFunction(target="regex_format", kwargs={"pattern": r"\d+"}),
        "len": RewardFunction(target="grpo_lab.rewards.length.length", kwargs={"ideal_length": 2, "unit": "chars"}),
    }
    rewards = build_rewards(functions)
    assert [r.__name__ for r in rewards] == ["xml", "accuracy", "fmt", "len"]
    assert [r.func for r in rewards] == [xmlcount, correctness, regex_format, length]
    batch = {"completions": [msg(GOOD), msg("42")], "answer": ["42", "7"], "completion_ids": [[1], [1, 2]]}
    assert [r(**batch) for r in rewards] == [[4.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]


def test_builtin_rewards_all_resolve():
    for short, dotted in BUILTIN_REWARDS.items():
        func = resolve_target(short)
        assert func is resolve_target(dotted)
        assert func.__name__ == short


def offers_nearest(text: str, nearest: str) -> None:
    """`nearest` is offered on its own, besides the list of every built-in (so it is there twice)."""
    assert all(name in text for name in BUILTIN_REWARDS), text
    assert text.count(nearest) == 2, text


_format = importlib.import_module("grpo_lab.rewards.format")
FORMAT_FUNCTIONS = [n for n in dir(_format) if not n.startswith("_") and inspect.isfunction(getattr(_format, n))]


@pytest.mark.parametrize(
    ("target", "names"),
    [
        # The target as given, and what in it is wrong (the module, the attribute, its type) or the nearest name.
        ("grpo_lab.no_such_module.fn", ["grpo_lab.no_such_module"]),
        ("nonexistent_pkg_xyz.rewards.fn", ["nonexistent_pkg_xyz.rewards"]),
        ("grpo_lab.rewards.math.corectness", ["grpo_lab.rewards.math", "correctness"]),
        ("grpo_lab.rewards.format.zzzzzz", ["grpo_lab.rewards.format"]),
        ("grpo_lab.rewards.format.TRAILING_PENALTY", ["float"]),
        ("corectness", ["correctness", *BUILTIN_REWARDS]),
        ("grpo_lab.", ["my_pkg.rewards.fn"]),  # the form it expects
    ],
)
def test_resolve_target_errors(target, names):
    with pytest.raises(RewardError) as error:
        resolve_target(target)
    text = one_line_naming(error.value, target, *names)
    if target == "corectness":
        offers_nearest(text, "correctness")
    if target.endswith("zzzzzz"):  # nothing is close: no name of the module is offered
        assert FORMAT_FUNCTIONS and not [name for name in FORMAT_FUNCTIONS if name in text], text


def test_build_rewards_reports_bad_target():
    with pytest.raises(RewardError) as error:
        build_rewards({"fmt": RewardFunction(target="strict_fromat", kwargs={})})
    offers_nearest(one_line_naming(error.value, "strict_fromat"), "strict_format")


# ------------------------------------------------------------------------------------------------ docs
@pytest.mark.parametrize("module", ["", ".parsing", ".math", ".format", ".length", ".registry"])
def test_docstring_examples(module):
    # importlib, not attribute access: `grpo_lab.rewards.length` is the function once the package re-exports it.
    result = doctest.testmod(importlib.import_module("grpo_lab.rewards" + module))
    assert result.attempted > 0
    assert result.failed == 0
