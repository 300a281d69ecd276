"""Environment throughput with the workers spread over 1, 2 and 3 nodes of a Ray cluster (``agentrl-env up --ray``).

One local cluster of three raylets (Ray's ``cluster_utils.Cluster``), each offering its own custom resource; for
each node count a stack (:class:`~env_adapters.ray_stack.RayEnvStack`) places ``--workers-per-node`` workers of
``--task`` on each of the first N nodes: ``calc`` (a step costs the worker next to nothing: the controller bounds
the stack) or ``webshop`` (every step a BM25 search of the ``standard`` catalogue's 10,000 products: the workers
bound it). ``--clients`` client processes keep ``--concurrency`` sessions each going: start a session, ``--rounds``
interacts, cancel, start the next. Printed per node count: sessions started per
second and interacts per second over ``--duration`` seconds, and both as ratios against one node in the same run.

The raylets share this machine's cores, so the ratios are bounded by the cores the workers, the controller and the
clients share: on 2 cores they cannot scale; run it on a machine with many cores (``bench/device_env_scale.sh`` on
the GPU machine's 16) for the scaling figure. Usage::

    python -m bench.env_scale [--task calc|webshop] [--duration 10] [--clients 2] [--concurrency 32] [--rounds 4]
        [--workers-per-node 1]

Results and how to read them: ``docs/environments/ray.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import time

from env_adapters.client import EnvClient

WORDS = ("blue", "cotton", "shirt", "wireless", "lamp", "organic", "tea", "leather", "boots", "gift", "set", "men")


def step(task: str, n: int) -> dict:
    """The ``n``-th assistant message of a session of ``task``: a calculation, or a search with ``n``-dependent
    keywords (no two alike in a row, so no answer is reused)."""
    if task == "calc":
        name, arguments = "calculate", {"expression": "1+1"}
    else:
        name, arguments = "search_action", {"keywords": " ".join(WORDS[(n * k) % len(WORDS)] for k in (1, 3, 7))}
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


TASK_OPTIONS = {"calc": {}, "webshop": {"preset": "standard", "seed": 0}}
NODES = 3
TOKEN = "env-scale-bench"


async def drive(url: str, task: str, concurrency: int, rounds: int, duration: float) -> tuple[int, int]:
    """Sessions started and interacts done by ``concurrency`` session loops over ``duration`` seconds."""
    started = interacts = 0
    async with EnvClient(url, token=TOKEN) as env:
        stop_at = time.perf_counter() + duration

        async def loop(seed: int) -> None:
            nonlocal started, interacts
            index = seed
            while time.perf_counter() < stop_at:
                session = await env.start_sample(task, index % 1000)
                started += 1
                index += concurrency
                for n in range(rounds):
                    reply = await env.interact(session.session_id, step(task, index + n))
                    interacts += 1
                    if reply.finish:
                        break
                else:
                    await env.cancel(session.session_id)

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return started, interacts


def _client(args: tuple[str, str, int, int, float]) -> tuple[int, int]:
    return asyncio.run(drive(*args))


def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Sessions/s and interacts/s of ``args.clients`` client processes against the stack at ``url``."""
    with multiprocessing.get_context("spawn").Pool(args.clients) as pool:
        t0 = time.perf_counter()
        counts = pool.map(_client, [(url, args.task, args.concurrency, args.rounds, args.duration)] * args.clients)
        elapsed = time.perf_counter() - t0
    return {"sessions_per_s": sum(c[0] for c in counts) / elapsed,
            "interacts_per_s": sum(c[1] for c in counts) / elapsed}


def stack_config(task: str, nodes: int, workers_per_node: int) -> dict:
    return {"controller": {"port": 0, "token": TOKEN},
            "workers": [{"task": task, "name": task, "replicas": workers_per_node, "concurrency": 256,
                         "options": TASK_OPTIONS[task], "ray": {"resources": {f"bench_node_{i}": 1}}}
                        for i in range(nodes)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASK_OPTIONS), default="calc", help="the family the workers serve")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--concurrency", type=int, default=32, help="sessions kept going per client process")
    parser.add_argument("--rounds", type=int, default=4, help="interacts per session")
    parser.add_argument("--workers-per-node", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import ray
    from ray.cluster_utils import Cluster

    from env_adapters.ray_stack import RayEnvStack

    slots = {f"bench_node_{i}": args.workers_per_node for i in range(NODES)}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "resources": {"bench_node_0": slots["bench_node_0"]}})
    for i in range(1, NODES):
        cluster.add_node(num_cpus=1, resources={f"bench_node_{i}": slots[f"bench_node_{i}"]})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    results: dict[int, dict[str, float]] = {}
    try:
        for nodes in range(1, NODES + 1):
            print(f"[env_scale] {nodes} node(s): starting the stack", flush=True)
            with RayEnvStack(stack_config(args.task, nodes, args.workers_per_node), startup_timeout=300) as stack:
                results[nodes] = measure(stack.url, args)
            print(f"[env_scale] {nodes} node(s): {results[nodes]['sessions_per_s']:.0f} sessions/s, "
                  f"{results[nodes]['interacts_per_s']:.0f} interacts/s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    base = results[1]
    for nodes, r in results.items():
        print(f"task={args.task} nodes={nodes} workers={nodes * args.workers_per_node} "
              f"sessions_per_s={r['sessions_per_s']:.1f} "
              f"interacts_per_s={r['interacts_per_s']:.1f} "
              f"sessions_ratio={r['sessions_per_s'] / base['sessions_per_s']:.2f} "
              f"interacts_ratio={r['interacts_per_s'] / base['interacts_per_s']:.2f}")


if __name__ == "__main__":
    main()
