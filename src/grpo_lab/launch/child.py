"""`python -m grpo_lab.launch.child JOB_JSON`: one of the `accelerate launch` processes of a job.

It runs the job spec the parent built (grpo_lab.config.job: never composes or checks again, never sweeps);
the main process records the run (metrics.json) for the parent. Started by grpo_lab.launch.processes, not by users.
It stops by itself if the parent dies (a watchdog on the parent's pid), and exits 130/143 when
interrupted (the run is recorded as interrupted).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError


def main(job_file: str) -> int:
    from grpo_lab import startup

    startup.pause()  # until the model is loaded: see grpo_lab.startup
    import optuna

    from grpo_lab import interrupts
    from grpo_lab.config import JobSpec
    from grpo_lab.run.train import run

    job = json.loads(Path(job_file).read_text(encoding="utf-8"))
    spec = JobSpec.from_json(job["spec"])  # the parent's spec: its rules passed, it is not composed or checked again
    # The main process records the result in the run folder's metrics.json, which the parent reads.
    with interrupts.handling():
        try:
            if job.get("parent_pid"):
                interrupts.exit_with_parent(int(job["parent_pid"]))
            check_same_settings(spec)
            run(spec)
        except optuna.TrialPruned:
            leave_together()
            return 0  # recorded as pruned; not a crash
        except KeyboardInterrupt as e:  # recorded as interrupted by the main process
            return interrupts.exit_code_for(e) or 130
    leave_together()
    return 0


def leave_together() -> None:
    """Every process of a job that ended well leaves torch.distributed together: the others wait for the main
    one's evaluations after training, then the group is destroyed. A process that exited while its peers still
    held the group died in gloo's teardown (`terminate called without an active exception`, SIGABRT: seen in CI
    with the test part graded after training), and the launcher then stopped the job as failed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def check_same_settings(spec: Any) -> None:
    """Every machine of a job builds its spec from its own command line: before any weight moves, each process
    compares its settings with process 0's and the job stops on every process with one line naming the first key
    that differs. The machines' own places (launcher.*) may differ."""
    import torch.distributed as dist

    # The job's GRPOConfig (built once: training uses it) starts torch.distributed as TRL configures it.
    spec.grpo_config().device  # noqa: B018
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = spec.run.model_dump(mode="json", exclude={"launcher"})
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            key, first, other = _first_difference(everyone[0], theirs)
            raise ConfigError(
                f"The processes of this job run different settings: `{key}` is {other!r} in process {rank} and "
                f"{first!r} in process 0. Start every machine with the same command (the same overrides), changing "
                "only launcher.machine_rank."
            )


def _first_difference(a: Any, b: Any, key: str = "") -> tuple[str, Any, Any]:
    if isinstance(a, dict) and isinstance(b, dict):
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                return _first_difference(a.get(name), b.get(name), f"{key}.{name}" if key else name)
    return key, a, b


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
