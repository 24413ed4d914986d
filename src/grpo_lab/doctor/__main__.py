"""`python -m grpo_lab.doctor [--json] [the run's overrides]`: exit 0 when nothing blocks the run, 1 otherwise."""

from __future__ import annotations

import shutil
import sys
import tempfile

import hydra
from omegaconf import DictConfig

from grpo_lab.cli import _report, side_command
from grpo_lab.paths import CONF_DIR, cache_dir


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _task(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab import doctor

    try:  # inside the job: Hydra would add its own "Error executing job" line
        sweeper = HydraConfig.get().sweeper
        rows = doctor.collect(cfg, sweeper=sweeper, cache_dir=cache_dir())
    except Exception as e:
        sys.exit(_report(e))
    if _task.as_json:
        print(doctor.to_json(rows), flush=True)
    else:
        print(f"\n== grpo_lab doctor ==\n{doctor.render(rows)}", flush=True)
    if any(r.status == "fail" for r in rows):
        sys.exit(1)


def main() -> None:
    argv = sys.argv[1:]
    _task.as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    # Nothing of the doctor's is kept: its Hydra folder (the job's log) is a temporary one.
    folder = tempfile.mkdtemp(prefix="grpo_lab_doctor_")
    try:
        side_command(_task, [*argv, "hydra.output_subdir=null"], folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
