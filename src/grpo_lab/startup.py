"""Garbage collection paused while a job starts, and resumed once its model is loaded.

Importing torch, transformers and TRL creates millions of long-lived objects, and Python's full (oldest
generation) collections rescan all of them: about 9 such passes, ~1 s, before the first training step of a
short run on 2 CPU cores (measured with gc.callbacks; benchmarks/overhead.py), paid again by every process
that starts a job. Each job pauses the collector as it starts; the run resumes it once everything is imported
and the model loaded, before any generation (whose garbage must not pile up), with one full pass (the imports'
reference cycles are freed, ~0.2 s) and then moves everything left into the permanent generation
(`gc.freeze`), so later full passes during training skip the import-time objects. A process that goes on
after its job without having trained (a multirun's next job after a failure, the parent of a multi-process
job that waits for its children) resumes it too (grpo_lab.cli).
It pays: benchmarks/overhead.py measures a short run at 0.85x of the bare TRL script with it, 1.08x without.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Called as a job starts: by each Hydra job (in `python -m grpo_lab`, or in a joblib or submitit worker)
    and by a multi-process job's child. Not by the process that only runs a sweep or waits for children."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Called once the job's model is loaded; a no-op unless `pause` disabled the collector (`train.run` in a
    test, a second job of a multirun)."""
    global _paused
    if _paused:
        gc.collect()  # one full pass frees the imports' reference cycles, instead of ~9 passes during them
        gc.freeze()
        gc.enable()
        _paused = False
