"""The one place model-written code runs: a completion and its tests in a forked child of a sandboxed harness.

With ``isolation="bwrap"`` the harness runs under bubblewrap: every namespace unshared (no network, its own pids, no
further user namespaces), the system read-only, home folders and ``/run`` hidden, no ``/proc``, nothing writable but a
private size-capped tmpfs ``/tmp`` (its working folder), an empty environment, and it dies with its caller. As root,
bubblewrap itself runs as ``nobody``: RLIMIT_NPROC never binds uid 0, not even as another uid inside a user namespace
(measured: a limit of 5 let root fork 10 children there; as ``nobody`` the 4th fork failed). The harness (a Python
``-I -S``: the standard library only) is the init of its pid namespace and serves one worker's completions one after
another: each runs in a fresh fork, and between two the harness kills every other process of the namespace and
empties ``/tmp``; a completion that times out or floods its output retires the whole sandbox, and so does its 64th.
Bubblewrap's and Python's start-up are thus paid once per worker and batch (``benchmarks/sandbox.py``).
In the fork, rlimits (CPU seconds, address space, processes, file size, open files) are set before the completion
runs; outside, a wall-clock deadline kills the sandbox's process group (and with it the pid namespace) and output is
read up to a cap.

A pass is decided by a per-call nonce that only the harness knows: it arrives, in a frame the harness reads whole
before it forks, on a socket, and comes back on that socket, with the counts, only after every test has run. The tests
are compiled after the completion ran and run with their own copy of the builtins, so an early exit, a patched
``AssertionError`` or builtin, or a ``check`` of the completion's own cannot pass. Python audit hooks are no security
boundary (bubblewrap is); the fork's hook only refuses the ways a completion could read the nonce back out of its own
process: frames, the garbage collector, ctypes, tracing, signal handlers, new programs and ``/proc/*/mem``; the
harness is undumpable, so a completion cannot trace it either.

``isolation="rlimits"`` runs the same harness without bubblewrap, as the caller's user, one completion per harness:
the completion can reach the network, read the caller's secrets through ``/proc``, write wherever that user can, and
signal the caller; ``tests/test_sandbox.py`` measures which hostile completions it stops.

``python -m grpo_lab.sandbox CODE.py --tests TESTS.py`` runs one completion and prints its verdict as one JSON line.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import json
import marshal
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Literal

from grpo_lab.errors import GrpoLabError, describe

Isolation = Literal["bwrap", "rlimits"]
ISOLATIONS = ("bwrap", "rlimits")
ERRORS = ("syntax", "timeout", "memory", "output_limit", "runtime", "killed", "sandbox")
# The first line of the harness, in the command line of every process of a sandbox: how tests find leftovers.
MARKER = "# grpo_lab.sandbox harness"
NO_BWRAP = (
    "bubblewrap (bwrap) is not installed, and the code reward runs model-written code only inside it: "
    "install it (apt-get install bubblewrap) or run it unisolated with reward.sandbox.isolation=rlimits"
)
_CONTROL_CAP = 1 << 16  # bytes read from the harness's control socket: a verdict is one short line
_ENV_MARK = "GRPO_LAB_SANDBOX_CALL"  # rlimits: finds a call's processes that left its process group


class SandboxError(GrpoLabError):
    """The sandbox cannot run here, or a problem's tests cannot be run (they do not parse, or test nothing)."""


@dataclass(frozen=True)
class Limits:
    """What one completion may use. ``cpu_seconds`` defaults to the wall-clock ``timeout`` rounded up."""

    timeout: float = 5.0  # wall-clock seconds for the whole call, start-up included
    cpu_seconds: int | None = None  # RLIMIT_CPU of each process
    memory_mb: int = 1024  # RLIMIT_AS: address space, so that a memory bomb is a MemoryError
    processes: int = 16  # processes and threads beyond the harness (RLIMIT_NPROC)
    file_size_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 1 << 18  # stdout + stderr read before the child is killed
    tmp_mb: int = 64  # size of the private /tmp (bwrap)

    def rlimits(self) -> tuple[int, ...]:
        """The harness's view: CPU s, address space, processes, file size, open files, alarm s (all bytes/ints)."""
        cpu = self.cpu_seconds or max(1, math.ceil(self.timeout))
        mib = 1 << 20
        alarm = math.ceil(self.timeout) + 2
        return (cpu, self.memory_mb * mib, self.processes, self.file_size_mb * mib, self.open_files, alarm)


