"""A seccomp filter for the completion's process: the kernel refuses it the system calls no ordinary code needs and
that would outlive it, escape its limits or reach other processes.

Shipped as source into the completion's sandbox (see ``harness.py``) and installed by its job, in the fork, before
the completion runs (``PR_SET_NO_NEW_PRIVS``, then ``PR_SET_SECCOMP``: both allowed to an unprivileged process, and
inherited by every process and thread it starts). Refused with ``EPERM``:

* System V shared memory, semaphores and message queues, POSIX message queues, ``memfd_create``, the kernel's
  keyrings: they outlive the process that made them (a sandbox serves many completions: one could leave answers for
  the next), and shared memory escapes the address-space limit;
* ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``: reading or steering another process;
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_setup``, ``unshare``, ``setns``: kernel surface;
* changing another process's scheduling, I/O priority, nice value, CPU affinity or limits, or those of its process
  group or user (the sandbox's first process stays as it was); on itself (pid 0) they are allowed.

Any other architecture's system calls (32-bit ``int 0x80``, x32) are refused. On an architecture without a table
here (not x86-64 or aarch64), :func:`install` returns False and the caller retires the sandbox after every job.
"""

import ctypes
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K

# name -> number, per architecture (asm/unistd_64.h for x86-64; the generic table for aarch64).
# fmt: off
_TABLES = {
    "x86_64": (
        0xC000003E,
        {
            "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67,
            "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220, "mq_open": 240,
            "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
            "memfd_create": 319, "memfd_secret": 447, "add_key": 248, "request_key": 249, "keyctl": 250,
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "bpf": 321,
            "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "unshare": 272, "setns": 308,
            "sched_setparam": 142, "sched_setscheduler": 144, "sched_setattr": 314, "ioprio_set": 251,
            "setpriority": 141, "prlimit64": 302, "sched_setaffinity": 203,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "semget": 190, "semctl": 191, "semtimedop": 192,
            "semop": 193, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "mq_open": 180,
            "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
            "memfd_create": 279, "memfd_secret": 447, "add_key": 217, "request_key": 218, "keyctl": 219,
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438, "bpf": 280,
            "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "unshare": 97, "setns": 268,
            "sched_setparam": 118, "sched_setscheduler": 119, "sched_setattr": 274, "ioprio_set": 30,
            "setpriority": 140, "prlimit64": 261, "sched_setaffinity": 122,
        },
    ),
}
# fmt: on
# Allowed on the calling process itself only: the argument that names the target process (0: itself).
_SELF_ONLY = {
    "sched_setparam": _ARG0,
    "sched_setscheduler": _ARG0,
    "sched_setattr": _ARG0,
    "prlimit64": _ARG0,
    "sched_setaffinity": _ARG0,
}
# ... and those that name a process group or a user when `which` says so (who 0 is then the caller's whole group or
# uid, the sandbox's first process included): allowed only for (which, who) = (a single process, itself).
_PROCESS_ONLY = {"setpriority": 0, "ioprio_set": 1}  # PRIO_PROCESS; IOPRIO_WHO_PROCESS


def program(machine=None):
    """The filter's classic-BPF instructions, (code, jt, jf, k) each; None on an architecture without a table."""
    table = _TABLES.get(machine or platform.machine())
    if table is None:
        return None
    arch, numbers = table
    code = [(_LD, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, _EPERM), (_LD, 0, 0, _NR)]
    if arch == 0xC000003E:  # the x32 ABI's numbers carry bit 30
        code += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _EPERM)]
    for name, number in sorted(numbers.items()):
        if name in _PROCESS_ONLY:  # which == a single process and who == 0: allowed; anything else refused
            code += [(_JEQ, 0, 6, number), (_LD, 0, 0, _ARG0), (_JEQ, 0, 3, _PROCESS_ONLY[name])]
            code += [(_LD, 0, 0, _ARG1), (_JEQ, 0, 1, 0), (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _EPERM)]
        elif name in _SELF_ONLY:  # its target's pid is 0 (itself): allowed; anything else refused
            code += [(_JEQ, 0, 4, number), (_LD, 0, 0, _SELF_ONLY[name]), (_JEQ, 0, 1, 0), (_RET, 0, 0, _ALLOW)]
            code += [(_RET, 0, 0, _EPERM)]
        else:
            code += [(_JEQ, 0, 1, number), (_RET, 0, 0, _EPERM)]
    return [*code, (_RET, 0, 0, _ALLOW)]


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _packed():
    code = program()
    return None if code is None else b"".join(struct.pack("HBBI", *instruction) for instruction in code)


_PACKED = _packed()  # once, in the sandbox's first process: every job's fork inherits it
_LIBC = ctypes.CDLL(None, use_errno=True)


def install():
    """Install the filter on this process (and everything it starts); False where there is no table."""
    data = _PACKED
    if data is None:
        return False
    buffer = ctypes.create_string_buffer(data, len(data))
    fprog = _Program(len(data) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = _LIBC
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
    return True
