"""WebShop benchmark: search latency, index build time and memory on a 100k-product generated catalogue, and
episode step latency.

- build: the task constructed with a generated catalogue of ``--products`` products (generation, loading as
  upstream's files are, and the BM25 index), its wall time and the process's resident memory before and after;
  the index alone is then rebuilt and timed, and its arrays' size reported;
- search: ``--queries`` queries (goal instructions without their price clause, and product titles, alternating)
  against the shared index, each timed alone: p50/p99 in milliseconds (goal: p50 under 10 ms);
- steps: the scripted expert plays ``--episodes`` goals in-process; every ``Session.step`` is timed (the expert's
  own time excluded): p50/p99 over all steps and over search steps.

Usage::

    python -m bench.webshop [--products 100000] [--queries 1000] [--episodes 200]

Results and how to read them: ``docs/environments/webshop.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import resource
import time

from env_adapters.protocol import SampleStatus
from env_adapters.tasks.webshop import WebShopTask
from env_adapters.tasks.webshop.expert import expert
from env_adapters.tasks.webshop.search import SearchEngine


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def play(task: WebShopTask, index: int, steps: list[float], search_steps: list[float]) -> bool:
    session = await task.start_session(index)
    result = session.reset()
    messages = list(result.messages)
    while result.status is SampleStatus.RUNNING:
        action = expert(task, index, messages)
        start = time.perf_counter()
        result = session.step(action)
        elapsed = time.perf_counter() - start
        steps.append(elapsed)
        if action["tool_calls"][0]["function"]["name"] == "search_action":
            search_steps.append(elapsed)
        messages += [action, *result.messages]
    return result.reward >= 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=100_000)
    parser.add_argument("--goals", type=int, default=1500)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    before = rss_mb()
    start = time.perf_counter()
    task = WebShopTask(generator={"products": args.products, "goals": args.goals, "held_out": args.goals // 3},
                       seed=args.seed)
    build_s = time.perf_counter() - start
    after = rss_mb()
    products = task.shop.catalogue.products
    start = time.perf_counter()
    SearchEngine(products)
    index_s = time.perf_counter() - start
    engine = task.shop.engine
    index_mb = sum(getattr(engine, k).nbytes for k in ("post_docs", "post_freqs", "offsets", "idf", "norm_inverse",
                                                        "id_rank")) / 2**20
    print(f"build: {len(products)} products, {len(task.shop.catalogue.goals)} goals in {build_s:.1f} s "
          f"(index alone {index_s:.1f} s, {index_mb:.0f} MiB of arrays); RSS {before:.0f} -> {after:.0f} MiB "
          f"(peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")

    rng = random.Random(args.seed)
    goals = task.shop.catalogue.goals
    queries = [re.sub(r", and price lower than [\d.]+ dollars$", "", rng.choice(goals).instruction_text) if i % 2
               else rng.choice(products).name for i in range(args.queries)]
    latencies = []
    for query in queries:
        start = time.perf_counter()
        task.shop.engine.search(query, 50)
        latencies.append(time.perf_counter() - start)
    search_p50, search_p99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
    print(f"search: {len(queries)} queries, p50 {search_p50:.2f} ms, p99 {search_p99:.2f} ms")

    steps: list[float] = []
    search_steps: list[float] = []
    indices = rng.sample(task.indices(), min(args.episodes, len(task.indices())))
    solved = sum(asyncio.run(_play_all(task, indices, steps, search_steps)))
    step_p50, step_p99 = percentile(steps, 0.5) * 1e3, percentile(steps, 0.99) * 1e3
    print(f"steps: {len(indices)} expert episodes ({solved} with reward 1), {len(steps)} steps, p50 {step_p50:.2f} ms, "
          f"p99 {step_p99:.2f} ms; search steps p50 {percentile(search_steps, 0.5) * 1e3:.2f} ms")
    print(f"products={len(products)} build_s={build_s:.1f} index_build_s={index_s:.1f} index_mb={index_mb:.0f} "
          f"rss_mb={after - before:.0f} search_p50_ms={search_p50:.2f} search_p99_ms={search_p99:.2f} "
          f"step_p50_ms={step_p50:.2f} step_p99_ms={step_p99:.2f} expert_solved={solved}/{len(indices)}")


async def _play_all(task: WebShopTask, indices: list[int], steps: list[float], search_steps: list[float]) -> list:
    return [await play(task, i, steps, search_steps) for i in indices]


if __name__ == "__main__":
    main()
