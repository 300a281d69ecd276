"""Tool-call and episode-start latency of the ``kg`` task on the embedded store and on Virtuoso.

The scripted expert plays generated questions one after another in process (the worker's own code path, without
HTTP), each ``--group`` times in a row as a group of rollouts would; each step is timed by the tool it calls
(``final_answer``: the executed answer), and each session start (``start_session`` + ``reset``). Also timed: the
steps that ask the store (``get_relations``, ``get_attributes``, the answer; from the task's answer cache or not),
every query the store actually ran (round trip), and, for Virtuoso, the server's CPU time per query (from
``/proc``: independent of the machine's load, unlike the latencies). Virtuoso is measured when its Debian package is
installed. Usage::

    python -m bench.kg [--items 300] [--group 1] [--query-cache 10000] [--backends embedded virtuoso]

Results and how to read them: ``docs/environments/kg.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from env_adapters.tasks.kg.expert import kg_expert
from env_adapters.tasks.kg.task import KGTask

TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def counted(method: Callable[[str], Awaitable[list[str]]], times: list[float] | None = None) -> Any:
    """``method`` wrapped to count its calls (in ``wrapper.calls``) and time each into ``times``."""
    async def wrapper(query: str) -> list[str]:
        wrapper.calls += 1
        began = time.perf_counter()
        try:
            return await method(query)
        finally:
            if times is not None:
                times.append((time.perf_counter() - began) * 1e3)
    wrapper.calls = 0
    return wrapper


async def measure(backend: str, items: int, group: int, query_cache: int) -> dict[str, Any]:
    """Milliseconds per step by tool, per step that asked the store, per round trip and per session start."""
    task = KGTask(backend=backend, size=items, query_cache=query_cache)
    await task.setup()
    store, trips = task.backend, []
    store.select, store._select = counted(store.select), counted(store._select, trips)
    steps, asking, starts = defaultdict(list), [], []
    server_cpu = cpu_seconds(task.server.pid) if task.server else None
    try:
        for index in task.indices():
            for _ in range(group):
                began = time.perf_counter()
                session = await task.start_session(index)
                result = await session.reset()
                starts.append((time.perf_counter() - began) * 1e3)
                messages = list(result.messages)
                while not result.status.finished:
                    message = kg_expert(task, index, messages)
                    tool = message["tool_calls"][0]["function"]["name"] if "tool_calls" in message else "final_answer"
                    asked, began = store.select.calls, time.perf_counter()
                    result = await session.step(message)
                    took = (time.perf_counter() - began) * 1e3
                    steps[tool].append(took)
                    if store.select.calls > asked:
                        asking.append(took)
                    messages += [message, *result.messages]
                assert result.reward == 1.0, (backend, index)
                await session.close()
        if server_cpu is not None:
            server_cpu = (cpu_seconds(task.server.pid) - server_cpu) * 1e3 / len(trips)
    finally:
        await task.teardown()
    return {"steps": steps, "asking": asking, "trips": trips, "starts": starts, "server_cpu_ms": server_cpu,
            "hit_rate": store.hits / max(1, store.hits + store.misses)}


def line(name: str, values: list[float]) -> str:
    return f"  {name:15s} n={len(values):5d} p50 {statistics.median(values):7.2f} ms  " \
           f"p99 {percentile(values, 0.99):7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--group", type=int, default=1, help="episodes per question in a row (rollout.n)")
    parser.add_argument("--query-cache", type=int, default=10000, help="the task's query_cache option (0: off)")
    parser.add_argument("--backends", nargs="+", default=["embedded", "virtuoso"])
    args = parser.parse_args()
    summary, asking_p50 = [], {}
    print(f"load average {os.getloadavg()[0]:.2f} at start, nice {os.nice(0)}")
    for backend in args.backends:
        if backend == "virtuoso" and shutil.which("virtuoso-t") is None:
            print("virtuoso: not installed (apt-get install -y virtuoso-opensource); skipped")
            continue
        r = asyncio.run(measure(backend, args.items, args.group, args.query_cache))
        tools = [t for tool, values in r["steps"].items() if tool != "final_answer" for t in values]
        print(f"{backend}: {len(tools)} tool calls over {args.items} x {args.group} episodes, "
              f"load average {os.getloadavg()[0]:.2f} at the end")
        for tool, values in sorted(r["steps"].items()):
            print(line(tool, values))
        print(line("session start", r["starts"]))
        print(line("asks the store", r["asking"]) + f"  (answer cache hit rate {r['hit_rate']:.0%})")
        print(line("round trip", r["trips"]) + ("" if r["server_cpu_ms"] is None else
                                                 f"  (server CPU {r['server_cpu_ms']:.2f} ms per query)"))
        asking_p50[backend] = statistics.median(r["asking"])
        summary += [f"{backend}_tool_p50_ms={statistics.median(tools):.2f}",
                    f"{backend}_tool_p99_ms={percentile(tools, 0.99):.2f}",
                    f"{backend}_store_tool_p50_ms={asking_p50[backend]:.2f}",
                    f"{backend}_store_tool_p99_ms={percentile(r['asking'], 0.99):.2f}",
                    f"{backend}_start_p50_ms={statistics.median(r['starts']):.3f}",
                    f"{backend}_cache_hit_rate={r['hit_rate']:.2f}"]
        if r["server_cpu_ms"] is not None:
            summary.append(f"{backend}_server_cpu_ms_per_query={r['server_cpu_ms']:.2f}")
    if len(asking_p50) == 2:
        summary.append(f"virtuoso_vs_embedded_store_tool_p50={asking_p50['virtuoso'] / asking_p50['embedded']:.1f}")
    summary.append(f"load_avg_1m={os.getloadavg()[0]:.2f}")
    print(" ".join(summary))


if __name__ == "__main__":
    main()
