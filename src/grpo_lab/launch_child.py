"""`python -m grpo_lab.launch_child JOB_JSON`: one of the `accelerate launch` processes of a job.

It runs the already composed and validated config the parent wrote (never composes again, never sweeps);
the main process records the run (metrics.json) for the parent. Started by grpo_lab.launch, not by users.
It stops by itself if the parent dies (a watchdog on the parent's pid), and exits 130/143 when
interrupted (the run is recorded as interrupted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_file: str) -> int:
    from grpo_lab import startup

    startup.pause()  # until the model is loaded: see grpo_lab.startup
    import optuna

    from grpo_lab import config as config_mod
    from grpo_lab import interrupts
    from grpo_lab.train import RunContext, run

    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    ctx_data = dict(job["context"])
    ctx = RunContext(
        run_dir=Path(ctx_data.pop("run_dir")),
        cache_dir=Path(ctx_data.pop("cache_dir")),
        **{k: tuple(v) if k == "extra_tags" else v for k, v in ctx_data.items()},
    )
    # The main process records the result in the run folder's metrics.json, which the parent reads.
    with interrupts.handling():
        try:
            if job.get("parent_pid"):
                interrupts.exit_with_parent(int(job["parent_pid"]))
            run(config_mod.load(job["config"]), ctx)
        except optuna.TrialPruned:
            return 0  # recorded as pruned; not a crash
        except KeyboardInterrupt as e:  # recorded as interrupted by the main process
            return interrupts.exit_code_for(e) or 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