@dataclass(frozen=True)
class Verdict:
    """How one completion did: ``passed`` of ``total`` tests, or an ``error`` kind (see :data:`ERRORS`)."""

    passed: int
    total: int
    error: str | None
    seconds: float
    peak_memory_mb: float
    isolation: str
    detail: str = ""  # one line: the first failure, or why there is no verdict
    stdout: str = ""  # what the completion printed, up to Limits.output_bytes
    stderr: str = ""

    @property
    def reward(self) -> float:
        """The fraction of tests passed; 0 on any error."""
        return 0.0 if self.error or not self.total else self.passed / self.total

    def summary(self) -> dict:
        """The JSON line of ``python -m grpo_lab.sandbox``."""
        keys = ("passed", "total", "error", "seconds", "peak_memory_mb", "isolation", "detail")
        return {key: value for key, value in asdict(self).items() if key in keys}


# ------------------------------------------------------------------------------------------------- the harness
# Runs inside the sandbox as `python -I -S -u -B -c _HARNESS <control fd>`. `serve` reads one job (a frame: its length,
# then the marshalled payload) at a time and runs it in a fork, `job`, then reports the fork's end. Under bubblewrap
# the harness is pid 1 of its own pid namespace and serves a worker's completions one after another: between two, it
# kills every other process of the namespace (what a completion left running) and empties /tmp, the only writable
# place; with rlimits it runs one job and exits. The harness itself never runs model code, and is made undumpable so
# that no completion can trace it. In `job`, everything needed after the completion has run is bound to a local
# before it runs: the completion can rebind builtins, module attributes and globals, but it cannot reach the frames
# (the audit hook refuses frames to it).
_HARNESS = (
    MARKER
    + r"""
def serve(control):
    import _signal, marshal, os, resource, sys

    read, write, fork, wait4, exit_now = os.read, os.write, os.fork, os.wait4, os._exit
    serving = os.getpid() == 1  # bubblewrap's pid namespace, of which it is the init
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # an init only gets the signals it handles: Python handles this
    preload(sys)
    if serving:
        undumpable(sys)
    before = state(os, resource)
    write(control, b"ready\n")
    while (payload := read_frame(control, read)) is not None:  # all of it: nothing is left for the completion
        work = marshal.loads(payload)
        # The job reports on a pipe of its own, which the harness relays: it never holds the control socket, so it
        # can neither read the next job from it nor break it for the jobs after it.
        verdict_read, verdict_write = os.pipe()
        pid = fork()
        if pid == 0:
            try:
                os.close(control)
                os.close(verdict_read)
                job(verdict_write, work)
            finally:  # whatever happens in it, a job never comes back to serve
                exit_now(1)
        os.close(verdict_write)
        _, status, usage = wait4(pid, 0)
        dirty = clean(os) or int(state(os, resource) != before) if serving else 0
        report = drain(verdict_read, os)
        os.close(verdict_read)
        cpu, peak_kb = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
        write(control, report + ("\n%s done %d %.3f %d %d\n" % (work[0], status, cpu, peak_kb, dirty)).encode())
        if not serving or dirty:
            break
    exit_now(0)


def state(os, resource):
    # What a completion could change in the harness from outside it (prlimit, setpriority, sched_setaffinity on pid 1,
    # chmod /tmp): if it differs after a job, the sandbox is retired.
    limits = tuple(resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))
    return limits, os.getpriority(os.PRIO_PROCESS, 0), tuple(sorted(os.sched_getaffinity(0))), os.stat("/tmp").st_mode


def drain(fd, os):
    # What the job wrote on its pipe: all of it is there once it has ended (its writer fork is waited for), and a
    # process it left behind may still hold the pipe, so read what is there, without waiting, up to 64 KiB.
    os.set_blocking(fd, False)
    chunks, room = [], 1 << 16
    try:
        while room > 0 and (chunk := os.read(fd, room)):
            chunks.append(chunk)
            room -= len(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def read_frame(control, read):
    wanted, chunks, size = 4, [], None
    while wanted:
        chunk = read(control, min(wanted, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        wanted -= len(chunk)
        if size is None and not wanted:
            size = wanted = int.from_bytes(b"".join(chunks), "big")
            chunks = []
    return b"".join(chunks)


def undumpable(sys):
    # The completions run as its user: without this, one could ptrace the harness and forge later completions' verdicts.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (ImportError, OSError, AttributeError):
        pass
    for name in [name for name in sys.modules if name.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]  # no completion finds ctypes already imported


def clean(os):
    # Between two completions: kill what the last one left running (an init's kill(-1) spares only itself), reap it
    # all, empty /tmp. 1 when /tmp cannot be emptied: the caller retires this sandbox.
    try:
        os.kill(-1, 9)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    try:
        return 0 if wipe("/tmp", os) else 1
    except (OSError, RecursionError):
        return 1


def wipe(folder, os):
    emptied = True
    for entry in os.scandir(folder):
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                emptied = wipe(entry.path, os) and emptied
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            emptied = False
    return emptied


def job(control, work):
    import _imp, _signal, _thread, builtins, gc, os, resource, sys, types

    write, fstat, fork, waitpid, exit_now = os.write, os.fstat, os.fork, os.waitpid, os._exit
    compile_, exec_, str_, type_, dict_, vars_, list_ = compile, exec, str, type, dict, vars, list
    BaseException_, MemoryError_, NameError_, gc_disable = BaseException, MemoryError, NameError, gc.disable
    set_recursion_limit, recursion_limit = sys.setrecursionlimit, sys.getrecursionlimit()
    threads, function_type, modules = _thread._count, types.FunctionType, sys.modules

    nonce, code, segments, entry_point, limits = work
    control_id = (fstat(control).st_dev, fstat(control).st_ino)
    set_limits(limits, os, resource, _signal)

    class Refused(ValueError):  # a ValueError: namedtuple, enum, typing and logging tolerate it from sys._getframe
        pass

    def refuse(*args, **kwargs):
        raise Refused("refused by the grpo_lab sandbox")

    seal(_imp, _signal, os, sys, refuse)
    pristine = dict(builtins.__dict__)
    sys.addaudithook(audit_hook(Refused, blocked, str, bytes, int, type, os.fspath))

    def one_line(error):
        try:  # the completion's exception: its __str__ is the completion's code, so guard everything
            return " ".join(("%s: %s" % (type_(error).__name__, error)).splitlines()).removesuffix(": ")[:300]
        except BaseException_:
            return "an exception that cannot be shown"

    guarded = result_guard(type_, list_, TypeError)
    passed, total, kind, detail = 0, sum(1 for _, is_test in segments if is_test) or 1, "-", ""
    # The modules' contents as the tests will need them: `math.isclose = lambda *a: True` is undone before they run.
    saved = [(vars_(m), dict_(vars_(m))) for m in list_(modules.values()) if type_(m) is type_(sys)]
    imported = dict_.fromkeys(modules)
    try:
        compiled = compile_(code, "<completion>", "exec")
    except MemoryError_ as e:
        kind, detail = "memory", one_line(e)
    except BaseException_ as e:  # SyntaxError, or ValueError for a null byte
        kind, detail = "syntax", one_line(e)
    else:
        solution = type_(sys)("__solution__")
        sys.modules["__solution__"] = solution
        try:
            exec_(compiled, solution.__dict__)
        except MemoryError_ as e:
            kind, detail = "memory", one_line(e)
        except BaseException_ as e:  # SystemExit included: exiting early is no pass
            kind, detail = "runtime", one_line(e)
        if kind == "-" and threads():  # a thread of its own could patch what the tests use while they run
            kind, detail = "runtime", "the completion left a thread running"
    if kind == "-":
        set_recursion_limit(recursion_limit)
        builtins.__dict__.clear()  # undo builtins tampering for the stdlib code the tests call
        builtins.__dict__.update(pristine)
        for contents, copy in saved:
            contents.clear()
            contents.update(copy)
        for name in list_(modules):  # what it imported: the tests import their own, fresh copy
            if name not in imported and name != "__solution__":
                del modules[name]
        # Its names, less those that would shadow a builtin in the tests (`def abs(x): return 0`); its functions
        # answer only plain values (an object whose __eq__ always says yes is no answer).
        names = {k: v for k, v in solution.__dict__.items() if k[:2] != "__" and k not in pristine}
        names = {k: guarded(v) if type_(v) is function_type else v for k, v in names.items()}
        namespace = dict_(names, __builtins__=dict_(pristine), __name__="__tests__")
        for source, is_test in segments:  # compiled now, after the completion: nothing of it can be patched
            try:
                exec_(compile_(source, "<tests>", "exec"), namespace)
            except BaseException_ as e:  # SystemExit included
                detail = detail or one_line(e)
                if not is_test:  # a setup line failed: the tests after it count as failed
                    break
            else:
                passed += is_test
        else:
            if entry_point is not None:
                try:
                    if entry_point not in names:
                        raise NameError_("the completion defines no " + entry_point)
                    namespace["check"](names[entry_point])
                    passed = 1
                except BaseException_ as e:
                    detail = one_line(e)
    line = (nonce + " %d %d %s %s\n" % (passed, total, kind, detail)).encode("utf-8", "replace")

    # Written from a fork: it has one thread, and no at-fork handler or finalizer of the completion runs in it, so
    # nothing can swap the control socket between the check below and the write.
    gc_disable()
    set_recursion_limit(recursion_limit)
    pid = fork()
    if pid == 0:
        if (fstat(control).st_dev, fstat(control).st_ino) == control_id:
            write(control, line)
        exit_now(0)
    waitpid(pid, 0)
    exit_now(0)


def result_guard(type_, list_, TypeError_):
    # A value the tests may compare: builtin types all the way down (a class of the completion's, or any Python
    # class such as unittest.mock.ANY, can make ==, <, abs() and bool() answer whatever it likes).
    heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement

    def plain(value):
        stack, seen = [value], 0
        while stack and seen < 100000:
            item, seen = stack.pop(), seen + 1
            kind = type_(item)
            if kind.__flags__ & heap:
                return kind
            if kind is list or kind is tuple or kind is set or kind is frozenset:
                stack.extend(item)
            elif kind is dict:
                stack.extend(item.keys())
                stack.extend(item.values())
        return None

    def guarded(function):
        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            kind = plain(result)
            if kind is not None:
                raise TypeError_("the completion returned a %s: the tests compare builtin values only" % kind.__name__)
            return result

        return call

    return guarded


def set_limits(limits, os, resource, _signal):
    cpu, memory, processes, file_size, open_files, alarm = limits
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    _signal.alarm(alarm)  # rlimits: ends a harness whose caller died (pid 1 under bwrap ignores it: no need)
    # RLIMIT_NPROC counts every task of the real uid: under bwrap (no /proc) that is the harness and this job.
    tasks = 2 if not os.path.isdir("/proc/self") else 0 if os.getuid() == 0 else tasks_of(os.getuid(), os)
    for which, value in (
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_NPROC, tasks + processes + 1),  # + 1: the fork that writes the verdict
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def tasks_of(uid, os):
    count = 0
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/" + pid + "/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (OSError, ValueError):
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


# Builtins left out of the seal's imports: _elementtree imports xml.etree and re (7 of the 11 ms all the others
# take); without it, ElementTree falls back to its pure-Python code (the refusal is an ImportError).
LAZY = frozenset(("_elementtree",))


def refuse_import(*args, **kwargs):
    raise ImportError("refused by the grpo_lab sandbox: a builtin module imported after the seal")


def preload(sys):
    # Every builtin module, imported once by the harness: after the seal, imports of builtins come from sys.modules ...
    import _warnings

    quiet = ("ignore", None, DeprecationWarning, None, 0)  # spwd and the like warn as they are imported
    _warnings.filters.insert(0, quiet)
    _warnings._filters_mutated()
    for name in sys.builtin_module_names:
        if not blocked(name) and name not in LAZY:
            __import__(name)
    _warnings.filters.remove(quiet)
    _warnings._filters_mutated()


def seal(_imp, _signal, os, sys, refuse):
    # Ways around the audit hook that raise no audit event of their own, closed before the completion runs.
    import types  # its import reads a traceback's tb_frame (for FrameType), which the hook then refuses
    _imp.create_builtin = refuse_import  # ... so no fresh, unsealed copy of _signal or posix can be made
    for name in ("signal", "alarm", "setitimer"):  # a Python signal handler is handed the running frame
        setattr(_signal, name, refuse)
    os.register_at_fork = sys.modules["posix"].register_at_fork = lambda **hooks: None  # nothing runs in forks
    __import__("_posixsubprocess").fork_exec = refuse  # starts programs without an audit event


def blocked(module):  # runs inside the audit hook: no builtins, which the completion may have replaced
    for part in module.split("."):
        if part == "ctypes" or part == "_ctypes" or part.startswith(("_test", "_xx")):
            return True
    return False


def audit_hook(Refused, blocked, str_, bytes_, int_, type_, fspath):
    # Everything it uses is bound here: it runs while the completion runs, after any rebinding the completion did.
    refused = frozenset(
        "sys._getframe sys._getframemodulename sys._current_frames sys._current_exceptions sys.settrace "
        "sys.setprofile sys.addaudithook sys.monitoring.register_callback gc.get_objects gc.get_referrers "
        "gc.get_referents os.exec "
        "os.posix_spawn os.spawn os.system subprocess.Popen".split()
    )
    watched = refused | {"object.__getattr__", "import", "open", "os.symlink"}
    frames = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
    sealed = frozenset(("_signal", "posix", "_imp", "_posixsubprocess"))

    def is_memory(path):  # /proc/<pid>/mem: under bwrap there is no /proc, under rlimits there is
        if type_(path) is int_:
            return False
        if type_(path) is not str_ and type_(path) is not bytes_:
            path = fspath(path)
        if type_(path) is bytes_:
            path = path.decode("utf-8", "replace")
        return str_.rsplit(str_.rstrip(path, "/"), "/", 1)[-1] == "mem"

    def hook(event, args):
        if event not in watched and event[:7] != "ctypes.":
            return
        if (
            event in refused
            or event[:7] == "ctypes."
            or (event == "object.__getattr__" and args[1] in frames)
            or (event == "import" and (blocked(args[0]) or args[0] in sealed))
            or (event in ("open", "os.symlink") and is_memory(args[0]))
        ):
            raise Refused("refused by the grpo_lab sandbox: " + event)

    return hook


import sys

serve(int(sys.argv[1]))
"""
)


