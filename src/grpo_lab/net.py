"""This machine's loopback address and a free port on it: for the services a job starts beside itself (the
rendezvous of `accelerate launch`, a vLLM server, the sweep's storage proxy)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now (the OS's pick; another process could take it before it is used)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
