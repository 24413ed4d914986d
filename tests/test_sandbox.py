"""The code reward's sandbox, as a user meets it: ordinary code passes, tests are planned right for every common
layout, values cross the process boundary as data, the command line prints one JSON line (issues #28 and #36).

The hostile completions are in test_sandbox_hostile.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_lab import sandbox
from grpo_lab.data.code import humaneval_problems
from grpo_lab.sandbox import Limits, SandboxError, check_isolation, check_tests, run, run_many, wire
from grpo_lab.sandbox.plan import program

from conftest import one_line_naming, skip_here

LIMITS = Limits(timeout=3, memory_mb=512, processes=8, output_bytes=1 << 16)
SQUARE = "def f(x):\n    return x * x\n"
ASSERTS = "assert f(2) == 4\nassert f(3) == 9\nassert f(-1) == 1\n"
ISOLATIONS = ("bwrap", "rlimits")


def needs(isolation: str) -> str:
    """Skip a bubblewrap test where it is missing (CI fails instead: it installs it)."""
    if isolation == "bwrap" and shutil.which("bwrap") is None:
        skip_here("bubblewrap is not installed: apt-get install bubblewrap")
    return isolation


@pytest.fixture
def bwrap() -> None:
    needs("bwrap")


def outcomes(cases: list[tuple], isolation: str = "bwrap", limits: Limits = LIMITS) -> list[tuple]:
    """(passed, total, error) of each (code, tests[, entry_point[, preamble]]), all in one batch."""
    verdicts = run_many(cases, 2, limits=limits, isolation=needs(isolation))
    return [(v.passed, v.total, v.error) for v in verdicts]


# ------------------------------------------------------------------------------------------------- ordinary code
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_correct_code_passes_and_wrong_code_gets_the_asserts_it_passes(isolation: str) -> None:
    needs(isolation)
    good = run(SQUARE, ASSERTS, limits=LIMITS, isolation=isolation)
    assert (good.passed, good.total, good.error, good.reward) == (3, 3, None, 1.0)
    assert good.isolation == isolation and 0 < good.seconds < LIMITS.timeout and good.peak_memory_mb > 1
    wrong = run("def f(x):\n    return abs(x)\n", ASSERTS, limits=LIMITS, isolation=isolation)
    assert (wrong.passed, wrong.total, wrong.error) == (1, 3, None)  # only f(-1) == 1
    assert wrong.reward == pytest.approx(1 / 3) and wrong.detail.startswith("AssertionError")
    broken = run("def f(x) return x * x\n", ASSERTS, limits=LIMITS, isolation=isolation)
    assert (broken.passed, broken.error, broken.reward) == (0, "syntax", 0.0) and "SyntaxError" in broken.detail


# Ordinary correct code that must pass every test: values of the standard library returned, code changing its
# arguments in place, classes, generators, threads, printing, callables handed to it, exceptions expected of it.
ORDINARY: dict[str, tuple[str, str]] = {
    "counter_namedtuple": (
        "from collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n"
        "def f(s):\n    return Counter(s), P(1, 2)\n",
        "assert f('aab') == ({'a': 2, 'b': 1}, (1, 2))\nassert f('aab')[0]['a'] == 2\n",
    ),
    "fraction_decimal_complex": (
        "from fractions import Fraction\nfrom decimal import Decimal\ndef f():\n"
        "    return Fraction(1, 3), Decimal('0.1'), 2 + 3j, 10 ** 40, -(2 ** 70), float('inf')\n",
        "from fractions import Fraction\nfrom decimal import Decimal\n"
        "assert f() == (Fraction(1, 3), Decimal('0.1'), 2 + 3j, 10 ** 40, -(2 ** 70), float('inf'))\n",
    ),
    "enums": (
        "import enum\nclass Color(enum.IntEnum):\n    RED = 1\nclass Word(enum.StrEnum):\n    HI = 'hi'\n"
        "def f():\n    return Color.RED, Word.HI, [Color.RED] * 2\n",
        "assert f() == (1, 'hi', [1, 1])\n",
    ),
    "collections": (
        "from collections import OrderedDict, defaultdict, deque, ChainMap\ndef f():\n"
        "    d = defaultdict(list)\n    d['a'].append(1)\n"
        "    return OrderedDict(a=1), d, deque([1, 2], maxlen=3), frozenset({1}), {1, 2}, b'x', bytearray(b'y')\n",
        "from collections import OrderedDict, deque\n"
        "assert f() == (OrderedDict(a=1), {'a': [1]}, deque([1, 2]), frozenset({1}), {1, 2}, b'x', bytearray(b'y'))\n"
        "assert f()[1]['missing'] == []\n",
    ),
    "views_and_ranges": (
        "def f(d):\n    return d.keys(), list(d.values()), range(3)\n",
        "assert f({1: 2}) == ({1}, [2], range(0, 3))\n",
    ),
    "in_place": (
        "def f(xs):\n    xs.sort()\ndef g(m):\n    m[:] = [list(r) for r in zip(*m[::-1])]\n"
        "def h(d, s):\n    d['new'] = 1\n    s.discard(2)\n",
        "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]\nm = [[1, 2], [3, 4]]\nrow = m[0]\ng(m)\n"
        "assert m == [[3, 1], [4, 2]]\nd, s = {}, {1, 2}\nh(d, s)\nassert (d, s) == ({'new': 1}, {1})\n",
    ),
    "recursion_limit": (
        "import sys\nsys.setrecursionlimit(10000)\ndef f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n",
        "assert f(5000) == 5000\n",
    ),
    "threads_and_print": (
        "import threading\ndef f(x):\n    out = []\n    t = threading.Thread(target=lambda: out.append(x * x))\n"
        "    t.start()\n    t.join()\n    print('debugging', x)\n    return out[0]\n",
        ASSERTS,
    ),
    "mbpp_class": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
        "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
        "    def __len__(self):\n        return len(self.items)\n    def __str__(self):\n"
        "        return 'Stack(%d)' % len(self)\ndef size(stack):\n    return len(stack)\n",
        "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and size(s) == 2\nassert str(s) == 'Stack(2)'\n"
        "assert s.pop() == 2\nassert s.items == [1]\n",
    ),
    "generator": (
        "def f(n):\n    yield from range(n)\n",
        "assert list(f(3)) == [0, 1, 2]\nassert sum(f(4)) == 6\nassert [x for x in f(2)] == [0, 1]\n",
    ),
    "callables_handed_in": (
        "def f(xs, key):\n    return sorted(xs, key=key)\ndef apply(g, x):\n    return g(g(x))\n",
        "assert f([3, -5, 1], key=abs) == [1, 3, -5]\nassert apply(lambda x: x * 2, 3) == 12\n"
        "calls = []\nassert apply(lambda x: calls.append(x) or x, 1) == 1 and calls == [1, 1]\n",
    ),
    "expected_exception": (
        "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
        "def lookup(d, k):\n    if k not in d:\n        raise KeyError(k)\n    return d[k]\n",
        "try:\n    f(-1)\n    assert False\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
        "assert f(2) == 2\ntry:\n    {}['x']\nexcept KeyError:\n    pass\ntry:\n    lookup({}, 'x')\n"
        "    assert False\nexcept KeyError as e:\n    assert str(e) == \"'x'\" and e.args == ('x',)\n",
    ),
    "tests_own_objects_and_namedtuples": (
        "from collections import namedtuple\nSpan = namedtuple('Span', 'lo hi')\ndef height(node):\n"
        "    return 0 if node is None else 1 + max(height(node.left), height(node.right))\n"
        "def span(p):\n    return Span(min(p.x, p.y), max(p.x, p.y))\n",
        "from collections import namedtuple\nclass Node:\n    def __init__(self, left=None, right=None):\n"
        "        self.left, self.right = left, right\nassert height(Node(Node(Node()), Node())) == 3\n"
        "P = namedtuple('P', 'x y')\nr = span(P(5, 2))\nassert r == (2, 5) and r.lo == 2 and r.hi == 5\n",
    ),
    "long_iterations": (
        "import itertools\ndef perms(n):\n    return itertools.permutations(range(n))\n"
        "def count(n):\n    return (i for i in range(n))\n",
        "assert sum(1 for _ in perms(8)) == 40320\nassert list(count(3)) == [0, 1, 2]\nit = count(5)\n"
        "assert next(it) == 0 and next(it) == 1 and list(it) == [2, 3, 4]\n",
    ),
    "iterators_stand_where_they_were_left": (
        "log = []\ndef take(it, n):\n    return [next(it) for _ in range(n)]\ndef numbers():\n"
        "    for i in range(10):\n        log.append(i)\n        yield i\ndef produced():\n    return len(log)\n",
        "it = iter([1, 2, 3, 4, 5])\nassert take(it, 2) == [1, 2] and list(it) == [3, 4, 5]\ng = numbers()\n"
        "assert next(g) == 0 and next(g) == 1 and produced() == 2\n",
    ),
    "pools": (
        "import multiprocessing\nfrom concurrent.futures import ThreadPoolExecutor\ndef square(x):\n    return x * x\n"
        "def threads(n):\n    with ThreadPoolExecutor(20) as pool:\n        return sum(pool.map(square, range(n)))\n"
        "def processes(n):\n    with multiprocessing.Pool(2) as pool:\n"
        "        return sum(pool.map(square, range(n)))\n",
        "assert threads(40) == 20540\nassert processes(10) == 285\n",
    ),
    "callable_entry_points": (
        "import functools\nclass Square:\n    def __init__(self, x):\n        self.value = x * x\n"
        "class Doubler:\n    def __call__(self, x):\n        return 2 * x\ndef power(x, n):\n    return x ** n\n"
        "class Box:\n    def get(self, x):\n        return x + 1\n"
        "double = Doubler()\ncube = functools.partial(power, n=3)\nplus_one = Box().get\nneg = lambda x: -x\n",
        "assert Square(3).value == 9\nassert double(4) == 8\nassert cube(2) == 8\nassert plus_one(1) == 2\n"
        "assert neg(1) == -1\n",
    ),
}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_ordinary_correct_code_passes_every_test(isolation: str) -> None:
    got = outcomes([(code, tests) for code, tests in ORDINARY.values()], isolation)
    want = [(check_tests(tests), check_tests(tests), None) for _, tests in ORDINARY.values()]
    assert dict(zip(ORDINARY, got, strict=True)) == dict(zip(ORDINARY, want, strict=True))


def test_ordinary_standard_library_code_runs(bwrap: None) -> None:
    """What the sandbox shows (the standard library alone) is enough for what completions ordinarily use."""
    code = """
