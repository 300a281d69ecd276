"""The kg backends' shared answer cache (hits, one query for identical ones in flight, LRU, failures and
cancellations not remembered) and the endpoint backend's error for an unreachable store."""

from __future__ import annotations

import asyncio

import pytest

from env_adapters.sandbox.servers import free_port
from env_adapters.tasks.kg.backends import (
    MAX_CACHED_QUERY_CHARS,
    BackendError,
    EndpointBackend,
    SparqlBackend,
    _entry_bytes,
)


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
    assert store.cached_bytes == sum(_entry_bytes(q, tuple(a)) for q, a in store._cache.items())
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


async def test_the_embedded_store_answers_off_the_event_loop():
    import threading

    from env_adapters.tasks.kg.backends import EmbeddedBackend

    backend = EmbeddedBackend(b"<http://rdf.freebase.com/ns/m.a> <http://rdf.freebase.com/ns/r> "
                              b"<http://rdf.freebase.com/ns/m.b> .\n")
    seen = []
    store = backend.store

    class Recording:  # the store, noting the thread each query runs on
        def query(self, query):
            seen.append(threading.get_ident())
            return store.query(query)

    backend.store = Recording()
    answer = await backend.select("SELECT ?o WHERE { ?s ?p ?o }")
    # A long query must not hold the loop that serves every other session and the heartbeats.
    assert answer == ["m.b"] and seen and threading.get_ident() not in seen
