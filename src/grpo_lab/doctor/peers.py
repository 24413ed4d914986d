"""Before a job that spans machines: can this machine reach machine 0's address and port, and does every machine
run the same Python, grpo_lab, torch, transformers, TRL and accelerate?

The doctor runs on every machine with the same overrides, as the job will. Machine 0 binds the job's
`main_process_ip:main_process_port` itself (the address torch's rendezvous will listen on), so a port in use or an
address that is not machine 0's shows at once; the others connect to it as torch's processes will. Each side
sends one JSON line, `{"machine_rank": k, "host": name, "versions": {...}}`, and compares what comes back.
Machine 0 closes the port before its doctor ends, so the real launch finds it free.
"""

from __future__ import annotations

import contextlib
import errno
import json
import platform
import socket
import time
from collections.abc import Mapping
from typing import Any

from grpo_lab.config import LauncherConfig
from grpo_lab.doctor.checks import Check
from grpo_lab.doctor.environment import DIST, version
from grpo_lab.errors import ConfigError
from grpo_lab.launch import machines as machines_mod

WAIT_S = 60.0  # how long each doctor waits for the others (`--wait`): time to start it on every machine
_RETRY_S = 0.5  # between attempts to reach machine 0
_CONNECT_S = 3.0  # one connection attempt (a dropped SYN waits this long)
_IO_S = 10.0  # one JSON line each way, once connected
_MAX_LINE = 64 * 1024
# (shown name, distribution name): what must match across machines for their processes to train together
PACKAGES = (
    ("grpo_lab", DIST), ("torch", "torch"), ("transformers", "transformers"), ("trl", "trl"),
    ("accelerate", "accelerate"),
)  # fmt: skip
_SAME_FIX = "install the same versions on every machine"


def local_versions() -> dict[str, str]:
    """This machine's versions of what the machines must share, python first."""
    versions = {"python": platform.python_version()}
    versions.update({shown: version(dist) or "not installed" for shown, dist in PACKAGES})
    return versions


def compare_versions(mine: Mapping[str, str], theirs: Mapping[str, str], other: str, *, host: str = "") -> Check:
    """One row for machine `other` ("machine 1"): ok when every version matches this machine's, else fail naming each
    difference."""
    where = f"{other} ({host})" if host else other
    names = [*mine, *(k for k in theirs if k not in mine)]
    differ = [
        f"{name} {mine.get(name, 'unknown')} here, {theirs.get(name, 'unknown')} on {other}"
        for name in names
        if mine.get(name) != theirs.get(name)
    ]
    if differ:
        return Check(other, "fail", f"{where} runs other versions: {'; '.join(differ)}", _SAME_FIX)
    return Check(other, "ok", f"{where}: same {'/'.join(names)}")


def job_shape(launcher: LauncherConfig, machines: machines_mod.Machines) -> dict[str, str]:
    """What every machine's command must agree on (the launch refuses, or hangs at the rendezvous, otherwise)."""
    return {
        "launcher.num_processes": str(launcher.num_processes),
        "launcher.num_machines": str(machines.num_machines),
        "launcher.config_file": str(launcher.config_file),
    }


def compare_jobs(mine: Mapping[str, str], theirs: Mapping[str, str] | None, other: str) -> list[Check]:
    """A blocker when machine `other` was started with another job shape; none when they agree (or it sent none)."""
    differ = [f"{k}={v} here, {theirs.get(k)} on {other}" for k, v in mine.items() if theirs and theirs.get(k) != v]
    if not differ:
        return []
    return [Check(other, "fail", f"{other} runs another job: {'; '.join(differ)}", "run the same overrides everywhere")]


def peer_checks(launcher: LauncherConfig, env: Mapping[str, str], *, wait_s: float = WAIT_S) -> list[Check]:
    """The rows for a job across machines; none on one machine. Waits up to `wait_s` for the other machines."""
    try:
        machines = machines_mod.resolve(launcher, env)
    except ConfigError as e:
        return [Check("machines", "fail", str(e))]  # its one line says which key to set
    if not machines.several:
        return []
    hello = {
        "machine_rank": machines.machine_rank,
        "host": socket.gethostname(),
        "versions": local_versions(),
        "job": job_shape(launcher, machines),
    }
    if machines.is_main:
        return _host(machines, hello, wait_s)
    return _join(machines, hello, wait_s)


# ------------------------------------------------------------------------------------------------ machine 0
def _host(machines: machines_mod.Machines, hello: dict[str, Any], wait_s: float) -> list[Check]:
    """Machine 0: listen where the rendezvous will, answer each machine that reports, then free the port."""
    ip, port, n = machines.main_process_ip, machines.main_process_port, machines.num_machines
    try:
        family = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM)[0][0]  # an IPv6 address binds too
        listener = socket.create_server((ip, port), family=family)  # SO_REUSEADDR: a closed doctor's port binds again
    except OSError as e:
        return [_bind_failure(str(ip), int(port or 0), e)]
    with listener:
        reports = _gather(listener, hello, n - 1, time.monotonic() + wait_s)
    heard = sorted({r for r, _ in reports})
    rows = [
        Check(
            "machines",
            "ok",
            f"machine 0 of {n}: {ip}:{port} free here; {len(heard)} of {n - 1} other machines reported",
        )
    ]
    rows += _duplicates(reports)
    first = {rank: message for rank, message in reversed(reports)}  # a duplicate rank: its first report
    for rank in heard:
        rows.append(
            compare_versions(hello["versions"], first[rank]["versions"], f"machine {rank}", host=first[rank]["host"])
        )
        rows += compare_jobs(hello["job"], first[rank].get("job"), f"machine {rank}")
    rows += [_missing(rank, wait_s) for rank in range(1, n) if rank not in first]
    return rows


