"""How a sandbox process is started: bubblewrap's command and the filesystem it shows, or rlimits alone.

Under bubblewrap a sandbox sees a root of its own: the interpreter, its standard library (never a ``site-packages``
or ``dist-packages`` folder, wherever the interpreter lives), the shared libraries they load (read with ``ldd``),
the time-zone database, a minimal /dev, no /proc, and an empty, size-capped, writable /tmp. Nothing else of the
host: not the project, its virtual environments or data sets, home folders, package caches or other folders.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from grpo_lab.sandbox.plan import SandboxError

NO_BWRAP = (
    "bubblewrap (bwrap) is not installed, and the code reward runs model-written code only inside it: "
    "install it (apt-get install bubblewrap) or run it unisolated with reward.sandbox.isolation=rlimits"
)
ENV_MARK = "GRPO_LAB_SANDBOX_CALL"  # rlimits: finds a call's processes that left its process group
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")
_SYSTEM_DATA = ("/usr/share/zoneinfo",)  # read by the standard library (zoneinfo); no host data


@functools.cache
def bwrap_options() -> frozenset[str]:
    """The options this bwrap knows (--disable-userns and --size came with 0.8)."""
    text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, check=False).stdout
    return frozenset(word for word in text.split() if word.startswith("--"))


def others_can_run(path: str) -> bool:
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


def base_python() -> str:
    """This interpreter outside any virtual environment: ``-I -S`` needs only its standard library."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def python(isolation: str) -> str:
    """The interpreter a sandbox runs: this one's base interpreter, or, when the sandbox runs as `nobody` (we are
    root: see :func:`unprivileged`) and nobody cannot reach it, a system-wide one of the same version."""
    base = base_python()
    if os.geteuid() != 0 or others_can_run(base):
        return base
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if others_can_run(candidate):
            return os.path.realpath(candidate)
    raise SandboxError(
        f"as root, the sandbox runs model code as nobody, who cannot reach {base}: install python{version} "
        f"system-wide (apt-get install python{version}) or run unisolated with reward.sandbox.isolation=rlimits"
    )


@functools.cache
def standard_library(interpreter: str) -> tuple[str, ...]:
    """The folders of `interpreter`'s standard library (pure and compiled), as it reports them under ``-I -S``."""
    code = "import sys, sysconfig; print(*{sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib'), *sys.path})"
    out = subprocess.run([interpreter, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
    folders = {os.path.realpath(p) for p in out.split() if os.path.isdir(p)}
    return tuple(sorted(f for f in folders if not any(f.startswith(a + "/") for a in folders)))


@functools.cache
def shared_libraries(interpreter: str) -> tuple[tuple[str, str], ...]:
    """(path as the loader asks for it, real file) for every shared library the interpreter and its standard
    library's extension modules load, by ``ldd``."""
    objects = [interpreter]
    for folder in standard_library(interpreter):
        objects += [str(p) for p in Path(folder).rglob("*.so") if not _in_packages(str(p))]
    found = {}
    for i in range(0, len(objects), 200):
        done = subprocess.run(["ldd", *objects[i : i + 200]], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            for word in line.split():
                if word.startswith("/") and os.path.exists(word):
                    found[word] = os.path.realpath(word)
    return tuple(sorted(found.items()))


def _in_packages(path: str) -> bool:
    return any(f"/{name}/" in path or path.endswith(f"/{name}") for name in _PACKAGE_FOLDERS)


def view(interpreter: str, limits_tmp_mb: int) -> list[str]:
    """bubblewrap's arguments for the filesystem a sandbox sees (see the module docstring)."""
    options = bwrap_options()
    argv = ["--tmpfs", "/proc", "--dev", "/dev"]
    if "--size" in options:
        argv += ["--size", str(limits_tmp_mb << 20)]
    argv += ["--tmpfs", "/tmp"]
    if "--size" in options:
        argv += ["--size", str(max(1, limits_tmp_mb // 4) << 20)]
    argv += ["--tmpfs", "/dev/shm"]  # multiprocessing's semaphores and queues; emptied between jobs as /tmp is
    argv += ["--ro-bind", interpreter, interpreter]
    for folder in standard_library(interpreter):
        argv += ["--ro-bind", folder, folder]
        for packages in _package_folders(folder):  # never a third-party package: an empty folder over each
            argv += ["--tmpfs", packages, "--remount-ro", packages]
    for wanted, real in shared_libraries(interpreter):
        argv += ["--ro-bind", real, wanted]
    for folder in _SYSTEM_DATA:
        if os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    # The root, /proc and /dev stay read-only (a tmpfs without a size cap would let it fill the memory, and keep
    # what one completion writes for the next); /tmp and /dev/shm are capped, and emptied between two jobs.
    return [*argv, "--remount-ro", "/proc", "--remount-ro", "/dev", "--remount-ro", "/"]


def _package_folders(folder: str) -> list[str]:
    found = []
    for root, dirs, _ in os.walk(folder):
        for name in list(dirs):
            if name in _PACKAGE_FOLDERS:
                found.append(os.path.join(root, name))
                dirs.remove(name)
    return found


def bwrap_command(interpreter: str, tmp_mb: int) -> list[str]:
    """The command that starts `interpreter` in a sandbox of its own: every namespace unshared (no network, its own
    pids, no further user namespaces), the filesystem of :func:`view`, an empty environment, dying with its caller."""
    options = bwrap_options()
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1"]
    if "--disable-userns" in options:  # no nested user namespaces: less kernel surface for the completion
        argv += ["--unshare-user", "--disable-userns"]
    argv += view(interpreter, tmp_mb)
    argv += ["--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    return [*argv, "--", interpreter]


def unprivileged() -> dict:
    """As root, a sandbox runs as nobody, with bubblewrap or rlimits alone: RLIMIT_NPROC does not bind uid 0, and
    nobody can neither read root's files nor write the interpreter's standard library (which a completion run as root
    could poison for every judge after it, bubblewrap's included), nor signal root's processes."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    except KeyError:
        uid = gid = 65534
    return {"user": uid, "group": gid, "extra_groups": []}


def kill_marked(call_id: str) -> None:
    """SIGKILL every process whose environment carries this call's mark (rlimits mode has no pid namespace)."""
    import signal

    mark = f"{ENV_MARK}={call_id}".encode()
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
