"""Actor pools beside the engine actors (the generation pool) for `runtime.mode=ray`.

- retrieval pool (`ray.retrieval_actors`): CPU actors holding the index; each opens it once (a remote
  index is pulled into its node's cache once), on the node group offering `ray.retrieval_actor_resources`;
- scorer pool (`ray.scorer_actors`): actors holding the classifiers, rerankers and the embedder, on a
  CPU or a share of a GPU (`ray.scorer_actor_num_gpus`); models load on first use, by name.

With a pool, the engine actors do not build that part: every Retrieve, Score or Embed batch an engine
gathers is cut into contiguous chunks served in parallel by the pool's actors (`PoolClient`, one chunk an
actor, at most 2 x `ray.stall_s`), results in input order. Each pool actor holds a `Backends` of the run's
configuration, so it serves exactly what the in-process backends would. The driver starts the pools and owns them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.config import DynragConfig
from pipeline.errors import first_line

log = logging.getLogger(__name__)


class PoolActor:
    """A pool's actor. A call lost with its actor's process is sent again by Ray (`max_task_retries`, for a
    node that goes away); one whose process died `ray.batch_deaths` times while serving it (a JVM or FAISS
    crash, host OOM: it would kill every restart) fails instead, and with it its questions, with the cause.
    Each call's attempts are counted by the driver's RunControl (`control`), keyed by the call's id."""

    def __init__(
        self,
        cfg_json: dict,
        index_dir: str | None,
        make_backends: Callable[..., Any] | None = None,
        control: Any = None,
    ):
        from pipeline.backends import Backends
        from pipeline.runtime.ray_logs import own_worker_logging

        own_worker_logging()
        cfg = DynragConfig.model_validate(cfg_json)
        self.control, self.deaths = control, cfg.ray.batch_deaths
        self.call_s, self.limit = cfg.ray.stall_s, f"ray.stall_s={cfg.ray.stall_s:g}"  # its waits for RunControl
        self.actor_id = ""
        if control is not None:  # its restarts count against the budget (RunControl.register_pool)
            import os

            import ray

            ctx = ray.get_runtime_context()
            self.actor_id = ctx.get_actor_id() or ""
            kind = "retrieval" if index_dir else "scorer"
            from pipeline.runtime.waits import bounded_get

            bounded_get(
                control.register_pool.remote(self.actor_id, kind, ctx.get_node_id(), os.getpid()),
                "RunControl.register_pool (the driver's run control)",
                cfg.ray.stall_s,
                f"ray.stall_s={cfg.ray.stall_s:g}",
            )
        self.backends = (make_backends or Backends)(cfg, index_dir)
        self.served: dict[str, list[int]] = {}  # op -> [calls, items] served so far

    def ready(self, part: str | None) -> bool:
        if part:
            getattr(self.backends, part)  # build it now, so that errors surface at start
        return True

    def run(self, call: str, op: str, items: list, *args):
        """`op` over `items` (Backends' method); `call`: the call's id, the same in every attempt of it."""
        counts = self.served.setdefault(op, [0, 0])
        counts[0] += 1
        counts[1] += len(items)
        if self.control is None:
            return getattr(self.backends, op)(items, *args)
        import os

        from pipeline.runtime.waits import bounded_get

        begun = self.control.begin.remote(call, self.actor_id, os.getpid())
        dead = bounded_get(begun, "RunControl.begin (the driver's run control)", self.call_s, self.limit)
        if len(dead) >= self.deaths:
            self.control.end.remote(call)
            raise PoolCallFailed(
                f"this {op} call of {len(items)} items killed its pool actor's process {len(dead)} times "
                f"(last pid {dead[-1]['pid']}): not sent again"
            )
        result = getattr(self.backends, op)(items, *args)
        self.control.end.remote(call)
        return result

    def stats(self) -> dict[str, list[int]]:
        """What this actor has served: op -> [calls, items]."""
        return self.served


class PoolCallFailed(RuntimeError):
    """A pool call given up after it killed its actor's process `ray.batch_deaths` times."""


def pool_stats(actors: list) -> dict[str, list[int]]:
    """What a pool's actors have served together: op -> [calls, items] (for the job's log: {} if they do not say
    within POOL_CALL_S)."""
    import ray

    total: dict[str, list[int]] = {}
    try:
        each = ray.get([a.stats.remote() for a in actors], timeout=POOL_CALL_S)
    except ray.exceptions.GetTimeoutError:
        log.warning("the pool's actors did not say what they served within %g s", POOL_CALL_S)
        return total
    for served in each:
        for op, (calls, items) in served.items():
            t = total.setdefault(op, [0, 0])
            t[0] += calls
            t[1] += items
    return total


def start_pool(
    cfg: DynragConfig,
    kind: str,
    index_dir: str | None = None,
    make_backends: Callable[..., Any] | None = None,
    control: Any = None,
) -> list:
    """Start the `kind` pool ("retrieval" or "scorer") as configured; wait until each actor is ready.
    `make_backends` replaces `Backends` in its actors (the latency-model bench); `control`: the run's
    RunControl, which counts each call's attempts."""
    import ray

    from pipeline.runtime.ray_resources import pool_actor_options
    from platform_shims.compat import actor_id

    n, opts = pool_actor_options(cfg, kind)
    cls = ray.remote(PoolActor)
    actors = [
        cls.options(**opts).remote(cfg.model_dump(mode="json"), index_dir, make_backends, control) for _ in range(n)
    ]
    refs = [a.ready.remote("retriever" if kind == "retrieval" else None) for a in actors]
    await_ready(kind, refs, [actor_id(a) for a in actors], opts, cfg.ray.replica_wait_s, control)
    log.info("%d %s actors ready (%s)", n, kind, opts)
    return actors


