"""Prints, as one JSON line, what the vLLM tests of the backends check about vLLM and verl in the vLLM environment.

Run by the tests with the vLLM environment's interpreter (argument: a model directory); it imports vLLM, so it
runs in its own process.
"""

import json
import sys


def main(model_dir: str) -> None:
    import importlib.metadata as metadata

    facts = {}
    try:
        metadata.distribution("vllm")
        facts["vllm_dist_before_alias"] = True
    except metadata.PackageNotFoundError:
        facts["vllm_dist_before_alias"] = False

    import inspect

    import verl  # noqa: F401  (runs the plugins: the distribution alias)
    import verl.third_party.vllm as verl_vllm
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    from agentrl_verl.backends import vllm_cpu, vllm_server

    # The pause API: what vLLM's AsyncLLM takes, what verl passes, and whether the plugin's hook adapted it.
    pause = inspect.unwrap(AsyncLLM.pause_generation)
    facts["vllm_pause_parameters"] = sorted(inspect.signature(pause).parameters)
    facts["verl_passes_wait_for_inflight"] = "wait_for_inflight_requests=" in inspect.getsource(
        vLLMHttpServer.abort_all_requests)
    facts["pause_adapted"] = bool(getattr(AsyncLLM.pause_generation, "__agentrl_compat__", False))
    # The pause without abort the plugin gives verl's vLLM server, and the private members of verl's vLLM modules
    # it relies on (the admission gate that abort_all_requests closes too).
    facts["server_pause_added"] = vLLMHttpServer.pause_generation is vllm_server._pause_generation
    abort = inspect.getsource(vLLMHttpServer.abort_all_requests)
    from agentrl_verl.core import verl_seam

    entries = [entry for entry in verl_seam.PRIVATE if verl_seam.needs_vllm(entry)]
    facts["seam_vllm_entries"] = len(entries)
    facts["seam_vllm_errors"] = []
    for entry in entries:
        try:
            verl_seam.check(entry)
        except verl_seam.VerlChanged as error:
            facts["seam_vllm_errors"].append(str(error))
        if entry.path.rpartition(".")[2] not in abort:
            facts["seam_vllm_errors"].append(f"{entry.path} is no longer part of abort_all_requests's gate")

    facts["vllm_version"] = metadata.version("vllm")
    facts["verl_looks_up"] = verl_vllm.package_name
    facts["verl_vllm_version"] = verl_vllm.vllm_version
    facts["platform_is_cpu"] = current_platform.is_cpu()
    facts["sleep_mode_available"] = current_platform.is_sleep_mode_available()
    facts["device_total_memory"] = current_platform.get_device_total_memory()

    # Weight sync: does vLLM's CPU GEMM dispatch drop a Linear's weight Parameter, with and without the fix?
    import torch
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    facts["onednn_built"] = ops._supports_onednn

    def dispatch() -> dict:
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        x = torch.randn(3, 32)
        return {"weight_numel": layer.weight.numel(),
                "output_ok": bool(torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.t()))
                if layer.weight.numel() else None}

    facts["dispatch_default"] = dispatch()
    facts["fix_applies"] = vllm_cpu.keep_plain_linear_weights()
    facts["dispatch_fixed"] = dispatch()

    # Eager mode: what vLLM's CPU platform makes of the compilation config with and without enforce_eager.
    from vllm.engine.arg_utils import EngineArgs

    for eager in (False, True):
        config = EngineArgs(model=model_dir, enforce_eager=eager, dtype="float32").create_engine_config()
        facts[f"compilation_mode_eager_{eager}"] = config.compilation_config.mode.name

    # Memory: an explicit KV-cache size reaches vLLM's cache config, and its CPU worker honours it instead of the
    # gpu_memory_utilization share of host memory.
    import vllm.v1.worker.cpu_worker as cpu_worker

    config = EngineArgs(model=model_dir, enforce_eager=True, dtype="float32",
                        kv_cache_memory_bytes=1 << 28).create_engine_config()
    facts["kv_cache_memory_bytes"] = config.cache_config.kv_cache_memory_bytes
    facts["cpu_worker_reads_kv_bytes"] = "kv_cache_memory_bytes" in inspect.getsource(
        cpu_worker.CPUWorker.determine_available_memory)
    print(json.dumps(facts))


if __name__ == "__main__":
    main(sys.argv[1])
