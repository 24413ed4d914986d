"""The code reward's sandbox (issue #28 items 2 and 6): real bubblewrap, real subprocesses, hostile completions.

Each hostile completion runs in a throwaway "trainer" process that holds WANDB_API_KEY and HF_TOKEN in its
environment from its start (so that /proc/<pid>/environ shows them) and calls ``sandbox.run``; the test checks what
the completion could do: pass, overrun its time, see a secret, write outside, reach a loopback server, leave a process,
start more processes than its cap, or kill its caller. Under bubblewrap it must do none of these; ``rlimits`` alone
records exactly which of them it cannot stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from grpo_lab import sandbox
from grpo_lab.sandbox import MARKER, Limits, SandboxError, check_isolation, run, run_many

from conftest import REPO, one_line_naming, skip_here

LIMITS = Limits(timeout=1.5, memory_mb=512, processes=8, output_bytes=1 << 16)
MARGIN = 1.0  # seconds a call may take beyond its timeout: killing, reaping, the first call's probe
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


# ------------------------------------------------------------------------------------------------- ordinary code
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_correct_code_passes_every_assert(isolation: str) -> None:
    needs(isolation)
    verdict = run(SQUARE, ASSERTS, limits=LIMITS, isolation=isolation)
    assert (verdict.passed, verdict.total, verdict.error, verdict.reward) == (3, 3, None, 1.0)
    assert verdict.isolation == isolation
    assert 0 < verdict.seconds < LIMITS.timeout
    assert verdict.peak_memory_mb > 1


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_wrong_code_gets_the_asserts_it_passes(isolation: str) -> None:
    needs(isolation)
    verdict = run("def f(x):\n    return abs(x)\n", ASSERTS, limits=LIMITS, isolation=isolation)
    assert (verdict.passed, verdict.total, verdict.error) == (1, 3, None)  # only f(-1) == 1
    assert verdict.reward == pytest.approx(1 / 3)
    assert verdict.detail.startswith("AssertionError")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_syntax_error(isolation: str) -> None:
    needs(isolation)
    verdict = run("def f(x) return x * x\n", ASSERTS, limits=LIMITS, isolation=isolation)
    assert (verdict.passed, verdict.total, verdict.error, verdict.reward) == (0, 3, "syntax", 0.0)
    assert "SyntaxError" in verdict.detail


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_each_assert_of_a_check_function_is_a_test(isolation: str) -> None:
    """HumanEval's layout: check(candidate) and an entry point; the reward is the share of its asserts that pass."""
    needs(isolation)
    tests = "LIMIT = 3\ndef check(candidate):\n    assert candidate(3) == 9\n    assert True\n"
    tests += "    assert candidate(0) == 0\n"
    tests += "    for x in range(LIMIT):\n        assert candidate(-x) == x * x\n"
    good = run(SQUARE, tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert (good.passed, good.total, good.error, good.reward) == (3, 3, None, 1.0)  # `assert True` tests nothing
    bad = run("def f(x):\n    return 3 * x\n", tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert (bad.passed, bad.total, bad.error) == (2, 3, None)  # f(3) == 9 and f(0) == 0
    missing = run("def g(x):\n    return x * x\n", tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert (missing.passed, missing.reward) == (0, 0.0) and "name 'f' is not defined" in missing.detail


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_check_function_that_cannot_be_split_is_one_test(isolation: str) -> None:
    needs(isolation)
    tests = "def check(candidate):\n    if candidate(0) != 0:\n        return\n    assert candidate(3) == 9\n"
    good = run(SQUARE, tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert (good.passed, good.total, good.error) == (1, 1, None)
    bad = run("def f(x):\n    return 2 * x\n", tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert (bad.passed, bad.total) == (0, 1)
    missing = run("def g(x):\n    return x * x\n", tests, entry_point="f", limits=LIMITS, isolation=isolation)
    assert missing.passed == 0 and "defines no f" in missing.detail


def test_setup_lines_are_not_tests_and_a_failing_one_fails_the_rest(bwrap: None) -> None:
    tests = "import math\ndef near(a, b):\n    return math.isclose(a, b)\nassert near(f(2), 4)\nassert f(3) == 9\n"
    assert run(SQUARE, tests, limits=LIMITS).passed == 2
    broken = "assert f(2) == 4\nundefined_helper()\nassert f(3) == 9\n"
    verdict = run(SQUARE, broken, limits=LIMITS)
    assert (verdict.passed, verdict.total, verdict.error) == (1, 2, None)
    assert "NameError" in verdict.detail


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_ordinary_standard_library_code_is_not_refused(isolation: str) -> None:
    """What the harness's audit hook refuses must not break what completions ordinarily use."""
    needs(isolation)
    code = """
import collections, dataclasses, enum, functools, itertools, logging, random, re, subprocess, threading, typing

Point = collections.namedtuple("Point", "x y")
Color = enum.Enum("Color", "RED GREEN")

class Pair(typing.NamedTuple):
    a: int
    b: int

@dataclasses.dataclass
class Box:
    size: int

@functools.lru_cache
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def f(x):
    logging.getLogger("completion").warning("computing %s", x)
    results = []
    worker = threading.Thread(target=lambda: results.append(x * x))
    worker.start()
    worker.join()
    return results[0]

def checks():
    return (Point(1, 2).y, Color.GREEN.value, Pair(1, 2).b, Box(3).size, fib(20), len(re.findall("a", "banana")),
            list(itertools.accumulate([1, 2, 3]))[-1], random.Random(0).randint(0, 0))
"""
    tests = ASSERTS + "assert checks() == (2, 2, 2, 3, 6765, 3, 6, 0)\n"
    verdict = run(code, tests, limits=LIMITS, isolation=isolation)
    assert (verdict.passed, verdict.total, verdict.error) == (4, 4, None), verdict


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_peak_memory_is_the_completions(isolation: str) -> None:
    needs(isolation)
    verdict = run(SQUARE + "block = b'x' * (120 << 20)\n", ASSERTS, limits=LIMITS, isolation=isolation)
    assert verdict.passed == 3
    assert 120 <= verdict.peak_memory_mb < 300


def test_run_many_keeps_the_order_and_runs_side_by_side(bwrap: None) -> None:
    items = [(f"import time\ntime.sleep(0.4)\ndef f():\n    return {i}\n", "assert f() == 0\n") for i in range(4)]
    start = time.monotonic()
    verdicts = run_many(items, workers=2, limits=LIMITS)
    seconds = time.monotonic() - start
    assert [v.passed for v in verdicts] == [1, 0, 0, 0]  # only the first returns 0: the order is kept
    items[2] = (items[2][0].replace("return 2", "return 0"), items[2][1])
    assert [v.passed for v in run_many(items, workers=2, limits=LIMITS)] == [1, 0, 1, 0]
    assert seconds < sum(v.seconds for v in verdicts)  # side by side: less than the calls one after another


LISTS_TMP = "def f(x):\n    import os\n    return os.listdir('/tmp')\n"
# The pids of this sandbox's other processes: the harness is 1, this completion is itself; anything else was left.
LISTS_PROCESSES = (
    "def f(x):\n    import os\n    found = []\n    for pid in range(2, 300):\n        if pid != os.getpid():\n"
    "            try:\n                os.kill(pid, 0)\n                found.append(pid)\n"
    "            except ProcessLookupError:\n                pass\n    return found\n"
)


def test_one_sandbox_serves_a_workers_completions_and_cleans_between_them(bwrap: None) -> None:
    """Under bubblewrap a worker's completions run one after another in one sandbox: what one leaves behind (a file in
    /tmp, a daemon) is gone before the next starts, and one that times out is replaced by a fresh sandbox."""
    leaves = (
        WRONG + "open('/tmp/left', 'w').write('x')\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        time.sleep(30)\n    os._exit(0)\nos.wait()\n"
    )
    # What one completion does to the sandbox that serves it, for the ones after it: its limits, priority and CPUs,
    # /tmp's mode, every socket and pipe it holds.
    tampers = (
        WRONG + "import os, resource, socket, stat\n"
        "for attempt in (lambda: resource.prlimit(1, resource.RLIMIT_FSIZE, (1, 1)),\n"
        "                lambda: os.setpriority(os.PRIO_PROCESS, 1, 19), lambda: os.sched_setaffinity(1, {0}),\n"
        "                lambda: os.chmod('/tmp', 0o555)):\n"
        "    try:\n        attempt()\n    except (OSError, ValueError) as e:\n        print(e)\n"
        "for fd in range(3, 64):\n    try:\n        mode = os.fstat(fd).st_mode\n"
        "        if stat.S_ISSOCK(mode):\n            socket.socket(fileno=fd).shutdown(socket.SHUT_RDWR)\n"
        "        elif stat.S_ISFIFO(mode):\n            os.set_blocking(fd, False)\n"
        "    except OSError:\n        pass\n"
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
    verdicts = run_many(items, workers=1, limits=LIMITS)
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


def test_tests_that_cannot_run_are_one_line_errors() -> None:
    with pytest.raises(SandboxError) as error:
        run(SQUARE, "assert f(2) ==\n", isolation="rlimits")
    one_line_naming(error.value, "the tests do not parse", "line 1")
    with pytest.raises(SandboxError) as error:
        run(SQUARE, "x = f(2)\n", isolation="rlimits")
    one_line_naming(error.value, "assert", "check(candidate)")
    with pytest.raises(SandboxError) as error:
        run(SQUARE, ASSERTS, entry_point="f", isolation="rlimits")
    one_line_naming(error.value, "entry_point='f'", "check(candidate)")
    with pytest.raises(SandboxError) as error:
        run(SQUARE, ASSERTS, isolation="docker")  # type: ignore[arg-type]
    one_line_naming(error.value, "reward.sandbox.isolation='docker'", "bwrap", "rlimits")


def test_without_bubblewrap_one_line_names_both_ways_out(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on it
    monkeypatch.setattr(sandbox, "_checked", {})
    for call in (lambda: check_isolation("bwrap"), lambda: run(SQUARE, ASSERTS)):
        with pytest.raises(SandboxError) as error:
            call()
        one_line_naming(error.value, "apt-get install bubblewrap", "reward.sandbox.isolation=rlimits")
    assert check_isolation("rlimits") == "rlimits"  # the other way out needs nothing


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_command_line_prints_one_json_line(isolation: str, tmp_path: Path) -> None:
    needs(isolation)
    (tmp_path / "code.py").write_text("def f(x):\n    print('debugging', x)\n    return abs(x)\n")
    (tmp_path / "tests.py").write_text(ASSERTS)
    argv = [sys.executable, "-m", "grpo_lab.sandbox", "code.py", "--tests", "tests.py", "--isolation", isolation]
    proc = subprocess.run([*argv, "--timeout", "3"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    verdict = json.loads(line)
    assert set(verdict) == {"passed", "total", "error", "seconds", "peak_memory_mb", "isolation", "detail"}
    assert (verdict["passed"], verdict["total"], verdict["error"], verdict["isolation"]) == (1, 3, None, isolation)
    assert "debugging 2" in proc.stderr  # what the completion printed, to debug it by hand
    missing = subprocess.run(
        [*argv[:3], "nowhere.py", "--tests", "tests.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ") and "nowhere.py" in missing.stderr


# ------------------------------------------------------------------------------------------- hostile completions
# Placeholders, filled per test: PORT (a loopback server), HOME_PROBE / REPO_PROBE (files that must not appear),
# SECRET_FILE (a file in the home folder holding a secret).
WRONG = "def f(x):\n    return 0\n"
# The two pids above the completion's process (the harness, then the caller: the throwaway trainer), read from /proc
# (none where there is none). Never further: as root, killing every ancestor would take the test runner down.
ANCESTORS = (
    "def ancestors():\n    found, pid = [], os.getppid()\n    while pid > 1 and len(found) < 2:\n"
    "        found.append(pid)\n"
    "        try:\n            pid = int(open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[1])\n"
    "        except OSError:\n            break\n    return found\n"
)
HOSTILE: dict[str, tuple[str, str, str | None]] = {
    "infinite_loop": ("while True:\n    pass\n", ASSERTS, None),
    # 2**7 processes at most, so that a sandbox that cannot cap processes does not take the machine down.
    "fork_bomb": (
        "import os, time\nfor _ in range(7):\n    try:\n        os.fork()\n    except OSError:\n        break\n"
        "print('P', flush=True)\ntime.sleep(30)\n",
        ASSERTS,
        None,
    ),
    "memory_bomb": ("block = bytearray(8 << 30)\n" + SQUARE, ASSERTS, None),
    "output_flood": (
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n",
        ASSERTS,
        None,
    ),
    "write_home": (
        WRONG + "try:\n    open('HOME_PROBE', 'w').write('pwned')\nexcept OSError as e:\n    print(e)\n",
        ASSERTS,
        None,
    ),
    "write_repo": (
        WRONG + "try:\n    open('REPO_PROBE', 'w').write('pwned')\nexcept OSError as e:\n    print(e)\n",
        ASSERTS,
        None,
    ),
    # Every ancestor's environment: the parent is the sandbox's harness, the trainer is further up.
    "secret_environ": (
        WRONG + "import os\nprint(dict(os.environ))\n" + ANCESTORS + "for pid in [*ancestors(), 1, 'self']:\n"
        "    try:\n        print(pid, open('/proc/%s/environ' % pid, 'rb').read())\n    except OSError as e:\n"
        "        print(pid, e)\n",
        ASSERTS,
        None,
    ),
    "secret_file": (
        WRONG + "try:\n    print(open('SECRET_FILE').read())\nexcept OSError as e:\n    print(e)\n",
        ASSERTS,
        None,
    ),
    "network": (
        WRONG + "import socket\nfor host in ('127.0.0.1', 'localhost'):\n    try:\n"
        "        socket.create_connection((host, PORT), timeout=0.5).sendall(b'hello')\n        print('connected')\n"
        "    except OSError as e:\n        print(host, e)\n",
        ASSERTS,
        None,
    ),
    # Its parent, then every ancestor it can find (the trainer is the harness's parent).
    "kill_parent": (
        WRONG + "import os, time\n" + ANCESTORS + "for pid in [os.getppid(), *ancestors()]:\n    try:\n"
        "        os.kill(pid, 9)\n    except OSError as e:\n        print(pid, e)\ntime.sleep(0.2)\n",
        ASSERTS,
        None,
    ),
    "sys_exit": ("import sys\nsys.exit(0)\n" + SQUARE, ASSERTS, None),
    "os_exit": ("import os\nprint('all tests passed')\nos._exit(0)\n" + SQUARE, ASSERTS, None),
    "redefine_check": (
        "import builtins\ndef f(x):\n    return 0\ndef check(candidate):\n    return True\n"
        "class NotAnAssertion(Exception):\n    pass\nbuiltins.AssertionError = NotAnAssertion\n"
        "builtins.isinstance = lambda *args: True\nbuiltins.len = lambda x: 0\n",
        "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n",
        "f",
    ),
    "redefine_helper": (
        WRONG + "def same(a, b):\n    return True\n",
        "def same(a, b):\n    return a == b\nassert same(f(2), 4)\nassert same(f(3), 9)\n",
        None,
    ),
    "fake_nonce": (
        "import os\nfor fd in range(1, 64):\n    try:\n"
        "        os.write(fd, b'\\n' + b'0123456789abcdef' * 2 + b' 3 3 - \\n')\n    except OSError:\n        pass\n"
        "os._exit(0)\n",
        ASSERTS,
        None,
    ),
    # Reads the nonce out of the harness's own process by every way the audit hook refuses, then forges the verdict.
    "steal_nonce": (
        """import gc, os, re, sys, time
found = set()
def grab(get):
    try:
        found.update(re.findall(r"[0-9a-f]{32}", repr(get())))
    except BaseException:
        pass
def stack(frame):
    seen = []
    while frame is not None:
        seen.append(dict(frame.f_locals))
        frame = frame.f_back
    return seen
def from_traceback():
    try:
        raise ZeroDivisionError
    except ZeroDivisionError as e:
        return stack(e.__traceback__.tb_frame)
grab(lambda: stack(sys._getframe()))
grab(lambda: [stack(f) for f in sys._current_frames().values()])
grab(from_traceback)
grab(lambda: [o for o in gc.get_objects() if isinstance(o, dict)])
grab(lambda: open("/proc/self/mem", "rb").read(1))
def on_alarm(signum, frame):
    grab(lambda: stack(frame))
def with_handler(module):
    module.signal(module.SIGALRM, on_alarm)
    module.setitimer(module.ITIMER_REAL, 0.01)
    time.sleep(0.05)
grab(lambda: with_handler(__import__("signal")))
def fresh_signal():
    import _imp
    from importlib.machinery import BuiltinImporter, ModuleSpec
    with_handler(_imp.create_builtin(ModuleSpec("_signal", BuiltinImporter)))
grab(fresh_signal)
grab(lambda: __import__("ctypes"))
print("found", len(found))
for guess in found:
    for fd in range(1, 64):
        try:
            os.write(fd, (guess + " 3 3 - \\n").encode())
        except OSError:
            pass
os._exit(0)
""",
        ASSERTS,
        None,
    ),
    # Swaps its own socket in for the control socket and forwards the honest verdict with "3 of 3" passed.
    "intercept_verdict": (
        WRONG
        + """import os, socket, stat, threading
for fd in range(3, 64):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode):
            control = fd
            break
    except OSError:
        pass
real = os.dup(control)
mine, theirs = socket.socketpair()
os.dup2(mine.fileno(), control)
def forward():
    nonce, passed, total, rest = theirs.recv(4096).split(b" ", 3)
    os.write(real, b" ".join([nonce, total, total, rest]))
threading.Thread(target=forward, daemon=True).start()
""",
        ASSERTS,
        None,
    ),
    # Names that shadow the builtins the tests call: abs(f(2) - 4) is 0, sorted([...]) is [1].
    "shadow_builtins": (
        WRONG + "def abs(x):\n    return 0\ndef sorted(x):\n    return [1]\n",
        "assert abs(f(2) - 4) < 1e-6\nassert sorted([f(1)]) == [1]\n",
        None,
    ),
    # Answers that equal anything: its own class, and a Python class of the standard library.
    "always_equal": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
        "def f(x):\n    return [Yes()]\n",
        "assert f(2) == [4]\nassert f(3) == [9]\n",
        None,
    ),
    "mock_any": ("from unittest.mock import ANY\ndef f(x):\n    return ANY\n", ASSERTS, None),
    # A module the tests import, patched by the completion, and by a thread it leaves running.
    "patch_module": (
        WRONG + "import math\nmath.isclose = lambda *args, **kwargs: True\n",
        "import math\nassert math.isclose(f(2), 4)\nassert math.isclose(f(3), 9)\n",
        None,
    ),
    "patching_thread": (
        WRONG + "import math, threading, time\ndef patch():\n    while True:\n"
        "        math.isclose = lambda *args, **kwargs: True\n        time.sleep(0.001)\n"
        "threading.Thread(target=patch, daemon=True).start()\n",
        "import math\nassert math.isclose(f(2), 4)\nassert math.isclose(f(3), 9)\n",
        None,
    ),
    "realtime_signal": ("import os\nos.kill(os.getpid(), 40)\n" + SQUARE, ASSERTS, None),
    "segfault": (
        "try:\n    import ctypes\n    ctypes.string_at(0)\nexcept Exception as e:\n    print(e)\n"
        "import faulthandler\nfaulthandler._read_null()\n" + SQUARE,
        ASSERTS,
        None,
    ),
    "sleep": ("import time\ntime.sleep(30)\n" + SQUARE, ASSERTS, None),
    "daemon": (
        WRONG + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(30)\n"
        "    os._exit(0)\nos.wait()\n",
        ASSERTS,
        None,
    ),
}

# What rlimits alone cannot stop (the completion runs as the caller's user, with its network and files), measured.
RLIMITS_CANNOT_STOP = {
    "network": {"reached the loopback server"},
    "secret_environ": {"saw a secret"},  # the caller's /proc/<pid>/environ
    "secret_file": {"saw a secret"},
    "write_home": {"wrote outside"},
    "write_repo": {"wrote outside"},
    "kill_parent": {"killed its caller"},
}
if os.geteuid() == 0:  # RLIMIT_NPROC does not bind uid 0
    RLIMITS_CANNOT_STOP["fork_bomb"] = {"started more processes than its cap"}

# The throwaway trainer: run() in a process of its own, its verdict as JSON on stdout.
TRAINER = """
import json, sys, time
from grpo_lab.sandbox import Limits, run
job = json.load(sys.stdin)
start = time.monotonic()
verdict = run(job["code"], job["tests"], entry_point=job["entry_point"], limits=Limits(**job["limits"]),
              isolation=job["isolation"])
print(json.dumps({**verdict.summary(), "reward": verdict.reward, "stdout": verdict.stdout, "stderr": verdict.stderr,
                  "wall": time.monotonic() - start}))
"""


def sandbox_processes() -> list[psutil.Process]:
    """Live processes of any sandbox: the harness's first line is in the command line of each, forks included."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and MARKER in " ".join(process.info["cmdline"] or ()):
            found.append(process)
    return found


def attack(name: str, isolation: str, monkeypatch) -> list[str]:
    """Run one hostile completion through a throwaway trainer; what it managed to do, [] if nothing."""
    tag = uuid.uuid4().hex
    home_probe, repo_probe = Path.home() / f".grpo_lab_sandbox_probe_{tag}", REPO / f".grpo_lab_sandbox_probe_{tag}"
    secret_file, secrets = Path.home() / f".grpo_lab_sandbox_secret_{tag}", (f"wandb-{tag}", f"hf_{tag}")
    monkeypatch.setenv("WANDB_API_KEY", secrets[0])
    monkeypatch.setenv("HF_TOKEN", secrets[1])
    code, tests, entry_point = HOSTILE[name]
    server = socket.create_server(("127.0.0.1", 0))
    placeholders = {"PORT": str(server.getsockname()[1]), "HOME_PROBE": str(home_probe), "REPO_PROBE": str(repo_probe)}
    for key, value in {**placeholders, "SECRET_FILE": str(secret_file)}.items():
        code = code.replace(key, value)
    limits = {field: getattr(LIMITS, field) for field in ("timeout", "memory_mb", "processes", "output_bytes")}
    job = {"code": code, "tests": tests, "entry_point": entry_point, "limits": limits, "isolation": isolation}
    temporary = set(Path(tempfile.gettempdir()).glob("grpo_lab_sandbox_*"))
    secret_file.write_text(secrets[0])
    try:
        trainer = subprocess.run(
            [sys.executable, "-c", TRAINER], input=json.dumps(job), capture_output=True, text=True, timeout=60
        )
        return findings(trainer, secrets, (home_probe, repo_probe), server, name)
    finally:
        server.close()
        for path in (home_probe, repo_probe, secret_file):
            path.unlink(missing_ok=True)
        for process in sandbox_processes():
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end between the listing and the kill
                process.kill()
        for folder in set(Path(tempfile.gettempdir()).glob("grpo_lab_sandbox_*")) - temporary:
            shutil.rmtree(folder, ignore_errors=True)  # a killed trainer leaves its working folder


def findings(trainer, secrets, probes, server, name) -> list[str]:
    found = []
    if trainer.returncode != 0:
        found.append("killed its caller")
        assert trainer.returncode == -9, trainer.stderr[-3000:]  # nothing else may end it
    else:
        verdict = json.loads(trainer.stdout)
        if verdict["reward"] != 0 or (verdict["error"] is None and verdict["passed"] == verdict["total"]):
            found.append("passed")
        if verdict["wall"] > LIMITS.timeout + MARGIN:
            found.append("overran its time limit")
        if any(s in verdict["stdout"] + verdict["stderr"] + verdict["detail"] for s in secrets):
            found.append("saw a secret")
        if name == "fork_bomb" and verdict["stdout"].count("P") > LIMITS.processes + 2:
            found.append("started more processes than its cap")
    if any(probe.exists() for probe in probes):
        found.append("wrote outside")
    server.setblocking(False)
    try:
        server.accept()[0].close()
        found.append("reached the loopback server")
    except BlockingIOError:
        pass
    deadline = time.monotonic() + 2  # a killed process may take a moment to go
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    if sandbox_processes():
        found.append("left a process")
    return found


@pytest.mark.parametrize("name", HOSTILE)
def test_bubblewrap_stops_every_hostile_completion(name: str, bwrap: None, monkeypatch) -> None:
    assert attack(name, "bwrap", monkeypatch) == []


@pytest.mark.parametrize("name", HOSTILE)
def test_rlimits_alone_stops_only_part_of_the_matrix(name: str, monkeypatch) -> None:
    """The weaker mode, recorded: each case does exactly what RLIMITS_CANNOT_STOP says, and no more."""
    expected = RLIMITS_CANNOT_STOP.get(name, set())
    assert set(attack(name, "rlimits", monkeypatch)) == expected
    if expected:
        pytest.xfail(f"rlimits alone cannot stop it: it {', '.join(sorted(expected))}")
