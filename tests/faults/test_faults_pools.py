"""Ray's own fault tolerance for the retrieval and scorer pools (pipeline/runtime/pools.py): a pool actor
that dies (its node lost, here its process killed) is restarted by Ray, and the calls it held are sent
again, so the engine actors' searches come back as if nothing happened."""

from __future__ import annotations

import pytest

from pipeline.config import DynragConfig
from platform_shims.raytools import shutdown_ray

pytestmark = [pytest.mark.faults, pytest.mark.own_process]  # starts Ray in-process (scripts/run_tests.py)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 logical CPUs) for the file's pools: a start and a shutdown per test cost ~5 s each.
    Each test kills the actors it started, so that the next one has the CPUs."""
    from platform_shims.raytools import init_ray

    init_ray(None, 2)
    yield
    shutdown_ray()


def test_a_lost_pool_actor_is_restarted_and_its_calls_are_retried(local_ray):
    from jobs.bench.rig.simulated import SimBackends
    from pipeline.runtime.pools import PoolClient, start_pool

    cfg = DynragConfig()
    cfg.ray.num_cpus, cfg.ray.retrieval_actors, cfg.ray.retrieval_actor_num_cpus = 2, 2, 0.5
    actors = start_pool(cfg, "retrieval", None, SimBackends())
    try:
        client = PoolClient(actors)
        queries = [f"question {i}" for i in range(40)]
        want = [[h.id for h in hits] for hits in client.search(queries, 3, "bm25")]
        for actor in actors:  # both lost, one after the other; each call is served again once they are back
            ray.kill(actor, no_restart=False)
            got = [[h.id for h in hits] for hits in client.search(queries, 3, "bm25")]
            assert got == want
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)


def _slow_or_crashing_backends():
    """SimBackends whose search sleeps 3 s for a query starting "slow" and kills its process for "crash".
    Defined in a function so that Ray pickles it by value into the pool actors."""
    import os
    import time
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class Backends(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            backends = super().__call__(cfg, index_dir, **kw)
            search = backends.search

            def searched(queries, k, retriever):
                if "crash" in queries:
                    os._exit(1)
                if any(q.startswith("slow") for q in queries):
                    time.sleep(3.0)
                return search(queries, k, retriever)

            backends.search = searched
            return backends

    return Backends()


def test_a_search_in_flight_when_its_actor_dies_is_sent_again_and_one_that_kills_every_time_fails(local_ray):
    """The actor dies while serving the call (not between calls): Ray restarts it and sends the call again,
    whose result is what it would have been. A call that kills its actor every time is given up after
    ray.batch_deaths deaths (counted by the run's RunControl): it fails, and with it its questions, instead
    of killing every restart for ever."""
    import threading
    import time

    from pipeline.runtime.pools import PoolClient, start_pool
    from pipeline.runtime.ray_control import RunControl

    cfg = DynragConfig()
    cfg.ray.num_cpus, cfg.ray.retrieval_actors, cfg.ray.retrieval_actor_num_cpus = 2, 1, 0.5
    control = ray.remote(RunControl).options(num_cpus=0).remote()
    (actor,) = start_pool(cfg, "retrieval", None, _slow_or_crashing_backends(), control)
    try:
        client = PoolClient([actor])
        queries = ["slow question 1", "question 2"]
        pid_before = ray.get(actor.__ray_call__.remote(lambda self: __import__("os").getpid()))
        got: dict = {}
        call = threading.Thread(target=lambda: got.update(hits=client.search(queries, 3, "bm25")))
        call.start()
        time.sleep(1.0)  # the search is sleeping inside the actor
        ray.kill(actor, no_restart=False)
        call.join(120)
        assert not call.is_alive() and len(got["hits"]) == 2 and all(len(h) == 3 for h in got["hits"])
        assert ray.get(actor.__ray_call__.remote(lambda self: __import__("os").getpid())) != pid_before
        with pytest.raises(ray.exceptions.RayTaskError, match=r"killed its pool actor's process 2 times"):
            client.search(["crash"], 3, "bm25")
        assert client.search(queries, 3, "bm25") == got["hits"]  # the pool serves on
    finally:
        ray.kill(actor, no_restart=True)
        ray.kill(control)
