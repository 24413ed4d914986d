"""Ctrl-C and SIGTERM: stop a job cleanly, record it as interrupted, exit with 130 / 143.

Python turns SIGINT into KeyboardInterrupt, but SIGTERM (what `kill`, Slurm, Kubernetes and systemd
send) ends the process at once, without cleanup. While :func:`handling` is active, both signals raise
:class:`Interrupted` (a KeyboardInterrupt) in the main thread instead, so that:

- the training job records `interrupted` (signal and step) in metrics.json and closes its W&B run
  with exit code 128 + signal (``grpo_lab.run.train``);
- a multi-process job's parent forwards the signal to its children and ends them (``grpo_lab.launch.processes``);
- a sweeper can tell an interrupted trial from a failed one (``isinstance(e, KeyboardInterrupt)``);
- the CLI exits with :func:`exit_code_for`: 130 after Ctrl-C, 143 after SIGTERM.

The first signal raises (or, while jobs run in worker processes, is sent on to them: :func:`forward_to_children`);
a second one while the job is stopping only logs (the run is being recorded, and a launcher that forwards signals
may send it twice); a third one ends the process at once. Inside :func:`deferred` (a call into a shared store: the
study's database) the first signal raises only when the call is over: raised in the middle of it, it can leave the
database locked for every other process (an unfinished SQLite read holds its shared lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("grpo_lab")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The process received SIGINT or SIGTERM. A KeyboardInterrupt, so code that already treats Ctrl-C
    as "stop now" (Hydra's job runner, which catches only Exception) does the same for SIGTERM."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal_name(self.signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __reduce__(self) -> tuple[Any, ...]:
        return (Interrupted, (self.signum,))


class JobInterrupted(Exception):
    """A multirun job in a launcher's worker process (joblib, submitit) stopped by a signal, its run recorded:
    raised as an Exception so that the launcher returns it as that job's result and keeps collecting the others'
    (a KeyboardInterrupt escaping a joblib task makes joblib end every other worker at once)."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal_name(self.signum)}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (JobInterrupted, (self.signum,))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(exc: BaseException | None) -> int | None:
    """The signal behind `exc`: its own for an Interrupted, SIGINT for a plain KeyboardInterrupt, else the
    signal this process received before `exc` happened (e.g. a peer rank stopped first on the same
    signal and a collective failed), else None."""
    if isinstance(exc, Interrupted | JobInterrupted):
        return exc.signum
    if isinstance(exc, KeyboardInterrupt):
        return int(signal.SIGINT)
    return received()


def exit_code_for(exc: BaseException) -> int | None:
    """The process exit code for an interrupt: 128 + signal (130 Ctrl-C, 143 SIGTERM); None otherwise."""
    if isinstance(exc, KeyboardInterrupt):
        return 128 + (signal_of(exc) or int(signal.SIGINT))
    return None


# ------------------------------------------------------------------------------------------ handlers
_lock = threading.Lock()
_depth = 0
_previous: dict[int, Any] = {}
_received: list[int] = []  # every signal handled, in order (only the first one raises)
# While a launcher runs jobs in other processes: what the first signal does instead of raising (see forwarding).
_forward: Any = None
_deferring = 0  # depth of deferred() blocks in the main thread
_pending: int | None = None  # a signal that arrived in a deferred() block, raised at its end


def received() -> int | None:
    """The first signal handled since the outermost :func:`handling` became active (None outside it)."""
    return _received[0] if _received else None


def _handle(signum: int, frame: Any) -> None:
    global _pending
    _received.append(signum)
    if len(_received) == 1 and _forward is not None and _forward(signum):
        log.warning("%s: stopping the jobs; each records its run before this command ends.", signal_name(signum))
        return
    if len(_received) == 1:
        if _deferring:
            _pending = signum
            return
        raise Interrupted(signum)
    if len(_received) == 2:
        log.warning("%s again: still stopping and recording the run; once more quits at once.", signal_name(signum))
        return
    log.warning("%s a third time: quitting now, without cleanup.", signal_name(signum))
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` while this is active (nested uses share one state;
    the outermost restores the previous handlers). Only the main thread can handle signals: elsewhere
    this does nothing. A SIGINT ignored by the parent shell (`nohup`, `cmd &`) stays ignored."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _lock:
        if _depth == 0:
            _received.clear()
            for sig in SIGNALS:
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue
                _previous[sig] = previous
                signal.signal(sig, _handle)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for sig, previous in _previous.items():
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
                _previous.clear()
                _received.clear()  # a signal of this (finished) scope must not explain a later error
                _pending = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A call that must not be cut in the middle (a database transaction: an Optuna storage's read or write):
    a first SIGINT/SIGTERM arriving meanwhile raises :class:`Interrupted` when the block ends, not inside it. Keep
    the block short: the signal waits for it. Outside the main thread, or outside :func:`handling`, no effect."""
    global _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _deferring == 0 and _pending is not None:
        signum, _pending = _pending, None
        raise Interrupted(signum)


def forward_to_children(on: bool) -> None:
    """While on, the first signal is sent on to this process's child processes instead of raising, when it has
    any: a launcher that runs jobs in worker processes on this machine (joblib, submitit_local) would otherwise end
    them, as it unwinds, before they record their runs. The jobs stop, record and return; the caller then ends with
    :func:`raise_if_received`."""
    global _forward
    _forward = _signal_children if on else None


def raise_if_received() -> None:
    """Raise the first signal handled (and forwarded) as :class:`Interrupted`, if there was one."""
    if _received:
        raise Interrupted(_received[0])


def _signal_children(signum: int) -> bool:
    """Send `signum` to this process's children; whether there was one (none: the signal raises here)."""
    import psutil

    sent = False
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)
            sent = True
    return sent


# --------------------------------------------------------------------------------- parent watchdog
def exit_with_parent(pid: int, grace_s: float = 8.0, *, whole_group: bool = False) -> threading.Thread:
    """In a child process: when process `pid` (the job's parent) ends, even by SIGKILL, stop this process
    as on SIGTERM (it records the run as interrupted), and end it outright `grace_s` seconds later; with
    `whole_group`, the same for every process of this process's group (a server's worker processes).

    A thread that waits on a pidfd (Linux >= 5.3; polls once a second elsewhere). It replaces
    PR_SET_PDEATHSIG set in `preexec_fn`, which is unsafe in a parent that runs threads and fires when
    the forking *thread* ends rather than the process.
    """

    def wait_for_exit() -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None  # gone already
        except (AttributeError, OSError):
            while _alive(pid):
                time.sleep(1.0)
            fd = None
        if fd is not None:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                while not poller.poll():
                    pass
            finally:
                os.close(fd)
        log.warning("The job's parent process %d is gone: stopping this process.", pid)
        if whole_group:  # this process leads a group of its own children (a vLLM server and its engine)
            os.killpg(os.getpgid(0), signal.SIGTERM)
            time.sleep(grace_s)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)

    thread = threading.Thread(target=wait_for_exit, name="grpo-lab-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
