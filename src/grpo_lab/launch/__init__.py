"""One job on several processes or machines: the parent starts `accelerate launch` children and waits for them.

Owns: the children's command line and their lives (``processes.py``: start, forward Ctrl-C, kill what is left,
read the result), where each machine stands in a multi-machine job (``machines.py``), the children's entry point
(``child.py``: reads the parent's job spec, never composes again) and the accelerate config files (``accelerate/``).
May import: ``grpo_lab.run`` (each child trains with it), ``grpo_lab.config``, ``grpo_lab.models`` and the basic
modules.
"""
