"""A sweep's parts besides the Hydra sweeper itself (hydra_plugins.grpo_lab_sweeper): its study and its decisions.

Owns: the study's storage as the sweeper drives it (``storage.py``: claiming trials under a lock, heartbeats, stale
trials; opening a URL is grpo_lab.run.study's, which a trial's job uses too) and its gRPC proxy (``proxy.py``, a
command), the search space from `hydra.sweeper.params` and `-m` overrides (``space.py``), the confirmation runs
(``confirm.py``), which trial models stay on disk (``retention.py``), the trials table and best.yaml
(``report.py``) and what the sweeper holds while it runs (``plan.py``). May import: ``grpo_lab.run`` (its trials'
run folders, the study's storage), ``grpo_lab.evaluation`` (ranking), ``grpo_lab.config`` and the basic modules;
Optuna inside the functions that need it.
"""