# --------------------------------------------------------------------------------------------------- the tests
@dataclass(frozen=True)
class _Plan:
    segments: tuple[tuple[str, bool], ...]  # (source, is it a test?), run in order
    total: int
    call: str | None = None  # an entry point the harness hands to check(candidate) after the segments, as one test


def _plan(tests: str, entry_point: str | None) -> _Plan:
    """The tests as the harness runs them: each top-level statement that asserts is a test, anything else setup.

    With an entry point, the tests define ``check(candidate)`` (HumanEval's layout): its body's statements become the
    segments, after the file's other statements and ``candidate = <entry_point>``, so that the reward is the share
    of its asserts that pass, not all or nothing. A ``check`` whose body cannot stand at the top level (a ``return``)
    or asserts nothing itself is one test, called as a whole.
    """
    try:
        module = ast.parse(tests)
    except SyntaxError as e:
        raise SandboxError(f"the tests do not parse: {e.msg} (line {e.lineno})") from None
    if entry_point is not None:
        if not entry_point.isidentifier():
            raise SandboxError(f"entry_point={entry_point!r} is not a Python name")
        checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
        if not checks:
            raise SandboxError(f"entry_point={entry_point!r} needs tests that define check(candidate)")
        body = checks[-1].body
        if any(isinstance(n, ast.Return) for s in body for n in _outside_functions(s)) or not any(map(_asserts, body)):
            return _Plan(((tests, False),), 1, entry_point)
        nodes = [n for n in module.body if n is not checks[-1]]
        setup = [(_segment(n), False) for n in nodes] + [(f"candidate = {entry_point}", False)]
        segments = (*setup, *((_segment(n), _asserts(n)) for n in body))
    else:
        segments = tuple((_segment(node), _asserts(node)) for node in module.body)
    total = sum(is_test for _, is_test in segments)
    if not total:
        raise SandboxError("the tests have no top-level assert: give assert lines, or check(candidate) and entry_point")
    return _Plan(tuple(segments), total)


