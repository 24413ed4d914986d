"""`python -m grpo_lab.sandbox CODE.py --tests TESTS.py`: one completion's verdict as one JSON line on stdout.

The completion's output never reaches the terminal: it is in the verdict's ``output`` (capped, with every control
character escaped), so stdout carries exactly one line, the verdict.
"""

from __future__ import annotations

import argparse
import json
import sys

from grpo_lab.errors import GrpoLabError, describe
from grpo_lab.sandbox.harness import run
from grpo_lab.sandbox.verdict import ISOLATIONS, Limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("code", help="the completion's code")
    parser.add_argument("--tests", required=True, help="assert lines, check(fn) and its call, or check(candidate)")
    parser.add_argument("--entry-point", default=None, help="the function the tests' check(candidate) receives")
    parser.add_argument(
        "--preamble",
        default=None,
        help="the problem's own code (HumanEval's prompt): before the completion's, and the tests use its helpers",
    )
    parser.add_argument("--isolation", choices=ISOLATIONS, default="bwrap")
    parser.add_argument("--timeout", type=float, default=Limits.timeout, help="wall-clock seconds")
    options = parser.parse_args(argv)
    try:
        texts = {}
        for key in ("code", "tests", "preamble"):
            path = getattr(options, key)
            if path is not None:
                with open(path) as f:
                    texts[key] = f.read()
        verdict = run(
            texts["code"],
            texts["tests"],
            entry_point=options.entry_point,
            preamble=texts.get("preamble"),
            limits=Limits(timeout=options.timeout),
            isolation=options.isolation,
        )
    except (GrpoLabError, OSError) as e:
        print(f"Error: {describe(e)}", file=sys.stderr)
        return 1
    print(json.dumps(verdict.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