import collections, dataclasses, enum, functools, hashlib, heapq, itertools, json, logging, math, random, re
import statistics, string, subprocess, sys, threading, typing, zoneinfo

@dataclasses.dataclass
class Box:
    size: int

@functools.lru_cache
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def checks():
    logging.getLogger("completion").warning("computing")
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip()
    return (Box(3).size, fib(20), len(re.findall("a", "banana")), heapq.nsmallest(1, [3, 1]),
            hashlib.sha256(b"").hexdigest()[:4], json.dumps([1]), out, str(zoneinfo.ZoneInfo("UTC")))
"""
    tests = "assert checks() == (3, 6765, 3, [1], 'e3b0', '[1]', '42', 'UTC')\n"
    assert outcomes([(code, tests)]) == [(1, 1, None)]


def test_a_call_that_exits_fails_that_call_only() -> None:
    code = "import sys\ndef f(x):\n    if x == 0:\n        sys.exit(0)\n    return x * x\n"
    tests = "try:\n    assert f(0) == 0\nexcept Exception:\n    pass\nassert f(2) == 4\nassert f(3) == 9\n"
    verdict = run(code, tests, limits=LIMITS, isolation=needs("bwrap"))
    assert (verdict.passed, verdict.total, verdict.error) == (2, 3, None), verdict
    assert "SystemExit" in verdict.detail  # the first test failed: `except Exception` could not catch the exit


def test_an_exception_crosses_as_its_nearest_builtin_type_with_its_message(bwrap: None) -> None:
    code = "class Mine(KeyError):\n    pass\ndef f(x):\n    raise Mine('no such key: %s' % x)\n"
    tests = (
        "try:\n    f(7)\n    assert False\nexcept KeyError as e:\n    assert type(e) is KeyError and '7' in str(e)\n"
    )
    assert outcomes([(code, tests)]) == [(1, 1, None)]


# --------------------------------------------------------------------------------------------------- planning
CHECK_CALLED = "def check(fn):\n    assert fn(2) == 4\n    assert fn(3) == 9\n    assert fn(0) == 0\ncheck(double)\n"
HUMANEVAL_LIKE = "LIMIT = 3\ndef check(candidate):\n    assert candidate(3) == 9\n    assert True\n" + (
    "    assert candidate(0) == 0\n    for x in range(LIMIT):\n        assert candidate(-x) == x * x\n"
)


def test_every_common_test_layout_is_planned_right() -> None:
    cases = [
        ("def double(x):\n    return x * x\n", CHECK_CALLED),  # check(fn) and its call in the file
        ("def double(x):\n    return x + 2\n", CHECK_CALLED),  # wrong: only double(2) == 4
        ("x = 1\n", CHECK_CALLED),  # defines nothing: passes nothing
        ("def double(x):\n    return 0\ndef fn(x):\n    return x * x\n", CHECK_CALLED),  # its own `fn` is not tested
        ("def double(x):\n    return x * x\n", CHECK_CALLED, "double"),  # the call and an entry point: once
        (SQUARE, HUMANEVAL_LIKE, "f"),  # HumanEval's layout: `assert True` tests nothing
        ("def f(x):\n    return 3 * x\n", HUMANEVAL_LIKE, "f"),  # f(3) == 9 and f(0) == 0
        (SQUARE, "def check(g):\n    assert g(2) == 4\n", "f"),  # check's parameter, whatever its name
        ("def g(x):\n    return x * x\n", "def check(g):\n    assert g(2) == 4\n", "f"),  # its own g is no f
        (
            SQUARE,
            "def check(candidate):\n    if candidate(0) != 0:\n        return\n    assert candidate(3) == 9\n",
            "f",
        ),
        (
            "import math\ndef add(a, b):\n    return a + b\n",
            "import math\nassert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert math.isclose(add(0.5, 0.25), 0.75)\n",
        ),  # MBPP: setup, then its assert lines
        (SQUARE, "assert f(2) == 4\nundefined_helper()\nassert f(3) == 9\n"),  # a failing setup line fails the rest
        ("x = 1\n", 'if __name__ == "__main__":\n    assert f(2) == 4\n'),  # a main guard's tests run: no pass
        ("def copy(xs):\n    return list(xs)\n", "assert copy((1, 2)) == [1, 2]\n"),  # named like a module
    ]
    assert outcomes(cases) == [
        (3, 3, None),
        (1, 3, None),
        (0, 3, None),
        (1, 3, None),
        (3, 3, None),
        (3, 3, None),
        (2, 3, None),
        (1, 1, None),
        (0, 1, None),
        (1, 1, None),  # a check that returns early cannot be split: one test
        (3, 3, None),
        (1, 2, None),
        (0, 1, None),
        (1, 1, None),
    ]


def test_a_missing_function_is_named_in_the_detail(bwrap: None) -> None:
    verdict = run("x = 1\n", CHECK_CALLED, limits=LIMITS)
    assert verdict.passed == 0 and verdict.detail == "NameError: the completion defines no double"


def test_a_stub_of_the_preamble_is_no_answer(bwrap: None) -> None:
    """HumanEval's preamble declares the function: an answer that adds nothing is tested as nothing, not as the stub
    (which returns None and would pass `candidate([]) == None`)."""
    preamble = 'def longest(words):\n    """The longest word, None for none."""\n'
    tests = "def check(candidate):\n    assert candidate([]) == None\n    assert candidate(['a', 'bb']) == 'bb'\n"
    body = "    return max(words, key=len) if words else None\n"
    whole = "def longest(words):\n    return max(words, key=len) if words else None\n"
    future = "from __future__ import annotations\n" + whole.replace("(words)", "(words: list)")
    future += 'NOTE = """\nfrom __future__ import annotations\n"""\n'  # the same line in a string stays there
    answers = ("# nothing\n", "pass\n", "x = 1\n", body, whole, future)
    cases = [(code, tests, "longest", preamble) for code in answers]
    assert outcomes(cases) == [(0, 2, None), (0, 2, None), (0, 2, None), (2, 2, None), (2, 2, None), (2, 2, None)]
    assert "from __future__" in program(preamble, future)[0].split('NOTE = """')[1]


