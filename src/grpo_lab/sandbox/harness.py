"""The caller's side: two sandboxes per worker, each job's halves handed to them, the verdict read from the judge.

A worker holds two sandbox processes, started once and serving its completions one after another (bubblewrap and
Python's start-up paid once per worker: they stay between calls): the **runner** runs the completion
(``runner.py``), the **judge** runs the problem's tests (``judge.py``). For each job the caller makes a fresh socket
pair, the job's wire, and hands one end to each with the job (SCM_RIGHTS on its control socket): the two sandboxes
share nothing else: under bubblewrap each has its own pid, network, IPC and user namespaces and its own /tmp, so the
completion can neither signal, trace nor read the judge, and stale bytes of one job's wire can never reach the next.
The verdict comes only from the judge's control socket, which the completion's process never holds.

Each sandbox process is started as ``python -I -S -u -B -c <bootstrap> <control fd>``, the bootstrap carrying the
source of ``wire.py``, ``server.py`` and the role's modules (nothing of the project is visible inside).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import queue
import re
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from grpo_lab.sandbox import isolation as iso
from grpo_lab.sandbox.plan import Plan, SandboxError, plan, program
from grpo_lab.sandbox.verdict import ISOLATIONS, Isolation, Limits, Verdict, one_line, printable

# The first line of the bootstrap, in the command line of every process of a sandbox, with the pid of the process that
# started it (`ps` shows whose sandbox it is; tests find the leftovers of theirs, not another test's).
MARKER = "# grpo_lab.sandbox harness"
_START_TIMEOUT = 30.0  # seconds for a sandbox to start (bubblewrap, Python, the sources): ~50 ms when idle
_GRACE = 0.5  # seconds past the timeout for the judge's verdict, and after it for the runner's end
_MAX_JOBS = 256  # jobs a sandbox serves before it is retired (what cleaning cannot reach cannot pile up past this)
_CONTROL_CAP = 1 << 20  # bytes read from a control socket in one job: progress lines and one verdict
_JUDGE_OUTPUT = 1 << 16  # bytes of the tests' own printing kept (and then dropped): never shown

_BOOTSTRAP = """
import sys, types
package = types.ModuleType("grpo_lab_sandbox")
package.__path__ = []
sys.modules[package.__name__] = package
for name, source in SOURCES:
    module = types.ModuleType(package.__name__ + "." + name)
    module.__package__ = package.__name__
    sys.modules[module.__name__] = module
    setattr(package, name, module)
    exec(compile(source, "<grpo_lab_sandbox/%s.py>" % name, "exec"), module.__dict__)