def _segment(node: ast.stmt) -> str:
    """One statement on its own line as in the file, so that tracebacks name the right line."""
    return "\n" * (node.lineno - 1) + ast.unparse(node)


def _asserts(node: ast.stmt) -> bool:
    """Whether a statement is (or holds, in a loop or a branch) an assert of its own: then it is a test. HumanEval's
    ``assert True, "..."`` lines test nothing: any code passes them."""
    return any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in _outside_functions(node))


def _outside_functions(node: ast.AST) -> Iterable[ast.AST]:
    """The nodes of a statement, not looking into the functions and classes it defines."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            yield from _outside_functions(child)


def check_tests(tests: str, entry_point: str | None = None) -> int:
    """The number of tests in `tests`; raises a one-line :class:`SandboxError` when the sandbox could not run them
    (they do not parse, assert nothing, or name an entry point without defining ``check(candidate)``)."""
    return _plan(tests, entry_point).total


# ---------------------------------------------------------------------------------------- isolation and launch
_checked: dict[str, str] = {}
_check_lock = threading.Lock()


def check_isolation(isolation: str) -> str:
    """Make sure ``isolation`` works here, once per process; raises a one-line :class:`SandboxError` if not.

    "bwrap" starts a trivial sandbox; "rlimits" runs without namespaces (the caller records the run as not isolated).
    """
    if isolation not in ISOLATIONS:
        raise SandboxError(f"reward.sandbox.isolation={isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == "rlimits":
        return isolation
    with _check_lock:
        if isolation not in _checked:
            if shutil.which("bwrap") is None:
                raise SandboxError(NO_BWRAP)
            with _Harness(Limits(timeout=30), "bwrap") as harness:
                probe = harness.run("x = 1", _plan("assert x == 1", None))
            if probe.passed != 1:
                raise SandboxError(
                    f"bubblewrap could not start the sandbox ({probe.detail or probe.error}): fix it "
                    "(apt-get install bubblewrap; unprivileged user namespaces must be allowed) "
                    "or run it unisolated with reward.sandbox.isolation=rlimits"
                )
            _checked[isolation] = probe.detail
    return isolation


@functools.cache
def _bwrap_options() -> frozenset[str]:
    """The options this bwrap knows (--disable-userns and --size came with 0.8)."""
    text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, check=False).stdout
    return frozenset(word for word in text.split() if word.startswith("--"))


def _others_can_run(path: str) -> bool:
    """Whether a user other than the owner can reach and execute `path` (every folder above it searchable)."""
    path = os.path.realpath(path)
    if not os.path.isfile(path) or not os.stat(path).st_mode & stat.S_IXOTH:
        return False
    folder = os.path.dirname(path)
    while folder != "/":
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return False
        folder = os.path.dirname(folder)
    return True


def _base_python() -> str:
    """This interpreter outside any virtual environment: ``-I -S`` needs only its standard library."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _python(isolation: str) -> str:
    """The interpreter the sandbox runs: this one's base interpreter, or, when bubblewrap runs as `nobody` (we are
    root) and cannot reach it, a system-wide one of the same version."""
    base = _base_python()
    if isolation == "rlimits" or os.geteuid() != 0 or _others_can_run(base):
        return base
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if _others_can_run(candidate):
            return os.path.realpath(candidate)
    raise SandboxError(
        f"as root, the sandbox runs model code as nobody, who cannot reach {base}: install python{version} "
        f"system-wide (apt-get install python{version}) or run unisolated with reward.sandbox.isolation=rlimits"
    )