def test_a_timeout_or_a_crash_keeps_the_tests_passed_before_it(bwrap: None) -> None:
    loops = "def f(x):\n    while x == 3:\n        pass\n    return x * x\n"
    crashes = "import os\ndef f(x):\n    if x == 3:\n        os._exit(3)\n    return x * x\n"
    segfaults = "import ctypes\ndef f(x):\n    if x == 3:\n        ctypes.string_at(0)\n    return x * x\n"
    limits = Limits(timeout=1.5, memory_mb=512)
    verdicts = run_many([(loops, ASSERTS), (crashes, ASSERTS), (segfaults, ASSERTS)], 2, limits=limits)
    assert [(v.passed, v.total, v.error) for v in verdicts] == [(1, 3, "timeout"), (1, 3, "runtime"), (1, 3, "killed")]
    assert verdicts[0].reward == pytest.approx(1 / 3) and verdicts[0].seconds < limits.timeout + 1
    assert "SIGSEGV" in verdicts[2].detail


@pytest.mark.parametrize(
    ("tests", "entry_point", "needles"),
    [
        ("assert f(2) ==\n", None, ["the tests do not parse", "line 1"]),
        ("x = f(2)\n", None, ["no assert", "check(candidate)"]),
        (ASSERTS, "f", ["entry_point='f'", "check(candidate)"]),
        (
            "import math\nassert math.sqrt(4) == 2\nassert f(2) == 4\n",
            None,
            ["line 2", "math.sqrt(4)", "whatever the answer"],
        ),
        ("assert False\nassert f(2) == 4\n", None, ["line 1", "assert False"]),
        ("def check(c):\n    assert c(1) == 1\n    assert len([1]) == 1\n", "f", ["line 3", "len([1])"]),
        ("def check(a, b):\n    assert a(1) == b\n", "f", ["check()", "one parameter"]),
        ("assert (f(2) == 4, 'f(2) is 4')\n", None, ["line 1", "a tuple", "always true"]),
    ],
)
def test_tests_that_cannot_be_run_or_test_nothing_are_refused_in_one_line(tests, entry_point, needles) -> None:
    with pytest.raises(SandboxError) as error:
        check_tests(tests, entry_point)
    one_line_naming(error.value, *needles)