def _bind_failure(ip: str, port: int, error: OSError) -> Check:
    if error.errno == errno.EADDRINUSE:
        return Check(
            "machines", "fail", f"port {port} is in use on machine 0", "launcher.main_process_port=<another port>"
        )
    if isinstance(error, socket.gaierror):
        return _unresolved(ip)
    return Check(
        "machines",
        "fail",
        f"main_process_ip {ip} is not an address of this machine: machine 0 must be the host at main_process_ip "
        f"({error.strerror or error})",
        "run launcher.machine_rank=0 on the machine at main_process_ip, or set launcher.main_process_ip to this one's",
    )


def _unresolved(ip: str) -> Check:
    return Check(
        "machines", "fail", f"main_process_ip {ip} does not resolve", "launcher.main_process_ip=<machine 0's address>"
    )


def _gather(listener: socket.socket, hello: dict[str, Any], expected: int, deadline: float) -> list[tuple[int, dict]]:
    """(rank, message) of each machine that reported before `deadline`, in arrival order; stops at `expected`."""
    reports: list[tuple[int, dict]] = []
    while len({r for r, _ in reports}) < expected and (left := deadline - time.monotonic()) > 0:
        listener.settimeout(left)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            break
        with conn:
            try:
                conn.settimeout(_IO_S)
                message = _read(conn)
                conn.sendall(_line(hello))
                _await_close(conn)
            except (OSError, ValueError):
                continue  # not a doctor (a port scan, a half-open connection): keep waiting for the real ones
        reports.append((message["machine_rank"], message))
    return reports


def _await_close(conn: socket.socket) -> None:
    """Let the other side hang up first: TIME_WAIT then stays on its ephemeral port, not on the job's port."""
    conn.settimeout(2.0)
    with contextlib.suppress(OSError):
        conn.recv(1)


def _duplicates(reports: list[tuple[int, dict]]) -> list[Check]:
    hosts: dict[int, list[str]] = {}
    for rank, message in reports:
        hosts.setdefault(rank, []).append(message["host"])
    return [
        Check(
            "machines",
            "fail",
            f"{len(names)} machines say launcher.machine_rank={rank} ({', '.join(names)})",
            "give each machine its own launcher.machine_rank, 0 to num_machines-1",
        )
        for rank, names in sorted(hosts.items())
        if len(names) > 1
    ]


def _missing(rank: int, wait_s: float) -> Check:
    return Check(
        f"machine {rank}",
        "warn",
        f"machine {rank} did not report within {wait_s:g} s",
        f"run the doctor there with the same overrides (launcher.machine_rank={rank}) while this one waits (--wait)",
    )


# ------------------------------------------------------------------------------------------ machines 1 to N-1
def _join(machines: machines_mod.Machines, hello: dict[str, Any], wait_s: float) -> list[Check]:
    """Machine k: reach machine 0's doctor as torch's processes will reach its rendezvous, until `wait_s`."""
    ip, port = str(machines.main_process_ip), int(machines.main_process_port or 0)
    deadline, refused, why = time.monotonic() + wait_s, False, "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            conn = socket.create_connection((ip, port), timeout=max(min(left, _CONNECT_S), 0.1))
        except socket.gaierror:
            return [_unresolved(ip)]
        except ConnectionRefusedError:
            refused = True  # the host answered: machine 0's doctor is not listening yet
        except OSError as e:  # a timeout, no route: a firewall or a wrong address, or the network is slow
            why = e.strerror or type(e).__name__
        else:
            return _exchange(machines, conn, hello)
        if (left := deadline - time.monotonic()) <= 0:
            break
        time.sleep(min(_RETRY_S, left))  # the last try comes at the deadline
    if refused:  # refused connections come from a host at that address
        return [
            Check(
                "machines",
                "warn",
                f"{ip} is reachable but nothing listens on {port} (waited {wait_s:g} s)",
                "run the doctor on machine 0 at the same time, with the same overrides and launcher.machine_rank=0",
            )
        ]
    return [
        Check(
            "machines",
            "fail",
            f"cannot reach {ip}:{port} from this machine ({why}): a firewall, or a wrong address",
            "open the port between the machines, or set launcher.main_process_ip to an address of machine 0 that "
            "this machine reaches",
        )
    ]


def _exchange(machines: machines_mod.Machines, conn: socket.socket, hello: dict[str, Any]) -> list[Check]:
    ip, port, n = machines.main_process_ip, machines.main_process_port, machines.num_machines
    with conn:
        try:
            conn.settimeout(_IO_S)
            conn.sendall(_line(hello))
            reply = _read(conn)
        except (OSError, ValueError) as e:
            detail = f"{ip}:{port} accepted, but did not answer as grpo_lab's doctor ({type(e).__name__})"
            fix = "something else (a running job?) may hold that port on machine 0: another launcher.main_process_port"
            return [Check("machines", "fail", detail, fix)]
    rows = [Check("machines", "ok", f"machine {machines.machine_rank} of {n}: reached machine 0 at {ip}:{port}")]
    rows.append(compare_versions(hello["versions"], reply["versions"], "machine 0", host=reply["host"]))
    return [*rows, *compare_jobs(hello["job"], reply.get("job"), "machine 0")]


# ------------------------------------------------------------------------------------------------- the wire
def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _read(conn: socket.socket) -> dict[str, Any]:
    """One JSON line from the other doctor; ValueError for anything else."""
    with conn.makefile("rb") as stream:
        line = stream.readline(_MAX_LINE)
    message = json.loads(line)
    if not (
        isinstance(message, dict)
        and isinstance(message.get("machine_rank"), int)
        and isinstance(message.get("versions"), dict)
    ):
        raise ValueError("not a doctor's report")
    if not isinstance(message.get("host"), str):
        message["host"] = "?"
    return message
