"""`PoolClient` (pipeline/runtime/pools.py) without Ray: pool actors called in-process through stand-in
object refs. Contiguous chunks, one per actor, results in input order, the first actor rotating between
calls, and one client called from several threads at once (engine actors take several batches at once)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from jobs.bench.rig.simulated import SimRetriever, SimScorer
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.runtime.pools import PoolActor, PoolClient


class Ref:
    """An ObjectRef stand-in: `value`, ready `delay` s after the call (a timer thread)."""

    def __init__(self, value, delay: float):
        self.value, self.ready = value, threading.Event()
        if delay:
            threading.Timer(delay, self.ready.set).start()
        else:
            self.ready.set()


def fake_get(ref: Ref | list[Ref], timeout: float | None = None):
    import ray

    if isinstance(ref, list):
        return [fake_get(r, timeout) for r in ref]
    if timeout is not None and timeout < 10 and not ref.ready.wait(timeout):
        raise ray.exceptions.GetTimeoutError("Get timed out")
    assert ref.ready.wait(10), "a result never came"
    return ref.value


def fake_wait(refs: list[Ref], num_returns: int = 1, timeout: float | None = None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [r for r in refs if r.ready.is_set()][:num_returns]
        if len(ready) == num_returns or (deadline is not None and time.monotonic() >= deadline):
            return ready, [r for r in refs if r not in ready]
        time.sleep(0.001)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", fake_get)
    monkeypatch.setattr(ray, "wait", fake_wait)


class InlineActor:
    """A pool actor called in-process: `run.remote(...)` serves at once and returns a Ref ready after
    `delay(items)` s; `calls` records (op, items) of each call."""

    def __init__(self, delay=lambda items: 0.0):
        self.actor, self.calls, self.delay = PoolActor.__new__(PoolActor), [], delay
        self.actor.served, self.actor.control = {}, None
        self.actor.backends = Backends(
            DynragConfig(), retriever=SimRetriever(), scorer=SimScorer(), embedder=SimScorer()
        )
        self.run = SimpleNamespace(remote=self._remote)

    def _remote(self, call, op, items, *args):
        self.calls.append((op, len(items)))
        return Ref(self.actor.run(call, op, items, *args), self.delay(items))


def test_engine_actor_sends_retrieval_and_scoring_to_its_pools():
    from pipeline.runtime.ray_runner import EngineActor

    retrieval, scorer = [InlineActor(), InlineActor()], [InlineActor()]
    cfg = DynragConfig()
    cfg.method.name = "pairs"
    cfg.generation.backend = "none"
    run = {"out": "memory://rows", "method": "pairs", "row_args": {"run_id": "r"}, "header": None, "params": None}
    engine = EngineActor(cfg.model_dump(mode="json"), None, [run], {"retrieval": retrieval, "scorer": scorer})
    b = engine.replica.backends  # no index (None) and no models: every part but the generator comes from a pool
    queries = [f"query {i}" for i in range(5)]
    assert b.search(queries, 3, "bm25") == SimRetriever().search(queries, 3)
    assert [a.calls for a in retrieval] == [[("search", 3)], [("search", 2)]]  # contiguous chunks, in order
    assert b.score([("q", "d1"), ("q", "d2")], "default") == SimScorer().score([("q", "d1"), ("q", "d2")])
    assert np.array_equal(b.embed(queries, None), SimScorer().embed(queries))
    assert scorer[0].calls == [("score", 2), ("embed", 5)]
    assert scorer[0].actor.stats() == {"score": [1, 2], "embed": [1, 5]}
    assert [a.actor.stats() for a in retrieval] == [{"search": [1, 3]}, {"search": [1, 2]}]
    for q in ("one", "two", "three"):  # single queries: each call starts at the next actor
        b.search([q], 3, "bm25")
    assert [a.calls[1:] for a in retrieval] == [[("search", 1), ("search", 1)], [("search", 1)]]


def test_one_client_called_from_several_threads_gives_each_its_results_in_order():
    """The first chunk of each call is the slowest, so chunks finish out of order; four threads share the
    client (one shared ActorPool, which is not thread-safe, would mix up their tasks)."""
    actors = [InlineActor(delay=lambda items: 0.002 * len(items)) for _ in range(3)]
    client = PoolClient(actors)
    expect = SimRetriever()
    wrong: list = []

    def caller(t: int) -> None:
        for i in range(15):
            queries = [f"thread {t} call {i} query {j}" for j in range(1 + (t + i) % 7)]
            if client.search(queries, 2, "bm25") != expect.search(queries, 2):
                wrong.append((t, i))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads) and not wrong
    assert sum(len(a.calls) for a in actors) >= 60  # every call reached the pool


def test_a_pool_call_that_never_returns_ends_with_one_line_at_its_limit():
    """A pool actor that never answers (a hung JVM or FAISS call): the engine's call to the pool waits at most
    its limit (2 x ray.stall_s; the driver's watchdog names the actor at ray.stall_s first), then ends with one
    line naming the call and the limit."""
    from pipeline.runtime.waits import WaitExpired

    def never(*args):
        ref = Ref.__new__(Ref)
        ref.value, ref.ready = None, threading.Event()  # never set
        return ref

    client = PoolClient([InlineActor(), SimpleNamespace(run=SimpleNamespace(remote=never))], call_s=0.5)
    with pytest.raises(WaitExpired) as ended:
        client.search(["q1", "q2", "q3"], 2, "bm25")
    line = str(ended.value)
    assert "waited 0.5 s for a search call of 3 items to 2 pool actors with no answer (2 x ray.stall_s = 0.5)" in line
    assert "\n" not in line
