"""`python -m grpo_lab.check_rewards [--prompts N] [the run's overrides]`: the rewards of the untrained model.

Composes the run exactly as `python -m grpo_lab` would (same groups, overrides and validation), samples N
training prompts (default 8) x num_generations completions and prints, per reward, its mean, std and the
share of prompts whose completions all scored the same, then a verdict. The numbers (reward_check.json)
and a histogram (reward_check.png) go into a run folder. Exit status: 0 healthy, 2 no learning signal,
1 an error (see grpo_lab.run.reward_check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import DictConfig

from grpo_lab.cli import hydra_app, parse_flags, report, side_command
from grpo_lab.paths import cache_dir

RUN_DIR = "outputs/reward_checks/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"


def check(cfg: DictConfig, *, prompts: int, verbose: bool) -> None:
    """The Hydra job: check, write and print the report; exits 2 without a learning signal."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab import config as config_mod
    from grpo_lab.run import reward_check

    try:  # inside the job: Hydra would add its own "Error executing job" line
        run_cfg = config_mod.load(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        result = reward_check.check(run_cfg, cache_dir(), prompts=prompts)
        written = reward_check.write(result, run_dir)
    except Exception as e:
        sys.exit(report(e, verbose=verbose))
    notes = "".join(f"{line}\n" for line in result.notes())
    print(
        f"\n== grpo_lab reward check: {result.prompts} prompts x {result.generations} completions of the untrained "
        f"model, {result.seconds:.0f} s ==\n{reward_check.table(result)}\n\n{result.verdict}\n{notes}"
        f"Written: {', '.join(str(p) for p in written)}",
        flush=True,
    )
    if not result.healthy:
        sys.exit(2)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--prompts takes a number of prompts, 1 or more, not {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.check_rewards", add_help=False, allow_abbrev=False)
    parser.add_argument("--prompts", type=_count, default=8)  # training prompts sampled
    options, args = parse_flags(sys.argv[1:], parser)

    @hydra_app
    def check_rewards(cfg: DictConfig) -> None:
        check(cfg, prompts=options.prompts, verbose=options.verbose)

    side_command(check_rewards, args, RUN_DIR, verbose=options.verbose)


if __name__ == "__main__":
    main()