del SOURCES, name, source, module, package
sys.modules["grpo_lab_sandbox." + ROLE].main()
"""


# What each sandbox runs: the completion's also installs the seccomp filter before the completion runs.
_MODULES = {"runner": ("wire", "server", "seccomp", "runner"), "judge": ("wire", "server", "judge")}


@functools.cache
def _sources(role: str) -> str:
    folder = resources.files("grpo_lab.sandbox")
    sources = [(name, folder.joinpath(f"{name}.py").read_text()) for name in _MODULES[role]]
    return f"SOURCES = {sources!r}\nROLE = {role!r}\n{_BOOTSTRAP}"


def bootstrap(role: str) -> str:
    """The ``-c`` program of a sandbox of `role` ("runner" or "judge"): the shipped sources, then the server."""
    return f"{MARKER} ({role}, started by pid {os.getpid()})\n{_sources(role)}"


class _Process:
    """One sandbox process of a worker: its control socket, its pipes, the jobs it has served."""

    def __init__(self, role: str, limits: Limits, isolation: str) -> None:
        self.role, self.limits, self.isolation = role, limits, isolation
        self.closed, self.problem, self.jobs = False, "", 0
        self.ours, theirs = socket.socketpair()
        self.workdir = self.call_id = None
        self.lines = bytearray()  # what came on the control socket and is not yet a whole line
        if isolation == "bwrap":
            interpreter = iso.python("bwrap")
            argv, options = iso.bwrap_command(interpreter, limits.tmp_mb), {"cwd": "/", **iso.unprivileged()}
            options["env"] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # bwrap's own: no secrets
        else:
            self.workdir, self.call_id = tempfile.mkdtemp(prefix="grpo_lab_sandbox_"), secrets.token_hex(8)
            env = {"PATH": "/usr/bin:/bin", "HOME": self.workdir, "TMPDIR": self.workdir, iso.ENV_MARK: self.call_id}
            argv, options = [iso.python("rlimits")], {"cwd": self.workdir, "env": env, **iso.unprivileged()}
            if "user" in options:  # as root, nobody runs it: its working folder must be nobody's
                os.chown(self.workdir, options["user"], options["group"])
        argv += ["-I", "-S", "-u", "-B", "-c", bootstrap(role), str(theirs.fileno())]
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
            self._wait_ready()

    def _wait_ready(self) -> None:
        deadline, errors = time.monotonic() + _START_TIMEOUT, bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(self.ours, selectors.EVENT_READ)
            selector.register(self.child.stderr, selectors.EVENT_READ)
            while time.monotonic() < deadline and not self.lines.startswith(b"ready\n"):
                for key, _ in selector.select(0.05):
                    data = os.read(key.fd, 1 << 16) if key.fd != self.ours.fileno() else self.ours.recv(1 << 16)
                    (self.lines if key.fd == self.ours.fileno() else errors).extend(data)
                    if not data:
                        selector.unregister(key.fileobj)
                if self.child.poll() is not None and not self.lines.startswith(b"ready\n"):
                    break
        if self.lines.startswith(b"ready\n"):
            del self.lines[:6]
            return
        lines = errors.decode("utf-8", "replace").strip().splitlines()
        self.problem = lines[-1] if lines else "the sandbox did not start"
        self.close()

    def send(self, work: dict, wire: socket.socket) -> bool:
        """Hand a job and its end of the wire to this sandbox; False when it has died. Its number goes in a frame of
        its own, read by the sandbox's first process; the job in another, read by the job's fork only."""
        number, data = str(work["job"]).encode(), json.dumps(work).encode()
        try:
            self.ours.settimeout(_START_TIMEOUT)
            socket.send_fds(self.ours, [b"J"], [wire.fileno()])
            self.ours.sendall(len(number).to_bytes(4, "big") + number + len(data).to_bytes(4, "big") + data)
        except OSError as e:
            self.problem = f"the {self.role} sandbox has gone: {e}"
            return False
        finally:
            self.ours.setblocking(False)
        self.jobs += 1
        return True

    def close(self) -> None:
        """Kill the sandbox as a whole (under bubblewrap, its pid namespace dies with it) and reap it."""
        if self.closed and self.child is None:
            return
        self.closed = True
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
            if self.call_id is not None:  # rlimits: processes that called setsid() left the group
                iso.kill_marked(self.call_id)
            self.child.wait()
            self.child.stdout.close()
            self.child.stderr.close()
            self.child = None
        self.ours.close()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _Outcome:
    """What the caller saw of one job."""

    def __init__(self) -> None:
        self.stdout, self.stderr = bytearray(), bytearray()  # the completion's
        self.progress = 0  # tests passed so far, from the judge
        self.verdict: list | None = None  # the judge's [passed, total, kind, detail]
        self.runner_done: tuple | None = None  # status, CPU s, peak KiB, dirty
        self.judge_done: tuple | None = None
        self.over_output = self.timed_out = False
        self.judge_problem = ""


_DONE = re.compile(rb"done (\d+) (-?\d+) ([\d.]+) (\d+) (\d)")


class _Worker:
    """A runner and a judge that serve one worker's completions (bubblewrap), or one completion (rlimits)."""

    def __init__(self, limits: Limits, isolation: str) -> None:
        self.limits, self.isolation = limits, isolation
        self.runner: _Process | None = None
        self.judge: _Process | None = None
        self.number = 0

    def _fresh(self, role: str) -> _Process:
        current = getattr(self, role)
        if current is None or current.closed:
            current = _Process(role, self.limits, self.isolation)
            setattr(self, role, current)
        return current

    def run(self, code: str, tests: Plan) -> Verdict:
        start, outcome = time.monotonic(), _Outcome()
        runner, judge = self._fresh("runner"), self._fresh("judge")
        if runner.closed or judge.closed:
            return _verdict(outcome, tests, start, self, runner.problem or judge.problem)
        self.number += 1
        source, _ = program(tests.preamble, code)
        missing = tests.undefined_stubs(code)
        wanted = [name for name in tests.names if name not in missing]
        ours, theirs = socket.socketpair()
        with ours, theirs:
            work = {"job": self.number, "code": source, "names": wanted, "limits": self.limits.rlimits()}
            sent = runner.send(work, ours) and judge.send(self._judge_work(tests, wanted, start), theirs)
        if not sent:
            self.close()
            return _verdict(outcome, tests, start, self, runner.problem or judge.problem)
        self._collect(outcome, start + self.limits.timeout + _GRACE)
        over = outcome.over_output or outcome.timed_out or outcome.runner_done is None or outcome.runner_done[3]
        if over or self.isolation != "bwrap" or runner.jobs >= _MAX_JOBS:
            runner.close()  # it flooded, hung, left /tmp dirty, served its share, or runs one job only
        if outcome.verdict is None or self.isolation != "bwrap" or judge.jobs >= _MAX_JOBS:
            judge.close()  # no verdict: it hung or died
        return _verdict(outcome, tests, start, self, "")

    def _judge_work(self, tests: Plan, wanted: list[str], start: float) -> dict:
        return {
            "job": self.number,
            "timeout": max(0.01, self.limits.timeout - (time.monotonic() - start)),
            "segments": tests.segments,
            "total": tests.total,
            "preamble": tests.preamble,
            "modules": tests.modules,
            "imported": tests.imported,
            "names": tests.names,
            "wanted": wanted,
            "limits": self.limits.rlimits(),
        }

    def _collect(self, outcome: _Outcome, deadline: float) -> None:
        """Read both sandboxes until the judge's verdict and both ends are in, or the deadline passes."""
        runner, judge = self.runner, self.judge
        sources = {
            runner.child.stdout.fileno(): ("out", outcome.stdout),
            runner.child.stderr.fileno(): ("out", outcome.stderr),
            runner.ours.fileno(): ("runner", None),
            judge.child.stdout.fileno(): ("judge output", bytearray()),
            judge.child.stderr.fileno(): ("judge output", bytearray()),
            judge.ours.fileno(): ("judge", None),
        }
        until = deadline
        with selectors.DefaultSelector() as selector:
            for fd in sources:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            # The judge's end need not be waited for (its jobs run no model code; it reads the next job once it has
            # reaped this one); the runner's must: whether it is fit for the next job is known only then.
            while not (outcome.verdict and outcome.runner_done):
                if outcome.verdict is not None:
                    if outcome.verdict[2] == "timeout":  # the completion is still running: it is retired
                        break
                    until = min(until, time.monotonic() + _GRACE)  # the runner ends once the wire is closed
                left = until - time.monotonic()
                if left <= 0:
                    outcome.timed_out = outcome.verdict is None
                    return
                for key, _ in selector.select(min(left, 0.1)):
                    self._read(key.fd, sources, selector, outcome)
                if not selector.get_map():
                    return
            # What the completion printed before it ended is all in the pipes by now (its server reported its end
            # after reaping it): read it, or it would be counted as the next completion's.
            for fd, (kind, _) in sources.items():
                if kind == "out" and fd in selector.get_map():
                    while fd in selector.get_map():
                        self._read(fd, sources, selector, outcome, drain=True)

    def _read(self, fd: int, sources: dict, selector: selectors.BaseSelector, outcome: _Outcome, drain=False) -> None:
        kind, into = sources[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            if drain:
                selector.unregister(fd)
            return
        except OSError:
            data = b""
        if not data:
            selector.unregister(fd)
            return
        if kind == "out":
            into.extend(data)
            if len(outcome.stdout) + len(outcome.stderr) > self.limits.output_bytes and not outcome.over_output:
                outcome.over_output = True
                self.runner.close()  # the judge sees its wire close and ends with the tests passed so far
                for other in [f for f, (k, _) in sources.items() if k in ("out", "runner")]:
                    with contextlib.suppress(KeyError, ValueError):
                        selector.unregister(other)
        elif kind == "judge output":
            if len(into) < _JUDGE_OUTPUT:
                into.extend(data)
        else:
            process = self.runner if kind == "runner" else self.judge
            process.lines.extend(data)
            if len(process.lines) > _CONTROL_CAP:
                raise SandboxError(f"the {kind} sandbox wrote more than {_CONTROL_CAP} bytes of reports")
            *lines, rest = bytes(process.lines).split(b"\n")
            process.lines[:] = rest
            for line in lines:
                self._line(kind, line, outcome)

    def _line(self, kind: str, line: bytes, outcome: _Outcome) -> None:
        done = _DONE.fullmatch(line)
        if done and int(done[1]) == self.number:
            report = (int(done[2]), float(done[3]), int(done[4]), int(done[5]))
            if kind == "runner":
                outcome.runner_done = report
            else:
                outcome.judge_done = report
            return
        if kind != "judge":
            return
        word, _, rest = line.partition(b" ")
        number, _, text = rest.partition(b" ")
        if number != str(self.number).encode():
            return
        if word == b"progress" and text.isdigit():
            outcome.progress = int(text)
        elif word == b"verdict":
            with contextlib.suppress(ValueError):
                verdict = json.loads(text)
                if isinstance(verdict, list) and len(verdict) == 4:
                    outcome.verdict = verdict

    def close(self) -> None:
        for process in (self.runner, self.judge):
            if process is not None:
                process.close()


def _verdict(outcome: _Outcome, tests: Plan, start: float, worker: _Worker, problem: str) -> Verdict:
    """The verdict of one job, from the judge's report and the runner's end."""
    limits, done = worker.limits, outcome.runner_done

    def verdict(error: str | None, detail: str, passed: int) -> Verdict:
        return Verdict(
            passed=passed,
            total=tests.total,
            error=error,
            seconds=round(time.monotonic() - start, 3),
            peak_memory_mb=round(done[2] / 1024, 1) if done else 0.0,
            isolation=worker.isolation,
            detail=one_line(detail),
            stdout=printable(outcome.stdout[: limits.output_bytes].decode("utf-8", "replace")),
            stderr=printable(outcome.stderr[: limits.output_bytes].decode("utf-8", "replace")),
        )

    if problem:
        return verdict("sandbox", problem, 0)
    judged = outcome.verdict
    passed = judged[0] if judged and isinstance(judged[0], int) else outcome.progress
    passed = max(0, min(passed, tests.total))
    if outcome.over_output:
        return verdict("output_limit", f"wrote more than {limits.output_bytes} bytes", passed)
    if judged is None:
        if outcome.timed_out:
            return verdict("timeout", f"ran past {limits.timeout:g} s", passed)
        return verdict("sandbox", "the judge ended without a verdict", 0)
    kind, detail = judged[2], judged[3] if isinstance(judged[3], str) else ""
    if kind == "-":
        return verdict(None, detail, passed)
    if kind in ("syntax", "runtime", "memory"):
        return verdict(kind, detail, 0)
    if kind == "timeout":
        return verdict("timeout", f"ran past {limits.timeout:g} s", passed)
    if kind == "protocol":
        return verdict("runtime", f"the completion's process broke the protocol: {detail}", passed)
    if kind == "gone":
        return verdict(*_ended(done, limits, outcome), passed)
    return verdict("sandbox", detail, 0)  # "tests": the problem's own code failed


def _ended(done: tuple | None, limits: Limits, outcome: _Outcome) -> tuple[str, str]:
    """Why the completion's process ended before its tests did: its exit status as the runner's server saw it."""
    if done is None:
        return "killed", "its process ended before its tests did"
    code = os.waitstatus_to_exitcode(done[0])
    cpu_limit = limits.rlimits()[0]
    if -code in (signal.SIGKILL, signal.SIGXCPU) and done[1] >= cpu_limit - 0.05:
        return "timeout", f"used its {cpu_limit} s of CPU"
    if b"MemoryError" in outcome.stderr:
        return "memory", "MemoryError"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-code}"
        return "killed", f"killed by {name}"
    return "runtime", f"exited with {code} before its tests ended"


