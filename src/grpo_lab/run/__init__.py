"""One training job in one process: from a checked job spec to a finished, recorded run.

Owns: training (``train.py``: the job's set-up, where everything that can fail on bad input fails before W&B or a
model, then TRL's GRPOTrainer and the evaluations around it), the run folder and what goes in it (``folder.py``,
``provenance.py``, ``summary.py``), W&B (``tracking.py``), the trainer callbacks (``callbacks.py``), the live health
rules (``health.py``), resuming (``resume.py``), a trial's reports to its sweep's study (``trial.py``, through the
study's storage: ``study.py``) and the reward check before training (``reward_check.py``). May import:
``grpo_lab.config``, ``.data``, ``.models``, ``.rewards``, ``.evaluation``, ``.vllm_engine``, ``.sandbox`` and the
basic modules; never the sweeper, the launcher or the commands, which start this package's jobs.
"""
