"""The completion's side: runs the model-written code, then answers the judge's requests on the wire.

Shipped as source into the completion's sandbox (see ``harness.py``). Nothing here is secret or trusted once the
completion has run: it may rewrite any of this module, and all it can then do is answer the judge's requests with
whatever it likes, which the judge reads as data. The verdict lives in the other sandbox.
"""

import os
import sys
import types

from . import seccomp, server, wire

READY_KINDS = ("ok", "syntax", "runtime", "memory")


def job(control, link, work):
    os.close(control)  # the completion never holds the control socket: it cannot talk to the caller
    server.set_limits(work["limits"])
    seccomp.install()  # where it cannot be, the runner serves one job (main)
    status, detail, module = run(work["code"])
    endpoint = wire.Endpoint(link, float("inf"), wire.LooseRemote)
    found = None
    if status == "ok":  # what it defined of the names the tests take from it, sent with its "ready"
        try:
            found = endpoint.encode({n: module.__dict__[n] for n in work["names"] if n in module.__dict__})
        except BaseException as e:  # a value that cannot cross (nested too deep): no answer to give
            status, detail = "runtime", "its names could not be sent: " + one_line(e)
    try:
        wire.send(link, ["ready", status, detail, found])
        if status == "ok":
            endpoint.serve_forever()
    except wire.WireError:  # the judge has finished (or given up): nothing more to answer
        pass
    os._exit(0)


def run(code):
    """Compile and run the completion as the module ``__solution__``: ("ok" or an error kind, a detail, module)."""
    module = types.ModuleType("__solution__")
    sys.modules["__solution__"] = module  # dataclasses, pickle and typing look their module up there
    try:
        compiled = compile(code, "<completion>", "exec")
    except MemoryError as e:
        return "memory", one_line(e), module
    except BaseException as e:  # SyntaxError, or ValueError for a null byte
        return "syntax", one_line(e), module
    try:
        exec(compiled, module.__dict__)
    except MemoryError as e:
        return "memory", one_line(e), module
    except BaseException as e:  # SystemExit included: exiting early is no pass
        return "runtime", one_line(e), module
    return "ok", "", module


def one_line(error):
    try:
        return " ".join((f"{type(error).__name__}: {error}").splitlines())[:300]
    except BaseException:
        return type(error).__name__


def main():
    # Without a seccomp filter (an architecture without its table), a completion could leave System V or POSIX IPC
    # objects for the next one: serve one job, then a fresh sandbox.
    server.main(job, one_job=seccomp.program() is None)
