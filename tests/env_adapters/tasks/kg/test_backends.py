"""The kg backends' shared answer cache (hits, one query for identical ones in flight, LRU, failures and
cancellations not remembered), the endpoint backend's error for an unreachable store, and the embedded store's
processes (a query stopped at its time bound, the others answered meanwhile)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from env_adapters.sandbox.servers import free_port
from env_adapters.tasks.kg.backends import (
    MAX_CACHED_QUERY_CHARS,
    BackendError,
    EmbeddedBackend,
    EndpointBackend,
    QueryTooCostly,
    SparqlBackend,
    entry_bytes,
)
from env_adapters.tasks.kg.sexpr import FB


class Store(SparqlBackend):
    """Answers ``[query.upper()]`` once ``gate`` is open, or fails for the queries in ``failing``."""

    def __init__(self, cache_size: int, cache_bytes: int | None = None, width: int = 1) -> None:
        super().__init__(cache_size, *(() if cache_bytes is None else (cache_bytes,)))
        self.width = width  # values per answer
        self.sent: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failing: set[str] = set()

    async def _select(self, query: str) -> list[str]:
        self.sent.append(query)
        await self.gate.wait()
        if query in self.failing:
            raise BackendError(f"{query} failed")
        return [query.upper()] * self.width


async def test_answers_are_remembered_least_recently_used_first_out():
    store = Store(cache_size=2)
    for query in ("a", "b", "a", "c", "a", "b"):
        assert await store.select(query) == [query.upper()]
    assert store.sent == ["a", "b", "c", "b"]  # c pushed out b, the least recently used
    assert (store.hits, store.misses) == (2, 4)
    answer = await store.select("a")
    answer.append("mine")  # each caller gets its own list
    assert await store.select("a") == ["A"]
    uncached = Store(cache_size=0)
    for query in ("a", "a"):
        assert await uncached.select(query) == ["A"]
    assert uncached.sent == ["a", "a"]


async def test_overlong_queries_are_answered_but_never_remembered():
    store = Store(cache_size=8)
    huge = "x" * (MAX_CACHED_QUERY_CHARS + 1)
    for _ in range(3):
        assert await store.select(huge) == [huge.upper()]
    assert len(store.sent) == 3 and len(store._cache) == 0
    await store.select("short")
    assert list(store._cache) == ["short"]


async def test_remembered_answers_stay_within_their_byte_bound_whatever_their_size():
    # Answers of 1,000 values (about 57 KB each as counted): a bound of 300 KB keeps the last five, whatever the count
    # allows; an answer larger than the bound is answered and not remembered.
    store = Store(cache_size=1000, cache_bytes=300_000, width=1000)
    for i in range(50):
        await store.select(f"q{i}")
        assert store.cached_bytes <= 300_000
    assert list(store._cache) == [f"q{i}" for i in range(45, 50)]
    assert store.cached_bytes == sum(entry_bytes(q, tuple(a)) for q, a in store._cache.items())
    store.width = 10_000
    assert len(await store.select("huge")) == 10_000 and "huge" not in store._cache
    assert list(store._cache)[-1] == "q49"


async def test_identical_queries_in_flight_are_sent_once():
    store = Store(cache_size=10)
    store.gate.clear()
    callers = [asyncio.ensure_future(store.select("q")) for _ in range(8)]
    await asyncio.sleep(0)
    callers[0].cancel()  # one rollout ends early: the others still get the answer
    store.gate.set()
    assert await asyncio.gather(*callers[1:]) == [["Q"]] * 7
    assert callers[0].cancelled() and store.sent == ["q"]
    assert await store.select("q") == ["Q"] and store.sent == ["q"]


async def test_failures_are_not_remembered():
    store = Store(cache_size=10)
    store.failing.add("q")
    store.gate.clear()
    callers = [asyncio.ensure_future(store.select("q")) for _ in range(2)]
    await asyncio.sleep(0)
    store.gate.set()
    for outcome in await asyncio.gather(*callers, return_exceptions=True):
        assert isinstance(outcome, BackendError)
    store.failing.clear()
    assert await store.select("q") == ["Q"] and store.sent == ["q", "q"]


async def test_unreachable_endpoint_is_a_backend_error():
    backend = EndpointBackend(f"http://127.0.0.1:{free_port()}/sparql", timeout=5)
    with pytest.raises(BackendError, match="unreachable"):
        await backend.select("SELECT ?x WHERE { ?x ?p ?o }")
    await backend.close()


EDGES = "".join(f"<{FB}m.a{i}> <{FB}r> <{FB}m.b> .\n" for i in range(200))
CROSS_PRODUCT = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i . ?j ?k ?l }"  # 200^4 rows to count
FIRST = "SELECT ?s WHERE { ?s ?p ?o } ORDER BY ?s LIMIT 2"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_a_query_past_its_time_bound_is_stopped_and_its_process_replaced():
    backend = EmbeddedBackend(EDGES, processes=2, query_timeout=1)
    before = backend.pids()
    assert len(backend) == 200 and await backend.select(FIRST) == ["m.a0", "m.a1"]
    with pytest.raises(QueryTooCostly, match="past its bound of 1 s"):
        await backend.select(CROSS_PRODUCT)
    after = backend.pids()
    # Oxigraph cannot interrupt a query: the process that ran it is gone and a fresh one serves in its place.
    assert len(after) == 2 and len(set(before) & set(after)) == 1
    assert not any(alive(pid) for pid in set(before) - set(after))
    assert await backend.select(FIRST) == ["m.a0", "m.a1"]
    await backend.close()


async def test_a_costly_query_leaves_the_other_processes_to_the_other_sessions():
    backend = EmbeddedBackend(EDGES, processes=2, query_timeout=600)
    costly = asyncio.ensure_future(backend.select(CROSS_PRODUCT))
    await asyncio.sleep(0.5)  # in its process
    # The bystander is answered by the other process while the costly query still runs.
    assert await backend.select(FIRST) == ["m.a0", "m.a1"] and not costly.done()
    pids = backend.pids()
    await backend.close()  # kills the processes, also the one still counting
    with pytest.raises(BackendError, match="died"):
        await costly
    assert backend.pids() == [] and not any(alive(pid) for pid in pids)


async def test_with_every_process_busy_a_bystander_waits_only_until_the_costly_query_is_stopped():
    backend = EmbeddedBackend(EDGES, processes=1, query_timeout=1)
    ended: list[str] = []

    async def ask(name: str, query: str) -> list[str] | BaseException:
        try:
            return await backend.select(query)
        except QueryTooCostly as e:
            return e
        finally:
            ended.append(name)

    costly = asyncio.ensure_future(ask("costly", CROSS_PRODUCT))
    await asyncio.sleep(0.5)  # in the only process
    bystander = await ask("bystander", FIRST)
    assert isinstance(await costly, QueryTooCostly) and bystander == ["m.a0", "m.a1"]
    assert ended == ["costly", "bystander"]  # served by the process that replaced the stopped one
    await backend.close()


async def test_a_query_the_store_refuses_is_a_backend_error_and_the_process_stays():
    backend = EmbeddedBackend(EDGES, processes=1)
    pids = backend.pids()
    with pytest.raises(BackendError, match="embedded SPARQL store failed"):
        await backend.select("SELEC nonsense")
    assert backend.pids() == pids and await backend.select(FIRST) == ["m.a0", "m.a1"]
    await backend.close()


async def test_the_store_process_finds_pyoxigraph_where_its_parent_does(tmp_path, monkeypatch):
    # Installed on PYTHONPATH only (a --target install, as on a machine without pip access): a stand-in module there
    # marks that the child imported it from that path, then hands over the real one.
    marker = tmp_path / "imported"
    shim = tmp_path / "path"
    shim.mkdir()
    (shim / "pyoxigraph.py").write_text(
        "import importlib, os, sys\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "sys.path.remove(os.path.dirname(__file__))\n"
        "del sys.modules[__name__]\n"
        "globals().update(vars(importlib.import_module('pyoxigraph')))\n")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    backend = EmbeddedBackend(EDGES, processes=1)
    try:
        assert await backend.select(FIRST) == ["m.a0", "m.a1"]
    finally:
        await backend.close()
    assert marker.exists()


async def test_an_endpoint_that_accepts_and_never_answers_is_unhealthy():
    # A frozen store (a stopped process: the kernel still accepts the connection) fails the health check at its bound.
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    backend = EndpointBackend(f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}/sparql")
    try:
        assert not await backend.alive()
    finally:
        await backend.close()
        silent.close()