def test_tests_computed_from_the_completion_are_not_refused() -> None:
    """The refusal follows names: a result stored first, an argument changed in place, a helper that calls it."""
    tests = (
        "result = f(2)\nassert result == 4\nxs = [3, 1]\nf(xs)\nassert xs == [1, 3]\n"
        "def near(a, b):\n    return abs(a - b) < 1e-9\ndef twice(x):\n    return f(f(x))\nassert twice(2) == 16\n"
    )
    assert check_tests(tests) == 3


def test_an_assert_that_compares_the_completion_with_itself_is_no_test() -> None:
    """HumanEval/33 compares `candidate(x)` with `sort_third(x)`, its own entry point: any consistent answer passes
    those three; the four that compare with values stay."""
    problem = next(p for p in humaneval_problems() if p["task_id"] == "HumanEval/33")
    assert sandbox.plan(problem["test"], problem["entry_point"], problem["prompt"]).total == 4
    assert check_tests("assert f(2) == f(2)\nassert f(2) == 4\n") == 1
    # Comparing different things is a test: an order, another argument, a recurrence.
    assert check_tests("assert f(10) > f(9)\nassert f(5) != f(6)\nassert f(12) == f(11) + f(10)\n") == 3


def test_every_humaneval_problem_is_planned_with_its_own_helpers() -> None:
    """HumanEval's tests take only the entry point from the completion; everything else (the prompt's helpers such
    as poly and encode_cyclic, the modules they use) is the judge's own."""
    for problem in humaneval_problems():
        planned = sandbox.plan(problem["test"], problem["entry_point"], problem["prompt"])
        assert planned.names == (problem["entry_point"],), problem["task_id"]
    helpers = {p["task_id"]: sandbox.plan(p["test"], p["entry_point"], p["prompt"]) for p in humaneval_problems()}
    assert "poly" not in helpers["HumanEval/32"].names and "encode_cyclic" not in helpers["HumanEval/38"].names


