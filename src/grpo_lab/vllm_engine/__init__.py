"""vLLM as TRL's generation engine: a server grpo_lab starts, checks and stops for a job, and the weight sync that
vLLM's CPU build needs (TRL's own sync does not reach its packed weights).

Owns: the job's vLLM server (``server.py``: start, wait, watch, stop; the command line of ``python -m
grpo_lab.vllm_server``) and reloading the trainer's weights into vLLM (``sync.py``). May import: ``grpo_lab.config``,
``grpo_lab.models``, ``grpo_lab.errors``, ``grpo_lab.interrupts``; vLLM and TRL inside the functions that need them.
Generation itself is TRL's and vLLM's: grpo_lab never re-implements it.
"""

from grpo_lab.errors import GrpoLabError

# The vLLM worker extension's import path, for `vllm serve --worker-extension-cls` (a server grpo_lab starts on CPU).
SERVER_EXTENSION = "grpo_lab.vllm_engine.sync.ServerWeights"


class VllmServerError(GrpoLabError):
    """The vLLM server could not be started, reached, or kept."""
