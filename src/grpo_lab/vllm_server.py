"""`python -m grpo_lab.vllm_server [--port N] <the run's overrides>`: start, in the foreground, the vLLM server that
a run
with `trainer=grpo_vllm_server` trains against (the run's model; grpo_lab's weight loader on CPU).

The command only; the server, its checks and the job's own server are grpo_lab.vllm_engine.server's.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from grpo_lab.vllm_engine.server import command, on_cpu, server_env


def main() -> None:
    """Compose the run's config as `python -m grpo_lab` does, print the server's command line, and become it."""
    import argparse

    from grpo_lab.cli import hydra_app, parse_flags, report, throwaway_side_command

    parser = argparse.ArgumentParser(prog="python -m grpo_lab.vllm_server", add_help=False, allow_abbrev=False)
    parser.add_argument("--port", type=int, default=8000)
    options, overrides = parse_flags(sys.argv[1:], parser)

    @hydra_app
    def serve(raw: Any) -> None:
        from grpo_lab import config as config_mod
        from grpo_lab import models
        from grpo_lab.paths import cache_dir

        try:
            cfg = config_mod.load(raw)
            on_cpu()  # vLLM is here, before a model is built for it
            argv = command(models.served_path(cfg.model, cache_dir()), options.port, extra=list(cfg.vllm_server.args))
        except Exception as e:
            sys.exit(report(e, verbose=options.verbose))
        print("VLLM_SERVER_DEV_MODE=1 " + " ".join(argv), flush=True)
        # exec replaces this process: the temporary Hydra folder's cleanup would never run, so it goes now.
        from hydra.core.hydra_config import HydraConfig

        shutil.rmtree(HydraConfig.get().runtime.output_dir, ignore_errors=True)
        os.execve(argv[0], argv, server_env())

    throwaway_side_command(serve, overrides, prefix="grpo_lab_vllm_server_", verbose=options.verbose)


if __name__ == "__main__":
    main()
