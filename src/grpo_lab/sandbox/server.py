"""A sandbox's first process: it serves jobs one after another, each in a fresh fork, and reports each job's end.

Shipped as source into both sandboxes (the completion's and the judge's; see ``harness.py``) and run as
``python -I -S -u -B -c <bootstrap>``: the standard library only, nothing of the project.

The caller sends a job on the control socket as one byte carrying the job's end of the wire (SCM_RIGHTS), a frame
with the job's number, then a frame with the job itself (length, JSON). ``serve`` reads the number and forks; the
fork reads the job and runs ``job(control, wire, work)`` (the completion's side closes the control socket before
any model code runs; the judge's side writes its progress and verdict on it) and never comes back. The server never
reads a job itself: what a completion's code was never lies in the memory that the next completion's fork
inherits. Once the fork has ended, the server reports ``done <job> <status> <cpu s> <peak KiB> <dirty>``. Under
bubblewrap it is pid 1 of its own pid namespace: between two jobs it kills every other process of the namespace,
empties /tmp and /dev/shm (their attributes and times too), and retires itself if a job changed it (see ``state``);
it is undumpable, so that no job can trace it. With rlimits it serves one job and exits.
"""

import contextlib
import fcntl
import functools
import gc
import json
import os
import platform
import resource
import signal
import socket
import sys

SCRATCH = ("/tmp", "/dev/shm")  # the writable folders under bubblewrap, emptied between two jobs


def serve(control_fd, job, one_job=False, guard=True):
    control = socket.socket(fileno=control_fd)
    serving = os.getpid() == 1  # bubblewrap's pid namespace, of which it is the init
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an init only gets the signals it handles: Python handles this
    undumpable()
    before = state()
    gc.freeze()  # what the forks inherit is never traversed by their collector: fewer pages copied on write
    os.write(control_fd, b"ready\n")
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            break
        if not data or len(fds) != 1:
            break
        wire = fds[0]
        number = read_frame(control_fd)
        if number is None or not number.isdigit():
            break
        pid = os.fork()
        if pid == 0:
            try:
                job(control_fd, wire, json.loads(read_frame(control_fd)))
            except BaseException:
                import traceback

                traceback.print_exc()  # to this sandbox's stderr: the harness's own failure, for its tests
            finally:  # whatever happens in it, a job never comes back to serve
                os._exit(1)
        os.close(wire)
        _, status, usage = os.wait4(pid, 0)
        # The judge's jobs run no model code: their leftovers are killed, but there is nothing to guard against.
        dirty = (clean() or int(state() != before)) if serving and guard else reap() if serving else 0
        cpu, peak_kb = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
        os.write(control_fd, b"done %s %d %.3f %d %d\n" % (number, status, cpu, peak_kb, dirty))
        if not serving or dirty or one_job:
            break
    os._exit(0)


def read_frame(fd):
    header = read_exactly(fd, 4)
    return None if header is None else read_exactly(fd, int.from_bytes(header, "big"))


def read_exactly(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def state():
    # What a job could change in the server from outside it, and so pass on to the next job: its limits, priority,
    # scheduling, I/O priority and CPUs (prlimit, setpriority, sched_setscheduler, ioprio_set on pid 1 or its process
    # group), the mode and attributes of /tmp and /dev/shm, the mode and size of the output pipes it shares. If any
    # differs after a job, the sandbox is retired. The completion's seccomp filter refuses most of these already.
    limits = tuple(resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))
    scheduling = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    folders = tuple((os.stat(f).st_mode, tuple(sorted(os.listxattr(f)))) for f in SCRATCH if os.path.isdir(f))
    pipes = tuple((os.get_blocking(fd), fcntl.fcntl(fd, 1032)) for fd in (1, 2))  # F_GETPIPE_SZ
    return limits, scheduling, io_priority(), tuple(sorted(os.sched_getaffinity(0))), folders, pipes


_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())


@functools.cache
def _libc():
    import ctypes

    return ctypes.CDLL(None)


def io_priority():
    return None if _IOPRIO_GET is None else _libc().syscall(_IOPRIO_GET, 1, 0)  # IOPRIO_WHO_PROCESS, itself


def undumpable():
    # Jobs run as the server's user: without this, one could ptrace the server (and, in rlimits mode, the judge).
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (ImportError, OSError, AttributeError):
        pass


def reap():
    # Kill what the last job left running (an init's kill(-1) spares only itself), and reap it all.
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    return 0


def clean():
    # Between two jobs: kill and reap what the last one left, empty /tmp and /dev/shm. 1 when they cannot be
    # emptied: the caller retires this sandbox.
    reap()
    try:
        return 0 if all([wipe(f) and reset(f) for f in SCRATCH if os.path.isdir(f)]) else 1
    except (OSError, RecursionError):
        return 1


def reset(folder):
    # What a job can leave on the folder itself: its extended attributes and its times (a message for the next job).
    for name in os.listxattr(folder):
        os.removexattr(folder, name)
    os.utime(folder, (0, 0))
    return True


def wipe(folder):
    emptied = True
    for entry in os.scandir(folder):
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                emptied = wipe(entry.path) and emptied
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            emptied = False
    return emptied


def set_limits(limits):
    """The job's rlimits, set in its fork before it runs anything of the problem's or the completion's."""
    cpu, memory, processes, file_size, open_files, alarm = limits
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing
    signal.alarm(alarm)  # rlimits: ends a job whose caller died (pid 1's children get it too under bwrap)
    # RLIMIT_NPROC counts every task of the real uid: under bwrap (no /proc) that is the server and this job.
    tasks = 2 if not os.path.isdir("/proc/self") else 0 if os.getuid() == 0 else tasks_of(os.getuid())
    for which, value in (
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_NPROC, tasks + processes),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def tasks_of(uid):
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


def main(job, one_job=False, guard=True):
    serve(int(sys.argv[1]), job, one_job, guard)
