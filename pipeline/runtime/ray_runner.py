"""`runtime.mode=ray`: questions stream from the dataset file through a Ray Data pipeline of engine actors,
and the actors write the rows.

The dataset is read on a worker (`QuestionSource`, ray_questions.py: dynrag's own loader, the first
`limit` questions less those already answered; a local file is read on the driver's node), never held by
the driver. Each engine actor holds the backends (a vLLM or transformers generator, the index, scorer,
embedder; the index, or the scorer and embedder, served instead by the retrieval and scorer pools when
configured, pools.py) and runs the same engine (`answer.engine`) over each batch it receives, so
predictions equal the in-process run. It writes each batch's rows as one Parquet part under the output
(`PartWriter`: keyed by question id as in-process, and a retried batch replaces its own part) and sends
the driver only a small report (`batch_report`: counts). So the output must be a URI or a folder every
node shares (`check_shared`). Actors are data-parallel replicas (`ray.actors`, one per GPU on a cluster:
`ray.actor_num_gpus=1`); their resources are configurable (`ray.actor_num_cpus`, `ray.actor_num_gpus`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Generator
from typing import Any, overload

from pipeline.config import DynragConfig
from pipeline.engine.requests import Question

log = logging.getLogger(__name__)


class EngineActor:
    """A Ray Data actor: builds the backends once; answers one batch of questions per call and writes its rows."""

    def __init__(
        self,
        cfg_json: dict,
        index_dir: str | None,
        row_args: dict,
        out: str,
        header: dict[str, str] | None,
        pools: dict[str, list] | None = None,
        params: dict | None = None,
    ):
        from pipeline.backends import Backends
        from pipeline.engine.continuous import make_engine
        from pipeline.io.output import PartWriter
        from pipeline.io.output_lock import check_same_host, check_shared
        from pipeline.methods.registry import get_method
        from pipeline.runtime.pools import PoolClient

        check_shared(out)
        self.cfg = DynragConfig.model_validate(cfg_json)
        self.spec = get_method(self.cfg.method.name)
        # the driver's parameters bound to the run (for_output), else the configuration's
        self.params = self.spec.params(self.cfg.method.params, self.cfg) if params is None else self.spec.params(params)
        for path in self.params.state_files():  # held by the driver (state_lock): a local file, one host
            check_same_host(path)
        # a part served by a pool (pools.py) is not built here
        remote = {kind: PoolClient(actors) for kind, actors in (pools or {}).items()}
        scorer = remote.get("scorer")
        self.backends = Backends(self.cfg, index_dir, retriever=remote.get("retrieval"), scorer=scorer, embedder=scorer)
        self.engine = make_engine(self.cfg, self.backends)
        self.row_args = row_args
        self.writer = PartWriter(out, row_args["run_id"], header)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from indexing.faults import fault_point
        from pipeline.io.output import batch_report, make_row

        fault_point("ray.engine_batch")
        questions = [Question.from_dict(json.loads(s)) for s in batch["q"] if s is not None]
        outcomes = self.engine.run(questions, self.spec.program, self.params) if questions else []
        rows = [make_row(o, **self.row_args) for o in outcomes]
        part = self.writer.write(rows)
        if part:
            fault_point("ray.part_written")
        report = batch_report(rows, int(sum(batch["skipped"])), self.engine.new_calls())
        return {"part": [part or ""], "report": [json.dumps(report)]}


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


@overload
def _for_workers(path: str) -> str: ...


@overload
def _for_workers(path: None) -> None: ...


@overload
def _for_workers(path: str | None) -> str | None: ...


def _for_workers(path: str | None) -> str | None:
    """A local path made absolute for the workers; URIs (s3://...; each node pulls a remote index once) and
    `dpr:` sets as given."""
    if not path or "://" in path or path.startswith("dpr:"):
        return path
    return os.path.abspath(path)


def answer_with_ray(
    dataset: str,
    out: str,
    cfg: DynragConfig,
    index_dir: str | None,
    row_args: dict,
    *,
    header: dict[str, str] | None,
    done: set[str],
    limit: int | None,
    params: dict | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Answer the pending questions of `dataset` into parts under `out`; yield each batch's report as it comes.
    `params`: the method's parameters bound to the run (MethodParams.for_output), as JSON."""
    import ray

    from pipeline.runtime.orphan_guard import OrphanGuard
    from pipeline.runtime.pools import pool_stats, start_pool
    from pipeline.runtime.ray_questions import QuestionSource
    from pipeline.runtime.ray_resources import engine_actor_options

    # a local Ray's processes (raylet, workers, agents) die with this job, even by SIGKILL
    guard = None if ray.is_initialized() or cfg.runtime.ray_address else OrphanGuard()
    started = init_ray(cfg)
    pools: dict[str, list] = {}
    try:
        if cfg.ray.retrieval_actors and index_dir:
            pools["retrieval"] = start_pool(cfg, "retrieval", _for_workers(index_dir))
        if cfg.ray.scorer_actors:
            pools["scorer"] = start_pool(cfg, "scorer")
        batch = cfg.ray.batch_questions or cfg.answer.batch_questions
        ds = ray.data.read_datasource(QuestionSource(_for_workers(dataset), cfg, done, limit, batch))
        out = _for_workers(out)
        ds = ds.map_batches(
            EngineActor,
            fn_constructor_args=(
                cfg.model_dump(mode="json"),
                _for_workers(index_dir),
                row_args,
                out,
                header,
                pools,
                params,
            ),
            batch_size=batch,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cfg.ray.actors),
            **engine_actor_options(cfg),
        )
        seen: set[str] = set()  # parts reported: a retried batch reports its part again
        for got in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for part, report in zip(got["part"], got["report"]):
                if part and part in seen:
                    continue
                seen.add(part)
                yield json.loads(report)
        for kind, actors in pools.items():  # the pools' share of the work, before they go
            log.info("%s pool served (op: [calls, items]): %s", kind, pool_stats(actors))
    finally:
        for actor in (a for actors in pools.values() for a in actors):
            ray.kill(actor)
        if started:
            ray.shutdown()
        if guard is not None:
            guard.close()
