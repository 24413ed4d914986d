"""Compare runs and pick the best: leaderboard, plots, health flags, and export of the winner as a preset.

Run it as `python -m grpo_lab.compare SOURCE` (see `__main__`).
"""
