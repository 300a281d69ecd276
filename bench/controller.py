"""Controller benchmark: interact latency through the controller vs. directly to the worker, throughput at
several concurrency levels, and how many concurrent sessions the stack holds.

Runs a controller and one ``calc`` worker as subprocesses on loopback (as ``agentrl-env up`` would) and drives
them from this process with :class:`~env_adapters.client.EnvClient`; the direct path uses the same HTTP stack
(aiohttp + orjson, keep-alive) against the worker's own ``/api/interact``. Usage::

    python -m bench.controller [--duration 3] [--sessions 5000] [--latency-samples 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

import aiohttp
import orjson

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack

STEP = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "37+48"}'}}]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to report cost per interact independent of load."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(env: EnvClient, worker_api: str, samples: int) -> dict[str, float]:
    """Alternate one interact through the controller and one directly to the worker, on one session."""
    session = await env.start_sample("calc", 0)
    body = orjson.dumps({"session_id": session.session_id, "messages": [STEP]})
    via, direct = [], []
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as http:
        for i in range(samples + 50):
            t0 = time.perf_counter()
            await env.interact(session.session_id, STEP)
            t1 = time.perf_counter()
            async with http.post(f"{worker_api}/interact", data=body) as resp:
                assert resp.status == 200, await resp.text()
                orjson.loads(await resp.read())
            t2 = time.perf_counter()
            if i >= 50:  # warm-up
                via.append((t1 - t0) * 1e3)
                direct.append((t2 - t1) * 1e3)
    await env.cancel(session.session_id)
    return {"controller_p50_ms": percentile(via, 0.5), "controller_p99_ms": percentile(via, 0.99),
            "direct_p50_ms": percentile(direct, 0.5), "direct_p99_ms": percentile(direct, 0.99),
            "overhead_p50_ms": percentile(via, 0.5) - percentile(direct, 0.5),
            "overhead_p99_ms": percentile(via, 0.99) - percentile(direct, 0.99)}


async def throughput(env: EnvClient, concurrency: int, duration: float) -> float:
    """Interacts per second with ``concurrency`` sessions each interacting back to back."""
    sessions = await asyncio.gather(*(env.start_sample("calc", i % 1000) for i in range(concurrency)))
    count = 0
    stop_at = time.perf_counter() + duration

    async def loop(sid: int) -> None:
        nonlocal count
        while time.perf_counter() < stop_at:
            await env.interact(sid, STEP)
            count += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(s.session_id) for s in sessions))
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*(env.cancel(s.session_id) for s in sessions))
    return count / elapsed


async def hold(env: EnvClient, n: int) -> tuple[int, int]:
    """Open ``n`` sessions at once, interact once on each, cancel them; return (held, errors)."""
    gate = asyncio.Semaphore(512)

    async def one(i: int) -> int | None:
        async with gate:
            try:
                return (await env.start_sample("calc", i % 1000)).session_id
            except Exception as e:  # counted, not fatal: this measures how many hold
                logging.warning("start %d failed: %r", i, e)
                return None

    ids = [sid for sid in await asyncio.gather(*(one(i) for i in range(n))) if sid is not None]
    running = sum(s["status"] == "running" for s in (await env.list_sessions()).values())

    async def touch(sid: int) -> bool:
        async with gate:
            return (await env.interact(sid, STEP)).status == "running"

    ok = sum(await asyncio.gather(*(touch(sid) for sid in ids)))
    await env.cancel_all("calc")
    return min(running, ok), n - ok


async def main(args: argparse.Namespace, url: str, worker_api: str, pids: dict[str, int]) -> dict[str, float]:
    results: dict[str, float] = {}
    async with EnvClient(url, max_connections=1024) as env:
        results.update(await latency(env, worker_api, args.latency_samples))
        for c in (1, 64, 512):
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            results[f"interacts_per_s_c{c}"] = rate = await throughput(env, c, args.duration)
            if c == 512:  # CPU cost per interact at load: what bounds throughput on an idle machine
                for name, pid in pids.items():
                    used = cpu_seconds(pid) - before[name]
                    results[f"{name}_cpu_us_per_interact"] = used / (rate * args.duration) * 1e6
        results["interacts_per_s"] = max(results[f"interacts_per_s_c{c}"] for c in (64, 512))
        results["sessions_held"], results["session_errors"] = await hold(env, args.sessions)
    return results


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per throughput level")
    parser.add_argument("--sessions", type=int, default=5000, help="concurrent sessions to hold")
    parser.add_argument("--latency-samples", type=int, default=2000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = {"controller": {"port": 0},
              "workers": [{"task": "calc", "concurrency": args.sessions + 100, "options": {"max_rounds": 10**9}}]}
    t0 = time.perf_counter()
    with EnvStack(config) as stack:
        worker_api = next(iter(stack._get("list_workers")["calc"].values()))["address"]
        pids = {"controller": stack.controller.pid, "worker": stack.workers[0][1].pid, "client": os.getpid()}
        results = asyncio.run(main(args, stack.url, worker_api, pids))
    for key, value in results.items():
        print(f"{key:>22}: {value:.3f}" if isinstance(value, float) else f"{key:>22}: {value}")
    print(f"(wall {time.perf_counter() - t0:.1f}s)")
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    run()
