"""One row of the doctor's report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# fail: a blocker (the run would not start or would crash); warn: it runs, but not as you may expect;
# info: a fact worth knowing (a CPU-only machine, W&B offline); ok: checked and fine.
Status = Literal["ok", "info", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
