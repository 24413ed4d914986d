"""The judge's side: runs the problem's tests against the completion, across the wire, and writes the verdict.

Shipped as source into the judge's sandbox (see ``harness.py``): a process that runs no model-written code. The
tests get a namespace of their own: the judge's builtins, the standard-library modules they name, the problem's
helpers (its preamble, run here), and, for each name they take from the completion, what the completion's process
answers: a value rebuilt from data, or a handle whose calls cross the wire. Progress (``progress <job> <passed>``,
after each test that passed) and the verdict (``verdict <job> <json>``) go to the caller on the control socket, which
only this side holds.
"""

import builtins
import importlib
import json
import os
import time

from . import server, wire

# Why the tests stopped early: the wire broke, or the completion took too long or ended, so nothing more can run.
_STOPS = ("timeout", "gone", "protocol")


def job(control, link, work):
    server.set_limits(work["limits"])
    deadline = time.monotonic() + work["timeout"]
    number = work["job"]

    def report(word, text):
        os.write(control, f"{word} {number} {text}\n".encode("utf-8", "replace"))

    verdict = Judge(link, deadline, work, lambda passed: report("progress", str(passed))).run()
    os.close(link)  # the completion's process ends now, while the verdict is written
    report("verdict", json.dumps(verdict))
    os._exit(0)


class Judge:
    def __init__(self, link, deadline, work, progress):
        self.endpoint = wire.Endpoint(link, deadline, wire.Remote, wire.judge_guard)
        self.work, self.progress = work, progress
        self.passed, self.kind, self.detail = 0, "-", ""

    def run(self):
        """[passed, total, kind, detail]: kind "-" when every test ran, or why they stopped."""
        namespace = self.prepare()  # while the completion's code runs in the other sandbox
        if namespace is not None:
            found = self.ready()
            if found is not None and self.add_names(namespace, found):
                self.tests(namespace)
        return [self.passed, self.work["total"], self.kind, self.detail]

    def prepare(self):
        """The tests' namespace without the completion's names (builtins, modules, the problem's helpers), and the
        tests compiled."""
        # "__main__": the tests are a script (an `if __name__ == "__main__":` block of theirs runs, as it would alone).
        namespace = {"__builtins__": builtins, "__name__": "__main__"}
        try:
            for name in self.work["modules"]:
                namespace[name] = importlib.import_module(name)
            for name, module in self.work["imported"]:
                namespace[name] = getattr(importlib.import_module(module), name)
            if self.work["preamble"]:
                exec(compile(self.work["preamble"], "<preamble>", "exec"), namespace)
            self.compiled = [(compile(source, "<tests>", "exec"), is_test) for source, is_test in self.work["segments"]]
        except BaseException as e:
            self.kind, self.detail = "tests", "the problem's own code failed: " + one_line(e)
            return None
        for name in self.work["names"]:
            namespace.pop(name, None)  # a stub of the preamble's: the completion's own, or nothing
        return namespace

    def ready(self):
        """Wait for the completion to have run: what it defined of the names asked for (as it sent them), or None
        when it did not run (the error kind it ended in)."""
        try:
            message = wire.receive(self.endpoint.fd, self.endpoint.deadline)
        except wire.WireError as e:
            self.kind, self.detail = e.why, self.stopped(e.why, str(e))
            return None
        if type(message) is not list or len(message) != 4 or message[0] != "ready" or type(message[2]) is not str:
            self.kind, self.detail = "protocol", "the completion's process did not report how its code ran"
            return None
        if message[1] == "ok":
            return message[3]
        if message[1] in ("syntax", "runtime", "memory"):
            self.kind, self.detail = message[1], message[2][:300]
        else:
            self.kind, self.detail = "protocol", "the completion's process did not report how its code ran"
        return None

    def add_names(self, namespace, item):
        """The completion's names, as values or handles; False when they are not what was asked for."""
        try:
            found = self.endpoint.decode(item)
        except BaseException as e:  # not a value: the completion broke the protocol
            found, why = None, one_line(e)
        else:
            why = "no names"
        if type(found) is not dict:
            self.kind, self.detail = "protocol", f"the completion's process answered with {why}"
            return False
        for name in self.work["wanted"]:
            if name in found:
                namespace[name] = found[name]
        self.absent = [name for name in self.work["names"] if name not in found]
        return True

    def tests(self, namespace):
        for code, is_test in self.compiled:
            try:
                exec(code, namespace)
            except wire.CallFailed as e:
                why, detail = self.failure(e)
                self.detail = self.detail or detail
                if why in _STOPS:
                    self.kind = why
                    return
                if not is_test:
                    return
            except BaseException as e:  # SystemExit included
                self.detail = self.detail or self.explain(e)
                if not is_test:  # a setup statement failed: the tests after it count as failed
                    return
            else:
                if is_test:
                    self.passed += 1
                    self.progress(self.passed)

    def failure(self, error):
        why = getattr(error, "why", "exit")
        return why, self.stopped(why, str(error))

    def stopped(self, why, text):
        if why == "timeout":
            return "ran past its time limit"
        if why == "gone":
            return "the completion's process ended"
        return text[:300]

    def explain(self, error):
        if isinstance(error, NameError) and getattr(error, "name", None) in getattr(self, "absent", ()):
            return f"NameError: the completion defines no {error.name}"
        return one_line(error)


def one_line(error):
    return " ".join((f"{type(error).__name__}: {error}").splitlines()).removesuffix(": ")[:300]


def main():
    server.main(job, guard=False)