# ------------------------------------------------------------------------------------------------- the calls
@functools.lru_cache(maxsize=1024)
def _plan(tests: str, entry_point: str | None, preamble: str | None) -> Plan:
    return plan(tests, entry_point, preamble)


def check_tests(tests: str, entry_point: str | None = None, preamble: str | None = None) -> int:
    """The number of tests in `tests`; raises a one-line :class:`SandboxError` when the sandbox could not run them
    (see grpo_lab.sandbox.plan)."""
    return _plan(tests, entry_point, preamble).total


def run(
    code: str,
    tests: str,
    *,
    entry_point: str | None = None,
    preamble: str | None = None,
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
) -> Verdict:
    """Run `code` (after the problem's `preamble`) in one sandbox and `tests` against it in another."""
    return run_many([(code, tests, entry_point, preamble)], 1, limits=limits, isolation=isolation)[0]


def run_many(
    items: Iterable[Sequence],
    workers: int | None = None,
    *,
    limits: Limits | None = None,
    isolation: Isolation = "bwrap",
) -> list[Verdict]:
    """:func:`run` for a step's completions, side by side: `items` are ``(code, tests[, entry_point[,
    preamble]])``; the verdicts come back in their order. `workers` defaults to the number of CPUs. Under
    bubblewrap each worker's sandboxes serve its completions one after another, cleaned between two, and stay for
    the next call (a training run's next step): their start is paid once, not once a step."""
    jobs = []
    for code, tests, *rest in items:
        rest = [*rest, None, None]
        jobs.append((code, _plan(tests, rest[0], rest[1])))
    check_isolation(isolation)
    limits = limits or Limits()
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for index, job in enumerate(jobs):
        todo.put((index, job))
    verdicts: list[Verdict | None] = [None] * len(jobs)

    def lane() -> None:  # one worker's share: the next job, until none is left
        worker = _POOL.worker(limits, isolation)
        while True:
            try:
                index, job = todo.get_nowait()
            except queue.Empty:
                return
            verdicts[index] = worker.run(*job)

    for future in [_POOL.submit(lane) for _ in range(workers)]:
        future.result()
    return verdicts  # type: ignore[return-value]