# --------------------------------------------------------------------------------------------------- the wire
def test_values_cross_as_builtin_values_of_the_allowed_types_only() -> None:
    """Round trip of every allowed type, and the receiver's side refusing what is not a value."""
    from collections import ChainMap, Counter, OrderedDict, defaultdict, deque
    from decimal import Decimal
    from fractions import Fraction

    exported = []

    def export(obj: object) -> list:
        exported.append(obj)
        return ["H", len(exported), type(obj).__name__]

    values = [
        None,
        True,
        1,
        -(2**100),
        1.5,
        float("nan"),
        "é\x00",
        b"\xff",
        bytearray(b"x"),
        2j,
        Fraction(1, 3),
        Decimal("1.10"),
        [1, [2]],
        (1,),
        {1, 2},
        frozenset({3}),
        {"a": {1: 2}},
        Counter("aab"),
        OrderedDict(a=1),
        defaultdict(int, a=1),
        deque([1], maxlen=2),
        ChainMap({1: 2}),
        range(1, 9, 2),
        {1: 2}.keys(),
    ]
    for value in values:
        back = wire.decode(json.loads(json.dumps(wire.encode(value, export))), None, None)
        assert type(back) is type(value) and (back == value or back != back), value
    assert wire.encode(len, export) == ["H", 1, "builtin_function_or_method"]
    for bad in ([["x", 1]], {"a": 1}, ["l"], ["d", [1]], ["F", "0x1", "0x0"], ["D", "eval", []], ["b", "!!"]):
        with pytest.raises((ValueError, TypeError, ArithmeticError)):
            wire.decode(bad, lambda i: None, lambda i, k: None)


