"""CPU retrieval actors for `runtime.mode=ray` with `ray.retrieval_actors` > 0.

The engine actors (on GPU nodes, holding a generator) then do not open the index: every Retrieve batch
an engine gathers is cut into contiguous chunks searched in parallel by the retrieval actors, and the
hits come back in query order. Each retrieval actor opens the index once (a remote index is pulled
into its node's cache once) with `ray.retrieval_actor_num_cpus` CPUs, on the node group that offers
`ray.retrieval_actor_resources` (cluster/: the CPU workers). The driver starts them and owns them.
"""

from __future__ import annotations

import logging

from pipeline.config import DynragConfig

log = logging.getLogger(__name__)


class RetrievalActor:
    def __init__(self, index_dir: str, cfg_json: dict):
        from pipeline.backends.retrieval import IndexRetriever

        self.retriever = IndexRetriever(index_dir, DynragConfig.model_validate(cfg_json))

    def search(self, queries: list[str], k: int, retriever: str):
        return self.retriever.search(queries, k, retriever)

    def ready(self) -> bool:
        return True


def start_retrieval_actors(cfg: DynragConfig, index_dir: str) -> list:
    """Start `ray.retrieval_actors` actors and wait until each has opened the index (errors surface here)."""
    import ray

    opts: dict = {"num_cpus": cfg.ray.retrieval_actor_num_cpus}
    if cfg.ray.retrieval_actor_resources:
        opts["resources"] = dict(cfg.ray.retrieval_actor_resources)
    cls = ray.remote(RetrievalActor)
    actors = [cls.options(**opts).remote(index_dir, cfg.model_dump(mode="json")) for _ in range(cfg.ray.retrieval_actors)]
    ray.get([a.ready.remote() for a in actors])
    log.info("%d retrieval actors opened %s (%g CPUs each)", len(actors), index_dir, cfg.ray.retrieval_actor_num_cpus)
    return actors


class RemoteRetriever:
    """The retriever interface of `Backends` (`search`) over retrieval actors."""

    def __init__(self, actors: list):
        self.actors = list(actors)
        self._next = 0  # rotate the first actor so the engine actors spread their small batches

    def search(self, queries: list[str], k: int, retriever: str):
        import ray

        queries = list(queries)
        if not queries:
            return []
        n = min(len(self.actors), len(queries))
        size = -(-len(queries) // n)
        chunks = [queries[i:i + size] for i in range(0, len(queries), size)]
        start, self._next = self._next, (self._next + len(chunks)) % len(self.actors)
        refs = [self.actors[(start + j) % len(self.actors)].search.remote(c, k, retriever) for j, c in enumerate(chunks)]
        return [hits for part in ray.get(refs) for hits in part]

    def close(self) -> None:
        """The driver owns the actors; nothing to release here."""