class _Pool:
    """Threads that outlive a call, each holding one worker's sandboxes (bubblewrap's die with the thread that
    started them, so the threads stay), and everything they hold, closed at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None
        self.local = threading.local()
        self.workers: set[_Worker] = set()

    def submit(self, fn: Any) -> Any:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(64, thread_name_prefix="grpo_lab_sandbox")
                atexit.register(self.close)
            return self.executor.submit(fn)

    def worker(self, limits: Limits, isolation: str) -> _Worker:
        """This thread's worker for these limits; a thread keeps two at most (the oldest is closed)."""
        mine: dict = self.local.__dict__.setdefault("workers", {})
        key = (limits, isolation)
        found = mine.pop(key, None)
        if found is None:
            found = _Worker(limits, isolation)
            with self.lock:
                self.workers.add(found)
            if len(mine) >= 2:
                self.drop(mine.pop(next(iter(mine))))
        mine[key] = found  # the most recently used last
        return found

    def drop(self, worker: _Worker) -> None:
        worker.close()
        with self.lock:
            self.workers.discard(worker)

    def close(self) -> None:
        """Close every sandbox and stop the threads (at exit, or for a caller that wants none left running)."""
        with self.lock:
            workers, self.workers = list(self.workers), set()
            executor, self.executor = self.executor, None
        for worker in workers:
            worker.close()
        if executor is not None:
            executor.shutdown(wait=True)
        self.local = threading.local()