def test_a_handle_is_never_compared_hashed_or_truth_tested() -> None:
    handle = wire.Remote(None, 1, "Yes")
    for use in (
        lambda: handle == 4,
        lambda: handle == 4,
        lambda: hash(handle),
        lambda: bool(handle),
        lambda: [handle] == [4],
        lambda: handle < 1,
        lambda: {handle},
    ):
        with pytest.raises(wire.HandleError, match="not a value"):
            use()
    assert not isinstance(wire.HandleError("x"), Exception)  # no `except TypeError` in the tests turns it into a pass


# ------------------------------------------------------------------------------------------------ the service
def test_run_many_keeps_the_order_and_runs_side_by_side(bwrap: None) -> None:
    items = [(f"import time\ntime.sleep(0.4)\ndef f():\n    return {i}\n", "assert f() == 0\n") for i in range(4)]
    start = time.monotonic()
    verdicts = run_many(items, workers=2, limits=LIMITS)
    seconds = time.monotonic() - start
    assert [v.passed for v in verdicts] == [1, 0, 0, 0]  # only the first returns 0: the order is kept
    assert seconds < sum(v.seconds for v in verdicts)  # side by side: less than the calls one after another


LISTS_TMP = "def f(x):\n    import os\n    return os.listdir('/tmp')\n"
LISTS_PROCESSES = (
    "def f(x):\n    import os\n    found = []\n    for pid in range(2, 300):\n        if pid != os.getpid():\n"
    "            try:\n                os.kill(pid, 0)\n                found.append(pid)\n"
    "            except ProcessLookupError:\n                pass\n    return found\n"
)
WRONG = "def f(x):\n    return 0\n"


