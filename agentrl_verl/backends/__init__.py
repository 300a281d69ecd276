"""What every training host needs beside the core: rollout backends and engine fixes, GPU and CPU alike.

The ``hf`` rollout backend (:mod:`.hf_rollout`), verl's ``cpu`` platform (:mod:`.platform_cpu`), object-store
weight sync of standalone replicas (:mod:`.object_store_engine`), the pause fixes of verl's vLLM server that the
``agentrl_async`` trainer needs on every vLLM host (:mod:`.vllm_server`) and vLLM on a CPU-only host
(:mod:`.vllm_cpu`). The plugin registers each of them (:mod:`agentrl_verl.plugin`).
"""