_POOL = _Pool()


def close() -> None:
    """Close the sandboxes kept between calls (they are closed at exit anyway)."""
    _POOL.close()


_checked: dict[str, str] = {}
_check_lock = threading.Lock()


def check_isolation(isolation: str) -> str:
    """Make sure ``isolation`` works here, once per process; raises a one-line :class:`SandboxError` if not.

    "bwrap" runs a trivial job through both sandboxes; "rlimits" runs without namespaces (the caller records the
    run as not isolated).
    """
    if isolation not in ISOLATIONS:
        raise SandboxError(f"reward.sandbox.isolation={isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == "rlimits":
        return isolation
    with _check_lock:
        if isolation not in _checked:
            if shutil.which("bwrap") is None:
                raise SandboxError(iso.NO_BWRAP)
            worker = _Worker(Limits(timeout=30), "bwrap")
            try:
                probe = worker.run("x = 1", _plan("assert x == 1", None, None))
            finally:
                worker.close()
            if probe.passed != 1:
                raise SandboxError(
                    f"bubblewrap could not start the sandbox ({probe.detail or probe.error}): fix it "
                    "(apt-get install bubblewrap; unprivileged user namespaces must be allowed) "
                    "or run it unisolated with reward.sandbox.isolation=rlimits"
                )
            _checked[isolation] = probe.detail
    return isolation