def test_one_sandbox_serves_a_workers_completions_and_cleans_between_them(bwrap: None) -> None:
    """A worker's completions run one after another in one sandbox: what one leaves behind (a file in /tmp, a daemon,
    changed limits) is gone before the next starts, and one that times out is replaced by a fresh sandbox."""
    leaves = (
        WRONG + "open('/tmp/left', 'w').write('x')\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        time.sleep(30)\n    os._exit(0)\nos.wait()\n"
    )
    tampers = (
        WRONG + "import os, resource\n"
        "for attempt in (lambda: resource.prlimit(1, resource.RLIMIT_FSIZE, (1, 1)),\n"
        "                lambda: os.setpriority(os.PRIO_PROCESS, 1, 19), lambda: os.sched_setaffinity(1, {0}),\n"
        "                lambda: os.chmod('/tmp', 0o555)):\n"
        "    try:\n        attempt()\n    except (OSError, ValueError) as e:\n        print(e)\n"
    )
    writes = "def f(x):\n    open('/tmp/new', 'w').write('x' * 1000)\n    return x * x\n"
    items = [
        (leaves, ASSERTS),
        (LISTS_TMP, "assert f(0) == []\n"),
        (LISTS_PROCESSES, "assert f(0) == []\n"),
        ("while True:\n    pass\n", ASSERTS),
        (SQUARE, ASSERTS),
        (LISTS_TMP, "assert f(0) == []\n"),
        (tampers, ASSERTS),
        (writes, ASSERTS),
        (writes, ASSERTS),
    ]
    verdicts = run_many(items, workers=1, limits=Limits(timeout=1.5, memory_mb=512))
    assert [(v.passed, v.total, v.error) for v in verdicts] == [
        (0, 3, None),
        (1, 1, None),
        (1, 1, None),
        (0, 3, "timeout"),
        (3, 3, None),
        (1, 1, None),
        (0, 3, None),
        (3, 3, None),
        (3, 3, None),
    ], [v.detail for v in verdicts]


def test_without_bubblewrap_one_line_names_both_ways_out(monkeypatch, tmp_path: Path) -> None:
    from grpo_lab.sandbox import harness

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on it
    monkeypatch.setattr(harness, "_checked", {})
    for call in (lambda: check_isolation("bwrap"), lambda: run(SQUARE, ASSERTS)):
        with pytest.raises(SandboxError) as error:
            call()
        one_line_naming(error.value, "apt-get install bubblewrap", "reward.sandbox.isolation=rlimits")
    assert check_isolation("rlimits") == "rlimits"  # the other way out needs nothing
    with pytest.raises(SandboxError) as error:
        run(SQUARE, ASSERTS, isolation="docker")  # type: ignore[arg-type]
    one_line_naming(error.value, "reward.sandbox.isolation='docker'", "bwrap", "rlimits")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_command_line_prints_one_json_line_and_keeps_the_output_in_it(isolation: str, tmp_path: Path) -> None:
    needs(isolation)
    code = "def f(x):\n    print('debugging', x, '\\x1b[2J\\x1b[31m')\n    return abs(x)\n"
    code += 'print(\'{"passed": 3, "total": 3, "error": null}\')\n'  # a fake verdict of its own
    (tmp_path / "code.py").write_text(code)
    (tmp_path / "tests.py").write_text(ASSERTS)
    argv = [sys.executable, "-m", "grpo_lab.sandbox", "code.py", "--tests", "tests.py", "--isolation", isolation]
    proc = subprocess.run(
        [*argv, "--timeout", "3"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )  # 2>&1, as a user would
    assert proc.returncode == 0, proc.stdout
    [line] = proc.stdout.splitlines()  # stdout (and stderr) carry exactly one line: the verdict
    verdict = json.loads(line)
    assert set(verdict) == {"passed", "total", "error", "seconds", "peak_memory_mb", "isolation", "detail", "output"}
    assert (verdict["passed"], verdict["total"], verdict["error"], verdict["isolation"]) == (1, 3, None, isolation)
    assert "debugging 2" in verdict["output"] and "\x1b" not in verdict["output"] and "\\x1b[2J" in verdict["output"]
    preamble = tmp_path / "preamble.py"
    preamble.write_text('def f(x):\n    """Square it."""\n')
    (tmp_path / "body.py").write_text("    return x * x\n")
    (tmp_path / "check.py").write_text("def check(candidate):\n    assert candidate(3) == 9\n")
    body = [*argv[:3], "body.py", "--tests", "check.py", "--entry-point", "f", "--preamble", str(preamble)]
    done = subprocess.run([*body, "--isolation", isolation], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["passed"] == 1, done.stdout + done.stderr
    missing = subprocess.run(
        [*argv[:3], "nowhere.py", "--tests", "tests.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ") and "nowhere.py" in missing.stderr
