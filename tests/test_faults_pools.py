"""Ray's own fault tolerance for the retrieval and scorer pools (pipeline/runtime/pools.py): a pool actor
that dies (its node lost, here its process killed) is restarted by Ray, and the calls it held are sent
again, so the engine actors' searches come back as if nothing happened."""

from __future__ import annotations

import pytest

from pipeline.config import DynragConfig

pytestmark = [pytest.mark.faults, pytest.mark.own_process]  # starts Ray in-process (scripts/run_tests.sh)

ray = pytest.importorskip("ray")


def test_a_lost_pool_actor_is_restarted_and_its_calls_are_retried():
    from indexing.raytools import init_ray
    from jobs.bench.simulated import SimBackends
    from pipeline.runtime.pools import PoolClient, start_pool

    cfg = DynragConfig()
    cfg.ray.num_cpus, cfg.ray.retrieval_actors, cfg.ray.retrieval_actor_num_cpus = 2, 2, 0.5
    init_ray(None, cfg.ray.num_cpus)
    try:
        actors = start_pool(cfg, "retrieval", None, SimBackends())
        client = PoolClient(actors)
        queries = [f"question {i}" for i in range(40)]
        want = [[h.id for h in hits] for hits in client.search(queries, 3, "bm25")]
        for actor in actors:  # both lost, one after the other; each call is served again once they are back
            ray.kill(actor, no_restart=False)
            got = [[h.id for h in hits] for hits in client.search(queries, 3, "bm25")]
            assert got == want
    finally:
        ray.shutdown()
