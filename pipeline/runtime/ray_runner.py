"""`runtime.mode=ray`: question batches stream through a Ray Data pipeline of engine actors.

Each actor holds the backends (a vLLM or transformers generator, the index, scorer, embedder; the index,
or the scorer and embedder, served instead by the retrieval and scorer pools when configured, pools.py) and
runs the same engine (`answer.engine`) over each batch it receives, so predictions equal the in-process run. Actors
are data-parallel replicas (`ray.actors`, one per GPU on a cluster: `ray.actor_num_gpus=1`); their
resources are configurable (`ray.actor_num_cpus`, `ray.actor_num_gpus`). Rows come back to the
driver as they finish and are written there as Parquet parts, keyed by question id as in-process,
so resume works the same way.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterator

from pipeline.config import DynragConfig
from pipeline.engine.requests import Question

log = logging.getLogger(__name__)


class EngineActor:
    """A Ray Data actor: builds the backends once, answers one batch of questions per call."""

    def __init__(self, cfg_json: dict, index_dir: str | None, row_args: dict, pools: dict[str, list] | None = None):
        from pipeline.backends import Backends
        from pipeline.engine.continuous import make_engine
        from pipeline.methods.registry import get_method
        from pipeline.runtime.pools import PoolClient

        self.cfg = DynragConfig.model_validate(cfg_json)
        self.spec = get_method(self.cfg.method.name)
        self.params = self.spec.params(self.cfg.method.params, self.cfg)
        # a part served by a pool (pools.py) is not built here
        remote = {kind: PoolClient(actors) for kind, actors in (pools or {}).items()}
        scorer = remote.get("scorer")
        self.backends = Backends(self.cfg, index_dir, retriever=remote.get("retrieval"), scorer=scorer, embedder=scorer)
        self.engine = make_engine(self.cfg, self.backends)
        self.row_args = row_args

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        from indexing.faults import fault_point
        from pipeline.io.output import make_row

        fault_point("ray.engine_batch")
        questions = [Question.from_dict(json.loads(s)) for s in batch["q"]]
        outcomes = self.engine.run(questions, self.spec.program, self.params)
        return {"row": [json.dumps(make_row(o, **self.row_args)) for o in outcomes]}


def init_ray(cfg: DynragConfig) -> bool:
    """Connect to `runtime.ray_address` or start a local instance (address "local": a `ray start` cluster running
    on the machine is joined only when named); True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only listeners on one machine
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    from indexing.java import jvm_signals_kept

    with jvm_signals_kept():  # Ray replaces the signal handlers a running JVM (BM25 in this process) relies on
        if cfg.runtime.ray_address:
            ray.init(address=cfg.runtime.ray_address, **kwargs)
        else:
            ray.init(address="local", num_cpus=cfg.ray.num_cpus, **kwargs)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return True


def _index_arg(index_dir: str | None) -> str | None:
    """Local index paths made absolute for the actors; URIs (s3://...) as given (each node pulls a copy)."""
    from indexing.remote import is_remote

    return index_dir if not index_dir or is_remote(index_dir) else os.path.abspath(index_dir)


def answer_with_ray(todo: list[Question], cfg: DynragConfig, index_dir: str | None, row_args: dict) -> Iterator[list[dict]]:
    """Yield lists of finished rows as the actors return them."""
    if not todo:
        return
    import ray

    from pipeline.runtime.ray_resources import engine_actor_options

    from pipeline.runtime.pools import pool_stats, start_pool

    from pipeline.runtime.orphan_guard import OrphanGuard

    # a local Ray's processes (raylet, workers, agents) die with this job, even by SIGKILL
    guard = None if ray.is_initialized() or cfg.runtime.ray_address else OrphanGuard()
    started = init_ray(cfg)
    pools: dict[str, list] = {}
    try:
        if cfg.ray.retrieval_actors and index_dir:
            pools["retrieval"] = start_pool(cfg, "retrieval", _index_arg(index_dir))
        if cfg.ray.scorer_actors:
            pools["scorer"] = start_pool(cfg, "scorer")
        batch = cfg.ray.batch_questions or cfg.answer.batch_questions
        ds = ray.data.from_items([{"q": json.dumps(q.to_dict())} for q in todo])
        ds = ds.map_batches(
            EngineActor,
            fn_constructor_args=(cfg.model_dump(mode="json"), _index_arg(index_dir), row_args, pools),
            batch_size=batch, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cfg.ray.actors),
            **engine_actor_options(cfg),
        )
        for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
            yield [json.loads(s) for s in out["row"]]
        for kind, actors in pools.items():  # the pools' share of the work, before they go
            log.info("%s pool served (op: [calls, items]): %s", kind, pool_stats(actors))
    finally:
        for actor in (a for actors in pools.values() for a in actors):
            ray.kill(actor)
        if started:
            ray.shutdown()
        if guard is not None:
            guard.close()
