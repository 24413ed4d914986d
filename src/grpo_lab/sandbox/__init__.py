"""The one place model-written code runs, and the judge of it: a completion in one sandbox, its tests in another.

Owns: running completions against their problem's tests (``run``, ``run_many``), the verdict, and the sandboxes
themselves. May import: ``grpo_lab.errors`` only (the rewards and graders call it; it calls nothing of theirs).

Two processes per worker, each a sandbox of its own (bubblewrap: own pid, network, IPC and user namespaces, as
``nobody`` when we are root, a filesystem of the interpreter and its standard library only; see
``isolation.py``): the **runner** runs the completion and answers requests about what it defined; the **judge**
runs the problem's tests (the data set's, trusted), calls into the completion across a socket, and writes the
verdict on a channel the completion's process never holds (``harness.py``). Values cross as data, rebuilt on the
judge's side from an allow-list of builtin types; anything else crosses as an opaque handle that the tests may call
or pass back but never compare (``wire.py``). Which statements are tests, and which names come from the
completion, is decided before anything runs (``plan.py``). The threat model: docs/rewards-and-data.md.

``python -m grpo_lab.sandbox CODE.py --tests TESTS.py`` runs one completion and prints its verdict as one JSON line.
"""

from grpo_lab.sandbox.harness import MARKER, check_isolation, check_tests, run, run_many
from grpo_lab.sandbox.isolation import NO_BWRAP
from grpo_lab.sandbox.plan import Plan, SandboxError, plan
from grpo_lab.sandbox.verdict import ERRORS, ISOLATIONS, Isolation, Limits, Verdict

__all__ = [
    "ERRORS",
    "ISOLATIONS",
    "MARKER",
    "NO_BWRAP",
    "Isolation",
    "Limits",
    "Plan",
    "SandboxError",
    "Verdict",
    "check_isolation",
    "check_tests",
    "plan",
    "run",
    "run_many",
]