POOL_LOOK_S = 1.0  # how often the driver looks at RunControl's line while a pool starts
POOL_CALL_S = 10.0  # for one of those looks, and for the ready calls' results once all are ready
POOL_CALL = (POOL_CALL_S, f"POOL_CALL_S = {POOL_CALL_S:g}")  # bounded_get's limit and its name


def await_ready(kind: str, refs: list, ids: list[str], asked: dict, wait_s: float, control: Any = None) -> None:
    """Wait until every actor of the `kind` pool is ready (`refs`: their `ready` calls; `ids`: their actor ids), at
    most `wait_s` (ray.replica_wait_s); else end the job with one line naming the pool, each actor not ready and
    its node (or that it has none: it cannot be placed), and what each asks for. Pool actors restart without end:
    one that runs out of memory loading its index restarts for ever, so RunControl's line (a pool actor over its
    failure budget) is looked at every POOL_LOOK_S and ends the wait at once. A ready call that failed raises its
    error."""
    import time

    import ray

    from pipeline.errors import DynragError
    from pipeline.runtime.waits import bounded_get

    t0, pending = time.monotonic(), list(refs)
    while pending:
        left = wait_s - (time.monotonic() - t0)
        if left <= 0:
            raise DynragError(
                _not_ready(kind, [ids[refs.index(r)] for r in pending], len(refs), asked, wait_s, control)
            )
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(POOL_LOOK_S, left))
        if control is not None:
            line = bounded_get(control.fatal.remote(), "RunControl.fatal (the driver's run control)", *POOL_CALL)
            if line:
                raise DynragError(line)
    bounded_get(list(refs), f"the {kind} pool actors' ready calls, all done", *POOL_CALL)  # a failed one's error


def _not_ready(kind: str, ids: list[str], n: int, asked: dict, wait_s: float, control: Any) -> str:
    import ray

    def where(actor: str) -> str:
        p = ray.get(control.pool_actor.remote(actor), timeout=POOL_CALL_S) if control is not None else None
        if not p:
            return f"{actor[:8]} has not started on any node"
        return f"{actor[:8]} on node {str(p['node'])[:8]} (started {p['starts']} times)"

    try:
        actors = "; ".join(where(a) for a in ids)
    except Exception as err:  # RunControl does not answer: the line goes without the nodes
        actors = f"{', '.join(a[:8] for a in ids)} (their nodes unknown: {first_line(err)})"
    gpus = f", {asked['num_gpus']:g} GPU" if asked.get("num_gpus") else ""
    extra = "".join(f", {v:g} {k}" for k, v in asked.get("resources", {}).items())
    return (
        f"the {kind} pool is not ready after {wait_s:g} s (ray.replica_wait_s): {len(ids)} of its {n} actors are "
        f"not: {actors}; each asks for {asked.get('num_cpus', 1):g} CPU{gpus}{extra}: stopping"
    )


class PoolClient:
    """The `search`, `score` and `embed` of `Backends`, served by a pool of actors.

    A call cuts its items into contiguous chunks, at most one per actor, sends chunk j to the j-th actor from
    the call's first one, and gathers the results in input order, waiting at most `call_s` (2 x ray.stall_s:
    the driver's watchdog ends a job whose pool call has run ray.stall_s first, naming the pool actor; this is
    the limit where it cannot, WaitExpired). Nothing is shared between calls but the rotation, so several
    engine-actor threads may call one client at once. Consecutive calls start at the next actor (`_next`, under
    a lock), so the engine actors' small batches spread over the pool.
    """

    def __init__(self, actors: list, control: Any = None, call_s: float = 2 * 900.0):
        self.actors, self.control, self.call_s = list(actors), control, call_s
        self._next = 0  # the first actor of the next call
        self._lock = threading.Lock()

    def _map(self, op: str, items, *args) -> list:
        from ray.exceptions import RayActorError

        from pipeline.runtime.waits import bounded_get

        items = list(items)
        if not items:
            return []
        n = min(len(self.actors), len(items))
        size = -(-len(items) // n)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        with self._lock:
            start, self._next = self._next, (self._next + len(chunks)) % len(self.actors)
        used = [self.actors[(start + j) % len(self.actors)] for j in range(len(chunks))]
        call = uuid.uuid4().hex  # each chunk's call id: the same in Ray's retries of it
        refs = [a.run.remote(f"{call}-{j}", op, chunk, *args) for j, (a, chunk) in enumerate(zip(used, chunks))]
        try:
            what = f"a {op} call of {len(items)} items to {len(chunks)} pool actors"
            return bounded_get(refs, what, self.call_s, f"2 x ray.stall_s = {self.call_s:g}")
        except RayActorError as err:  # restarted by Ray without end, so this one cannot come back: the job ends
            if self.control is not None:
                self.control.pool_lost.remote(getattr(err, "actor_id", None) or "?", first_line(err))
            raise

    def search(self, queries: list[str], k: int, retriever: str):
        return [hits for part in self._map("search", queries, k, retriever) for hits in part]

    def score(self, items: list, classifier: str):
        return [float(s) for part in self._map("score", items, classifier) for s in part]

    def embed(self, texts: list[str], model: str | None):
        return np.concatenate(self._map("embed", texts, model))

    def close(self) -> None:
        """The driver owns the actors; nothing to release here."""
