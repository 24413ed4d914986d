"""What a completion may use (:class:`Limits`) and how it did (:class:`Verdict`)."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import asdict, dataclass
from typing import Literal

Isolation = Literal["bwrap", "rlimits"]
ISOLATIONS = ("bwrap", "rlimits")
ERRORS = ("syntax", "timeout", "memory", "output_limit", "runtime", "killed", "sandbox")
_SHOWN = 2000  # characters of the completion's output in the command line's JSON verdict


@dataclass(frozen=True)
class Limits:
    """What one completion may use. ``cpu_seconds`` defaults to the wall-clock ``timeout`` rounded up. The default
    timeout is conf/reward/code.yaml's (the code reward's); ``python -m grpo_lab.sandbox`` takes the same."""

    timeout: float = 10.0  # wall-clock seconds for the whole call: start, the completion's own code, every test
    cpu_seconds: int | None = None  # RLIMIT_CPU of each process
    memory_mb: int = 1024  # RLIMIT_AS: address space, so that a memory bomb is a MemoryError
    processes: int = 40  # processes and threads beyond the sandbox's first process (RLIMIT_NPROC): a thread pool fits
    file_size_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 1 << 18  # stdout + stderr read before the completion is stopped
    tmp_mb: int = 64  # size of the private /tmp (bwrap)

    def rlimits(self) -> list[int]:
        """The sandbox's view: CPU s, address space, processes, file size, open files, alarm s (all bytes/ints)."""
        cpu = self.cpu_seconds or max(1, math.ceil(self.timeout))
        mib = 1 << 20
        alarm = math.ceil(self.timeout) + 2
        return [cpu, self.memory_mb * mib, self.processes, self.file_size_mb * mib, self.open_files, alarm]


@dataclass(frozen=True)
class Verdict:
    """How one completion did: ``passed`` of ``total`` tests (those that passed before any error), and an ``error``
    kind (see :data:`ERRORS`) when its code did not run or its tests did not all run."""

    passed: int
    total: int
    error: str | None
    seconds: float
    peak_memory_mb: float
    isolation: str
    detail: str = ""  # one line: the first failure, or why there is no verdict (printable: no control characters)
    stdout: str = ""  # what the completion printed, up to Limits.output_bytes (printable)
    stderr: str = ""

    @property
    def reward(self) -> float:
        """The share of tests passed (a timeout or a crash keeps those that passed before it); 0 when the sandbox
        itself failed."""
        return 0.0 if self.error == "sandbox" or not self.total else self.passed / self.total

    def summary(self) -> dict:
        """The JSON line of ``python -m grpo_lab.sandbox``: the completion's output is in ``output`` (capped)."""
        keys = ("passed", "total", "error", "seconds", "peak_memory_mb", "isolation", "detail")
        line = {key: value for key, value in asdict(self).items() if key in keys}
        output = self.stdout + self.stderr
        line["output"] = output if len(output) <= _SHOWN else output[:_SHOWN] + f"... ({len(output)} characters)"
        return line


def printable(text: str) -> str:
    """`text` with every control and format character but newline and tab escaped (``\\x1b``, ``\\u202e``): what a
    completion prints or raises can never move a terminal's cursor, recolour it, or hide text."""
    if text.isprintable() or all(ch in "\n\t" or ch.isprintable() for ch in text):
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def one_line(text: str, limit: int = 300) -> str:
    """`text` printable, on one line, at most `limit` characters."""
    text = " ".join(printable(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