def _hidden_folders() -> list[str]:
    """Folders that hold secrets (~/.netrc, tokens, sockets): covered by an empty tmpfs inside the sandbox."""
    folders = []
    for folder in sorted({"/root", "/home", "/run", os.path.expanduser("~"), os.environ.get("HOME", "/")}):
        real = os.path.realpath(folder)
        covered = any(real == f or real.startswith(f + "/") for f in folders)  # sorted: parents come first
        if real not in ("/", "/tmp", "/proc", "/dev") and os.path.isdir(real) and not covered:
            folders.append(real)
    return folders


def _bwrap_command(python: str, limits: Limits) -> list[str]:
    options = _bwrap_options()
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1"]
    if "--disable-userns" in options:  # no nested user namespaces: less kernel surface for the completion
        argv += ["--unshare-user", "--disable-userns"]
    # No /proc at all: it would show /proc/self/mem and fds; --proc would also be a fresh one, but nothing needs it.
    argv += ["--ro-bind", "/", "/", "--tmpfs", "/proc", "--dev", "/dev"]
    if "--size" in options:
        argv += ["--size", str(limits.tmp_mb << 20)]
    argv += ["--tmpfs", "/tmp"]
    hidden = _hidden_folders()
    for folder in hidden:
        argv += ["--tmpfs", folder]
    prefix = sys.base_prefix if python == _base_python() else os.path.dirname(os.path.dirname(python))
    if any(prefix.startswith(f + "/") for f in hidden):  # the interpreter lives in a hidden folder: show just it
        argv += ["--ro-bind", prefix, prefix]
    for folder in [*hidden, "/proc", "/dev"]:  # tmpfs without a size cap: writable, they would let it fill the memory
        argv += ["--remount-ro", folder]
    argv += ["--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    return [*argv, "--", python]


def _unprivileged() -> dict:
    """As root, bubblewrap runs as nobody: RLIMIT_NPROC does not bind uid 0, and nobody cannot read root's files."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    except KeyError:
        uid = gid = 65534
    return {"user": uid, "group": gid, "extra_groups": []}


# ------------------------------------------------------------------------------------------------------ a call
def run(
    code: str,
    tests: str,
    *,
    entry_point: str | None = None,
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
) -> Verdict:
    """Run `code`, then `tests` (assert lines, or ``check(candidate)`` with `entry_point`), in a sandbox."""
    plan = _plan(tests, entry_point)
    check_isolation(isolation)
    with _Harness(limits or Limits(), isolation) as harness:
        return harness.run(code, plan)


def run_many(
    items: Iterable[Sequence],
    workers: int | None = None,
    *,
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
) -> list[Verdict]:
    """:func:`run` for a step's completions, side by side: `items` are ``(code, tests[, entry_point])``; the
    verdicts come back in their order. `workers` defaults to the number of CPUs; under bubblewrap each worker's
    sandbox serves its completions one after another, cleaned between two."""
    jobs = []
    for code, tests, *rest in items:
        jobs.append((code, _plan(tests, rest[0] if rest else None)))
    check_isolation(isolation)
    limits = limits or Limits()
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    harnesses: dict[int, _Harness] = {}  # per worker thread: bubblewrap dies with the thread that started it

    def one(job: tuple[str, _Plan]) -> Verdict:
        harness = harnesses.get(threading.get_ident())
        if harness is None or harness.closed:
            harness = harnesses[threading.get_ident()] = _Harness(limits, isolation)
        return harness.run(*job)

    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="grpo_lab_sandbox") as pool:
            return list(pool.map(one, jobs))
    finally:
        for harness in list(harnesses.values()):
            harness.close()


class _Outcome:
    """What the parent saw of one completion."""

    def __init__(self) -> None:
        self.stdout, self.stderr, self.control = bytearray(), bytearray(), bytearray()
        self.timed_out = self.over_output = False
        self.done: tuple[int, float, float, int] | None = None  # the harness's report: status, CPU s, peak KiB, dirty


_START_TIMEOUT = 30.0  # seconds for a sandbox to start (bubblewrap, Python, the builtins): ~40 ms when idle
# Completions one sandbox serves before it is retired: what a cleaning does not reach (System V shared memory and
# message queues of its IPC namespace) cannot pile up past this.
_MAX_JOBS = 64


class _Harness:
    """One sandbox process and its pipes. Under bubblewrap it runs completions one after another until one of them
    times out, floods its output or leaves /tmp dirty, and is then retired (killed as a whole); with rlimits it runs
    one (outside a pid namespace nothing a completion leaves running can be found and killed as reliably)."""

    def __init__(self, limits: Limits, isolation: str) -> None:
        self.limits, self.isolation = limits, isolation
        self.closed, self.problem, self.jobs = False, "", 0
        self.ours, theirs = socket.socketpair()
        self.workdir = self.call_id = None
        if isolation == "bwrap":
            argv, options = _bwrap_command(_python("bwrap"), limits), {"cwd": "/", **_unprivileged()}
            options["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # bwrap's own: no secrets
        else:
            self.workdir, self.call_id = tempfile.mkdtemp(prefix="grpo_lab_sandbox_"), secrets.token_hex(8)
            env = {"PATH": "/usr/bin:/bin", "HOME": self.workdir, "TMPDIR": self.workdir, _ENV_MARK: self.call_id}
            argv, options = [_python("rlimits")], {"cwd": self.workdir, "env": env}
        argv += ["-I", "-S", "-u", "-B", "-c", _HARNESS, str(theirs.fileno())]
        try:
            self.child: subprocess.Popen | None = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # its own process group, killed as a whole
                **options,
            )
        except OSError as e:
            self.child, self.problem, self.closed = None, f"could not start {argv[0]}: {e}", True
        finally:
            theirs.close()
        if self.child is not None:
            self._start()

    def __enter__(self) -> _Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        """Wait for the harness's `ready`: it has imported what it needs."""
        outcome = _Outcome()
        self._collect(outcome, time.monotonic() + _START_TIMEOUT, until=b"ready\n")
        if not outcome.control.startswith(b"ready\n"):
            lines = outcome.stderr.decode("utf-8", "replace").strip().splitlines()
            self.problem = lines[0] if lines else "the harness did not start"
            self.close()

    def run(self, code: str, plan: _Plan) -> Verdict:
        """One completion and its tests: the payload as one frame, then what comes back until the harness says done."""
        start, outcome = time.monotonic(), _Outcome()
        if self.closed:
            outcome.stderr += self.problem.encode()
            return _judge(outcome, "", plan, start, self.limits, self.isolation)
        nonce = secrets.token_hex(16)
        payload = marshal.dumps((nonce, code, plan.segments, plan.call, self.limits.rlimits()), 4)
        deadline = start + self.limits.timeout
        with contextlib.suppress(OSError):  # a harness that died: the verdict says so
            self.ours.settimeout(max(0.01, deadline - time.monotonic()))
            self.ours.sendall(len(payload).to_bytes(4, "big") + payload)
        self.ours.setblocking(False)
        self._collect(outcome, deadline, until=re.compile(rb"%s done (\d+) ([\d.]+) (\d+) (\d)\n" % nonce.encode()))
        self.jobs += 1
        over = outcome.over_output or outcome.timed_out or outcome.done is None or outcome.done[3]
        if over or self.isolation != "bwrap" or self.jobs >= _MAX_JOBS:
            self.close()  # it timed out, flooded, died, left /tmp dirty, served its share, or runs one only
        return _judge(outcome, nonce, plan, start, self.limits, self.isolation)

    def _collect(self, outcome: _Outcome, deadline: float, until: bytes | re.Pattern) -> None:
        """Read stdout, stderr and the control socket until `until` arrives on the control socket, the harness exits,
        the deadline passes or the output runs over its cap."""
        child, cap = self.child, self.limits.output_bytes
        streams = {child.stdout.fileno(): outcome.stdout, child.stderr.fileno(): outcome.stderr}
        streams[self.ours.fileno()] = outcome.control
        with selectors.DefaultSelector() as selector:
            for fd in streams:
                selector.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(min(left, 0.05)):  # short waits: a dead harness shows as EOF or exit
                    try:
                        data = os.read(key.fd, 1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:  # ECONNRESET: a sandbox process shut the control socket
                        data = b""
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    streams[key.fd] += data
                    if len(outcome.stdout) + len(outcome.stderr) > cap or len(outcome.control) > _CONTROL_CAP:
                        outcome.over_output = True
                        return
                    if key.fd == self.ours.fileno() and self._arrived(outcome, until):
                        self._drain(outcome)
                        return
                if child.poll() is not None:  # what it wrote before it exited is still to be read
                    self._drain(outcome)
                    self._arrived(outcome, until)
                    return
            outcome.timed_out = True

    @staticmethod
    def _arrived(outcome: _Outcome, until: bytes | re.Pattern) -> bool:
        if isinstance(until, bytes):
            return outcome.control.startswith(until)
        match = until.search(outcome.control)
        if match is None:
            return False
        outcome.done = (int(match[1]), float(match[2]), float(match[3]), int(match[4]))
        return True

    def _drain(self, outcome: _Outcome) -> None:
        """What the completion (and the harness) wrote before it ended, all of it: it is in the pipes and the socket
        before the harness reports done, and left there it would be counted as the next completion's."""
        cap = self.limits.output_bytes
        pipes = ((self.child.stdout.fileno(), outcome.stdout), (self.child.stderr.fileno(), outcome.stderr))
        for fd, into in (*pipes, (self.ours.fileno(), outcome.control)):
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):  # EAGAIN: nothing more
                while data := os.read(fd, 1 << 16):
                    into += data
                    if len(outcome.stdout) + len(outcome.stderr) > cap or len(outcome.control) > _CONTROL_CAP:
                        outcome.over_output = True
                        return

    def close(self) -> None:
        """Kill the sandbox as a whole (under bubblewrap, its pid namespace dies with it) and reap it."""
        if self.closed:
            return
        self.closed = True
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
            if self.call_id is not None:  # rlimits: processes that called setsid() left the group
                _kill_marked(self.call_id)
            self.child.wait()
            self.child.stdout.close()
            self.child.stderr.close()
        self.ours.close()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _kill_marked(call_id: str) -> None:
    """SIGKILL every process whose environment carries this call's mark (rlimits mode has no pid namespace)."""
    mark = f"{_ENV_MARK}={call_id}".encode()
    for _ in range(3):  # one that forked while we looked is found the next time
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
                os.kill(int(pid), signal.SIGKILL)
                found = True
            except (OSError, ValueError):
                continue
        if not found:
            return


def _judge(outcome: _Outcome, nonce: str, plan: _Plan, start: float, limits: Limits, isolation: str) -> Verdict:
    """The verdict: the harness's line if it carries this call's nonce, else why there is none."""
    done = outcome.done

    def verdict(error: str | None, detail: str, passed: int = 0) -> Verdict:
        return Verdict(
            passed=passed,
            total=plan.total,
            error=error,
            seconds=round(time.monotonic() - start, 3),
            peak_memory_mb=round(done[2] / 1024, 1) if done else 0.0,
            isolation=isolation,
            detail=detail,
            stdout=outcome.stdout[: limits.output_bytes].decode("utf-8", "replace"),
            stderr=outcome.stderr[: limits.output_bytes].decode("utf-8", "replace"),
        )

    if outcome.timed_out:
        return verdict("timeout", f"ran past {limits.timeout:g} s")
    if outcome.over_output:
        return verdict("output_limit", f"wrote more than {limits.output_bytes} bytes")
    found = re.search(rb"%s (\d+) (\d+) (\S+) ?([^\n]*)\n" % nonce.encode(), outcome.control) if nonce else None
    if found:  # only the harness knows the nonce
        passed, total, kind = int(found[1]), int(found[2]), found[3].decode("utf-8", "replace")
        detail = found[4].decode("utf-8", "replace")
        if total != plan.total or not 0 <= passed <= total or kind not in ("-", "syntax", "runtime", "memory"):
            return verdict("sandbox", f"the harness reported {passed}/{total} {kind}")
        return verdict(None if kind == "-" else kind, detail, passed if kind == "-" else 0)
    if done is None:
        lines = outcome.stderr.decode("utf-8", "replace").strip().splitlines()
        return verdict("sandbox", lines[0] if lines else "the sandbox ended before its report")
    code = os.waitstatus_to_exitcode(done[0])
    cpu_limit = limits.rlimits()[0]
    if -code in (signal.SIGKILL, signal.SIGXCPU) and done[1] >= cpu_limit - 0.05:
        return verdict("timeout", f"used its {cpu_limit} s of CPU")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-code}"
        return verdict("killed", f"killed by {name}")
    if b"MemoryError" in outcome.stderr:
        return verdict("memory", "MemoryError")
    return verdict("runtime", f"exited with {code} before its tests ended")


# ---------------------------------------------------------------------------------------------------- the CLI
def main(argv: list[str] | None = None) -> int:
    """`python -m grpo_lab.sandbox CODE.py --tests TESTS.py`: one completion's verdict as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.sandbox", description=main.__doc__)
    parser.add_argument("code", help="the completion's code")
    parser.add_argument("--tests", required=True, help="assert lines, or check(candidate) with --entry-point")
    parser.add_argument("--entry-point", default=None, help="the function the tests' check(candidate) receives")
    parser.add_argument("--isolation", choices=ISOLATIONS, default="bwrap")
    parser.add_argument("--timeout", type=float, default=Limits.timeout, help="wall-clock seconds")
    options = parser.parse_args(argv)
    try:
        with open(options.code) as code, open(options.tests) as tests:
            verdict = run(
                code.read(),
                tests.read(),
                entry_point=options.entry_point,
                limits=Limits(timeout=options.timeout),
                isolation=options.isolation,
            )
    except (GrpoLabError, OSError) as e:
        print(f"Error: {describe(e)}", file=sys.stderr)
        return 1
    sys.stderr.write(verdict.stdout + verdict.stderr)  # what the completion printed, to debug it by hand
    print(json.dumps(verdict.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
