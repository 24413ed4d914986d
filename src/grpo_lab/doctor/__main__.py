"""`python -m grpo_lab.doctor [--json] [--wait SECONDS] [the run's overrides]`: exit 0 when nothing blocks the run,
1 otherwise. `--wait`: on a job across machines, how long each machine's doctor waits for the others (default 60)."""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig

from grpo_lab.cli import hydra_app, parse_flags, report, throwaway_side_command
from grpo_lab.doctor.peers import WAIT_S
from grpo_lab.paths import cache_dir


def examine(cfg: DictConfig, *, as_json: bool, verbose: bool, wait_s: float = WAIT_S) -> None:
    """The Hydra job: every check, printed as a table or JSON; exits 1 on a blocker."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab import doctor

    try:  # inside the job: Hydra would add its own "Error executing job" line
        rows = doctor.collect(cfg, sweeper=HydraConfig.get().sweeper, cache_dir=cache_dir(), wait_s=wait_s)
    except Exception as e:
        sys.exit(report(e, verbose=verbose))
    print(doctor.to_json(rows) if as_json else f"\n== grpo_lab doctor ==\n{doctor.render(rows)}", flush=True)
    if any(r.status == "fail" for r in rows):
        sys.exit(1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"--wait takes a number of seconds, 0 or more, not {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.doctor", add_help=False, allow_abbrev=False)
    parser.add_argument("--json", action="store_true")
    # a job across machines: how long each machine's doctor waits for the others (start it on each meanwhile)
    parser.add_argument("--wait", type=_seconds, default=WAIT_S, metavar="SECONDS")
    options, args = parse_flags(sys.argv[1:], parser)

    @hydra_app
    def doctor(cfg: DictConfig) -> None:
        examine(cfg, as_json=options.json, verbose=options.verbose, wait_s=options.wait)

    throwaway_side_command(doctor, args, prefix="grpo_lab_doctor_", verbose=options.verbose)


if __name__ == "__main__":
    main()
