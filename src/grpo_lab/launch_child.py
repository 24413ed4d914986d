"""`python -m grpo_lab.launch_child JOB_JSON`: one of the `accelerate launch` processes of a job.

It runs the already composed and validated config the parent wrote (never composes again, never sweeps);
the main process writes the result for the parent. Started by grpo_lab.launch, not by users.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(job_file: str) -> int:
    from grpo_lab import config as config_mod
    from grpo_lab import records
    from grpo_lab.train import RunContext, result_to_json, run

    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    ctx_data = dict(job["context"])
    ctx = RunContext(
        run_dir=Path(ctx_data.pop("run_dir")),
        cache_dir=Path(ctx_data.pop("cache_dir")),
        **{k: tuple(v) if k == "extra_tags" else v for k, v in ctx_data.items()},
    )
    cfg = config_mod.load(job["config"])
    main_process = os.environ.get("RANK", "0") == "0"  # set by accelerate/torchrun for every process
    result_file = Path(job["result_file"])
    try:
        result = run(cfg, ctx)
    except BaseException as e:
        import optuna

        if main_process:
            status = "pruned" if isinstance(e, optuna.TrialPruned) else "failed"
            records.write_json(result_file, {"status": status, "error": f"{type(e).__name__}: {e}"})
        if isinstance(e, optuna.TrialPruned):
            return 0
        raise
    if main_process:
        records.write_json(result_file, result_to_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
