"""A warm interpreter for the tests' CLI runs: one process per pytest worker imports torch, transformers, TRL,
datasets and W&B once, then forks a new process for each `python -m grpo_lab ...` a test starts.

Why: a smoke run of the tiny model takes ~5.5 s, of which ~4.3 s is importing (`python -X importtime`): TRL's
GRPOConfig alone pulls in transformers' model machinery and peft (~2 s), torch ~1 s. The suite starts a few hundred
such runs. Each forked job is still its own process, with the test's argv, environment, working folder and
stdin/stdout/stderr (the caller's own file descriptors, passed over a Unix socket), and it exits with its own code;
only the import of those libraries is done once, before any run.

The shape: `run_cli` starts a tiny client (`python -S -c`, ~20 ms) exactly as it would start `python -m MODULE`
(same argv tail, environment and folder, under subprocess.run's capture and timeout). The client hands its
file descriptors 0-2 and its request to the server, which forks a handler; the handler forks the job and waits for
it, or for the client to die (subprocess.run's timeout kills the client: the handler then kills the job), and
reports the job's exit status, which the client exits with (a job killed by a signal: the client kills itself with
the same signal). Nothing here runs without a fresh interpreter on request: `conftest.run_cli(fresh=True)`, an
environment that differs from the server's in more than PYTHONPATH, coverage runs, and GRPO_LAB_TEST_FRESH=1.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading

# What a training run imports, in the order a run does; grpo_lab's own modules are cheap and imported by the job.
PRELOAD = ("torch", "transformers", "datasets", "peft", "trl", "wandb", "scipy.stats", "optuna", "hydra", "omegaconf")

CLIENT = """
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
request = {"module": sys.argv[2], "args": sys.argv[3:], "env": dict(os.environ), "cwd": os.getcwd()}
socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
reply = s.recv(1 << 16)
code = json.loads(reply)["returncode"] if reply else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def client_argv(socket_path: str, module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-S", "-c", CLIENT, socket_path, module, *args]


def _serve(socket_path: str) -> dict:
    """Import, listen, fork a handler per request. Returns only in a job process, with its request."""
    for name in PRELOAD:
        importlib.import_module(name)
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401  (trl's lazy module: the heavy part is here)

    # A thread alive at fork would be missing in every job, with whatever lock it held: refuse to serve.
    if threading.active_count() != 1:
        print(f"not ready: {threading.active_count()} threads after the imports", flush=True)
        sys.exit(3)
    # The imported libraries' objects leave the cyclic collector's view (they live as long as the job anyway): a job's
    # collections, above all the one at its interpreter's exit, would otherwise walk them all and, by touching their
    # pages, copy them out of the shared memory. Measured: a job that exits at once took 1.6 s to end, 0.36 s frozen.
    # Nothing of the job changes: its own objects are collected as usual and its exit runs the same finalisation.
    if not os.environ.get("GRPO_LAB_TEST_WARM_UNFROZEN"):  # the baseline of benchmarks/warm_jobs.py
        gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return _handle(conn)
        conn.close()


def _handle(conn: socket.socket) -> dict:
    """The handler: fork the job, wait for it (or for its client to die), report its exit status."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        return request
    for fd in fds:
        os.close(fd)
    job = os.pidfd_open(pid)
    ready, _, _ = select.select([job, conn], [], [])
    if conn in ready and job not in ready:  # the client is gone (killed on a timeout): so is its job
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):  # the client is gone
        conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
    os._exit(0)


def _run_job(request: dict) -> None:
    """`python -m MODULE ARGS` in this process, as a fresh interpreter would start it."""
    env = request["env"]
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    wanted = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in own]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    sys.path[:0] = [request["cwd"], *wanted]  # `-m` puts the working folder first, then PYTHONPATH
    importlib.invalidate_caches()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    del sys.path[0]  # this folder (tests/): a job sees only what `python -m` would give it
    _run_job(_serve(sys.argv[1]))
