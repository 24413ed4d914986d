"""Held-out evaluation and the statistics that compare runs: what a run scores, and which run is better.

Owns: greedy and sampled evaluation of a model on the eval split (``evaluate.py``), the graders that turn a
completion into pass/fail (``graders.py``), intervals and paired tests (``stats.py``), and ranking runs or trials by
their objectives (``ranking.py``: the sweep's table and best.yaml, the leaderboard, `compare --export`). May
import: ``grpo_lab.config``, ``grpo_lab.rewards`` (graders reuse the rewards' parsing and the code sandbox) and the
basic modules; torch and transformers inside the functions that generate.
"""
