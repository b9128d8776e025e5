"""`runtime.mode=ray`: questions stream from the dataset file through a Ray Data pipeline of engine actors,
and the actors write the rows.

The dataset is read on a worker (ray_questions.py: dynrag's own loader, the first `limit` questions less
those already answered; a local file is read on the driver's node, by a task that needs no CPU there),
never held by the driver. Each engine actor holds the backends (a vLLM or transformers generator, the index, scorer,
embedder; the index, or the scorer and embedder, served instead by the retrieval and scorer pools when
configured, pools.py) and runs the same engine (`answer.engine`) over each batch it receives, so
predictions equal the in-process run. It writes each batch's rows as one Parquet part under the output
(`PartWriter`: keyed by question id as in-process, and a retried batch replaces its own part) and sends
the driver only a small report (`batch_report`: counts). So the output must be a URI or a folder every
node shares (`check_shared`). Actors are data-parallel replicas (`ray.actors`, one per GPU on a cluster:
`ray.actor_num_gpus=1`, or one per `generation.engine_kwargs.tensor_parallel_size` GPUs of a node); their
resources are configurable (`ray.actor_num_cpus`, `ray.actor_num_gpus`; ray_resources.py).
"""

from __future__ import annotations

import _thread
import concurrent.futures
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, overload

from pipeline.config import DynragConfig
from pipeline.engine.continuous import DRAIN_POLL_S, Feed
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Question

log = logging.getLogger(__name__)


class EngineActor:
    """A Ray Data actor: builds the backends and one engine once; answers each batch it is given and writes
    its rows. With the continuous engine, batches run at once (`ray.actor_batches` calls in flight, each in
    its own Ray thread): their questions go into one `Feed` that the engine's coordinator thread reads, so
    the next batch's questions are admitted while the previous one's last questions finish (no drain of
    the engine at each batch boundary); a call returns when its own questions are done."""

    def __init__(
        self,
        cfg_json: dict,
        index_dir: str | None,
        row_args: dict,
        out: str,
        header: dict[str, str] | None,
        pools: dict[str, list] | None = None,
        control: Any = None,
        make_backends: Callable[..., Any] | None = None,
        params: dict | None = None,
    ):
        from pipeline.backends import Backends
        from pipeline.engine.continuous import ContinuousEngine, make_engine
        from pipeline.io.output import PartWriter
        from pipeline.io.output_lock import check_same_host, check_shared
        from pipeline.methods.registry import get_method
        from pipeline.runtime.gpu_plan import replica_gpu_plan
        from pipeline.runtime.pools import PoolClient
        from pipeline.runtime.ray_logs import own_worker_logging

        own_worker_logging()
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
        plan = replica_gpu_plan(self.cfg, index_dir, frozenset(remote))  # None without CUDA; refuses a misfit
        self.control = control  # the driver's RunControl (ray_control.py)
        self.actor_id = _own_actor_id()
        group = self._claim_group()
        # where this replica runs (in each batch's report): its process, node and placement group
        self.replica = {"pid": os.getpid(), "node": _own_node_id(), "group": group.id.hex() if group else None}
        self.backends = (make_backends or Backends)(
            self.cfg,
            index_dir,
            retriever=remote.get("retrieval"),
            scorer=scorer,
            embedder=scorer,
            faiss_placement=plan.index if plan else None,
            replica_group=group,
        )
        self.drain = Drain(self.cfg.answer.drain_s)
        self.engine = make_engine(self.cfg, self.backends, self.drain)
        self.feed = Feed() if isinstance(self.engine, ContinuousEngine) else None
        self.row_args = row_args
        self.writer = PartWriter(out, row_args["run_id"], header)
        self.lock = threading.Lock()  # the calls' shared state: batches waiting, the coordinator, the reports
        self.waiting: dict[int, _Batch] = {}  # id(question) -> its batch
        self.coordinator: threading.Thread | None = None
        self.ended: BaseException | str | None = None  # why the coordinator stopped: "drained" or its error
        self.first_call: float | None = None  # time.time() of the first batch: the start of the busy ratio
        self.reported_drained = False
        if control is not None:
            threading.Thread(target=self._watch, args=(control,), name="dynrag-drain", daemon=True).start()
        # this actor's own SIGTERM (its node pre-empted): drain, write, then go as Ray would have it go
        self.preempted = threading.Event()
        self.calls = 0  # calls between their start and their part written
        if threading.current_thread() is threading.main_thread():  # where Ray runs an actor's constructor
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from indexing.faults import fault_point
        from pipeline.io.output import batch_report, make_row

        fault_point("ray.engine_batch", until=self.preempted.is_set)
        with self.lock:
            self.first_call = self.first_call or time.time()
            self.calls += 1
        try:
            questions = [Question.from_dict(json.loads(s)) for s in batch["q"] if s is not None]
            outcomes = self._answer(questions) if questions and not self.drain.requested else []
            rows = [make_row(o, **self.row_args) for o in outcomes]
            part = self.writer.write(rows, [q.id for q in questions])
            if part:
                fault_point("ray.part_written", until=self.preempted.is_set)
        finally:
            with self.lock:
                self.calls -= 1
            self._report_drained()
        if self.preempted.is_set():
            # the process goes once every call has written what it finished: Ray Data sends this batch to a
            # new actor, whose part (keyed by the batch's questions) replaces this one
            threading.Event().wait()
        with self.lock:
            report = batch_report(rows, int(sum(batch["skipped"])), self.engine.new_calls())
            report["generator"] = self._generator_busy()
            report["replica"] = self.replica
        return {"part": [part or ""], "report": [json.dumps(report)]}

    def _answer(self, questions: list[Question]) -> list:
        """The outcomes of `questions`, in their order (those still in flight when a drain ran out: none)."""
        if self.feed is None:  # the lockstep engine: one batch at a time (ray.actor_batches is 1)
            return self.engine.run(questions, self.spec.program, self.params)
        got = _Batch(questions)
        with self.lock:
            if isinstance(self.ended, BaseException):  # the engine failed in an earlier batch
                raise self.ended
            if self.ended:  # drained: these questions are the rerun's
                return []
            self.waiting.update((id(q), got) for q in questions)
            if self.coordinator is None:
                self.coordinator = threading.Thread(
                    target=self._coordinate, args=(self.feed,), name="dynrag-engine", daemon=True
                )
                self.coordinator.start()
        self.feed.put(questions)
        return got.result()

    def _coordinate(self, feed: Feed) -> None:
        """Run the engine over the feed (until a drain ends it), handing each outcome to its batch."""
        try:
            for outcome in self.engine.stream(feed, self.spec.program, self.params):
                with self.lock:
                    self.waiting.pop(id(outcome.question)).add(outcome)
        except BaseException as err:  # the engine cannot go on (say vLLM's engine core died)
            self._exit_for_restart(err)
            with self.lock:  # once too often: every waiting batch fails, and with it the job
                self.ended = err
                for got in set(self.waiting.values()):
                    got.fail(err)
            raise
        finally:
            with self.lock:  # drained: each batch still waiting gets what finished of it
                self.ended = self.ended or "drained"
                for got in set(self.waiting.values()):
                    got.finish()
                self.waiting.clear()

    def close(self) -> None:
        """Shut down what this actor holds: the engine (its coordinator ended, its lanes joined), then the
        backends (vLLM's engine, the index, the models); failures are logged, not raised."""
        if self.feed is not None:
            self.feed.close()
        if self.coordinator is not None and self.coordinator is not threading.current_thread():
            self.coordinator.join(CLOSE_JOIN_S)
        if self.control is not None:
            self.control.release.remote(self.actor_id)
        for part in (self.engine, self.backends):
            try:
                part.close()
            except Exception as err:
                log.warning("engine actor %d: closing %s failed: %s", os.getpid(), type(part).__name__, err)

    def _claim_group(self) -> Any:
        """This replica's placement group (tensor-parallel runs), claimed from the driver; waited for, since
        an autoscaler may still be starting its node."""
        if self.control is None:
            return None
        import ray

        group = ray.get(self.control.claim.remote(self.actor_id, ray.get_runtime_context().get_node_id()))
        if group is not None:
            ray.get(group.ready())
        return group

    def _report_drained(self) -> None:
        """Tell the driver once this actor has drained: a drain asked for, its engine ended, nothing in flight."""
        if self.control is None or not self.drain.requested or self.reported_drained:
            return
        with self.lock:
            done = not self.calls and (self.feed is None or self.ended is not None)
        if done:
            self.reported_drained = True
            self.control.drained.remote(self.actor_id)

    def _exit_for_restart(self, err: BaseException) -> None:
        """After the engine failed: exit so that Ray starts this actor again and Ray Data sends its batches to
        the new one (the batches' questions run again; their parts are keyed by question), unless engines
        have failed ENGINE_RESTARTS times in this run (a fault that comes back: the job stops with it)."""
        import ray

        failures = ray.get(self.control.engine_failed.remote()) if self.control is not None else ENGINE_RESTARTS + 1
        if failures > ENGINE_RESTARTS:
            log.error("engine actor %d: the engine failed (%d times in this run): %r", os.getpid(), failures, err)
            return
        log.error("engine actor %d: the engine failed, restarting the actor: %r", os.getpid(), err)
        self.close()
        os._exit(1)

    def _on_sigterm(self, signum, frame) -> None:
        """SIGTERM to this actor's process (a pre-empted node's processes all get it): admit no more
        questions, finish those in flight within answer.drain_s, write them, then exit as a failed worker
        (Ray restarts the actor elsewhere and Ray Data re-runs the batches it held)."""
        if self.preempted.is_set():
            return
        log.warning("engine actor %d: SIGTERM, draining (up to %.0f s)", os.getpid(), self.cfg.answer.drain_s)
        self.preempted.set()
        self.drain.request(self.cfg.answer.drain_s)
        threading.Thread(target=self._exit_when_written, name="dynrag-preempted", daemon=True).start()

    def _exit_when_written(self) -> None:
        deadline = time.monotonic() + self.cfg.answer.drain_s + DRAIN_GRACE_S
        while time.monotonic() < deadline:
            with self.lock:
                if not self.calls:
                    break
            time.sleep(DRAIN_POLL_S)
        self.close()
        # not Ray's own exit: it waits for the calls still running, and those hold batches only partly
        # answered, which Ray Data sends to the restarted actor once this process is gone
        log.warning("engine actor %d: drained and written; exiting", os.getpid())
        os._exit(1)

    def _watch(self, control: Any) -> None:
        """Poll the driver's drain; when it is asked for, drain this actor's engine within its deadline."""
        import ray

        while not self.drain.requested:
            left = ray.get(control.remaining.remote())
            if left is not None:
                self.drain.request(left)
                return
            time.sleep(DRAIN_POLL_S)

    def _generator_busy(self) -> dict[str, float] | None:
        """The generator's busy seconds (time with a sequence in flight) since it started, and the seconds
        since this actor's first batch: their ratio is the replica's generator busy fraction."""
        flight = getattr(self.backends._generator, "flight", None)  # a streaming generator's, once built
        if flight is None or self.first_call is None:
            return None
        return {"busy_s": flight.busy_s, "active_s": time.time() - self.first_call, "pid": os.getpid()}


class _Batch:
    """One call's questions and their outcomes, collected from the coordinator thread."""

    def __init__(self, questions: list[Question]):
        self.order = {id(q): i for i, q in enumerate(questions)}
        self.outcomes: list = []
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def add(self, outcome) -> None:
        self.outcomes.append(outcome)
        if len(self.outcomes) == len(self.order):
            self.finish()

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(sorted(self.outcomes, key=lambda o: self.order[id(o.question)]))

    def fail(self, err: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(err)

    def result(self) -> list:
        return self.future.result()


def init_ray(cfg: DynragConfig) -> bool:
    """Connect to `runtime.ray_address` or start a local instance (address "local": a `ray start` cluster running
    on the machine is joined only when named); True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only listeners on one machine
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    from indexing.java import jvm_signals_kept
    from pipeline.runtime.ray_logs import route_ray_worker_output

    with jvm_signals_kept():  # Ray replaces the signal handlers a running JVM (BM25 in this process) relies on
        if cfg.runtime.ray_address:
            ray.init(address=cfg.runtime.ray_address, **kwargs)
        else:
            ray.init(address="local", num_cpus=cfg.ray.num_cpus, **kwargs)
    ray.data.DataContext.get_current().enable_progress_bars = False
    route_ray_worker_output()  # workers' library output to the run's log file, their dynrag lines shown
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
    drain: Drain | None = None,
    make_backends: Callable[..., Any] | None = None,
    params: dict | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Answer the pending questions of `dataset` into parts under `out`; yield each batch's report as it comes.

    `drain` (set by SIGTERM) is passed on to the engine actors (through the `RunControl` actor they poll): they
    admit no more questions, finish those in flight within `answer.drain_s`, write them and say so; once every
    replica has, the driver stops feeding. If the stream has not ended by then (and a grace period), the main
    thread is interrupted.
    `make_backends` replaces `Backends` in the engine and pool actors (the latency-model bench). `params`:
    the method's parameters bound to the run (MethodParams.for_output), as JSON."""
    import ray

    from pipeline.runtime.orphan_guard import OrphanGuard
    from pipeline.runtime.pools import pool_stats, start_pool
    from pipeline.runtime.ray_control import RunControl, make_replica_groups, remove_replica_groups
    from pipeline.runtime.ray_questions import question_dataset
    from pipeline.runtime.ray_resources import (
        cluster_gpu_nodes,
        engine_actor_options,
        replica_bundles,
        replica_gpus,
        tensor_parallel_size,
    )

    # a local Ray's processes (raylet, workers, agents) die with this job, even by SIGKILL
    guard = None if ray.is_initialized() or cfg.runtime.ray_address else OrphanGuard()
    started = init_ray(cfg)
    if drain is not None:
        from pipeline.runtime.signals import sigterm_drains

        sigterm_drains(drain)  # Ray's own SIGTERM handler exits at once
    pools: dict[str, list] = {}
    control, finished = None, threading.Event()
    groups: list = []  # one per tensor-parallel replica (ray_control.py)
    try:
        gpus = replica_gpus(cfg, *cluster_gpu_nodes())  # replicas that cannot fit stop the job here
        if cfg.ray.retrieval_actors and index_dir:
            pools["retrieval"] = start_pool(cfg, "retrieval", _for_workers(index_dir), make_backends)
        if cfg.ray.scorer_actors:
            pools["scorer"] = start_pool(cfg, "scorer", None, make_backends)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if gpus and tensor_parallel_size(cfg) > 1:
            groups = make_replica_groups(replica_bundles(tensor_parallel_size(cfg)), cfg.ray.actors)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # lives (and goes) with the driver
        control = ray.remote(RunControl).options(num_cpus=0, scheduling_strategy=here).remote(groups)
        if drain is not None:
            args = (drain, control, finished)
            threading.Thread(target=_pass_drain, args=args, name="dynrag-drain", daemon=True).start()
        batch = cfg.ray.batch_questions or cfg.answer.batch_questions
        ds = question_dataset(_for_workers(dataset), cfg, done, limit, batch)
        out = _for_workers(out)
        calls = actor_batches(cfg, batch) if cfg.answer.engine == "continuous" else 1
        ds = ds.map_batches(
            EngineActor,
            fn_constructor_args=(
                cfg.model_dump(mode="json"),
                _for_workers(index_dir),
                row_args,
                out,
                header,
                pools,
                control,
                make_backends,
                params,
            ),
            batch_size=batch,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(
                size=cfg.ray.actors,
                max_concurrent_calls_per_actor=calls,  # each call in its own thread: the actor takes the next
                enable_true_multi_threading=calls > 1,  # batch while the previous one's questions finish
                max_tasks_in_flight_per_actor=calls + 1,
            ),
            **engine_actor_options(cfg, gpus),
        )
        seen: set[str] = set()  # parts reported: a retried batch reports its part again
        for got in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for part, report in zip(got["part"], got["report"]):
                if part and part in seen:
                    continue
                seen.add(part)
                yield json.loads(report)
            if drain is not None and drain.requested and ray.get(control.drained_count.remote()) >= cfg.ray.actors:
                log.warning("drain: every engine actor has drained; the rest of the questions are left for a rerun")
                break
        for kind, actors in pools.items():  # the pools' share of the work, before they go
            log.info("%s pool served (op: [calls, items]): %s", kind, pool_stats(actors))
    finally:
        finished.set()
        for actor in [a for actors in pools.values() for a in actors] + ([control] if control is not None else []):
            ray.kill(actor)
        remove_replica_groups(groups)
        if started:
            ray.shutdown()
        if guard is not None:
            guard.close()


def actor_batches(cfg: DynragConfig, batch: int) -> int:
    """Batches an engine actor holds at once: `ray.actor_batches`, else enough for twice `answer.max_in_flight`
    questions (at least 2). Held beyond what is in flight, a batch's questions are admitted as others finish;
    with only as many as can be in flight, a batch's questions start and end together and the generator
    idles while the next batch retrieves (measured: cfs through Ray, generator busy 0.80 with 2 x 256
    questions held for 512 in flight, 0.97 with 8 x 128; `dynrag bench pipeline --simulate-gpu --runtime ray`)."""
    return cfg.ray.actor_batches or max(2, -(-2 * cfg.answer.max_in_flight // batch))


ENGINE_RESTARTS = 3  # engine failures in one run after which the job stops with the error
CLOSE_JOIN_S = 30.0  # for an engine actor's coordinator to end once its feed is closed
DRAIN_GRACE_S = 60.0  # beyond answer.drain_s: for the actors to write their parts and the stream to end


def _own_actor_id() -> str | None:
    """This Ray actor's id (hex); None outside an actor (an engine built by a test)."""
    import ray

    if not ray.is_initialized():
        return None
    actor = ray.get_runtime_context().get_actor_id()
    return actor or None


def _own_node_id() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _pass_drain(drain: Drain, control: Any, finished: threading.Event) -> None:
    """Driver side of a drain: ask the actors to drain when SIGTERM comes; if the job has not `finished` by
    the deadline and a grace period, interrupt the main thread (the rows written so far stay)."""
    while not drain.event.wait(DRAIN_POLL_S):
        if finished.is_set():
            return
    control.request.remote(drain.seconds)
    if not finished.wait(drain.seconds + DRAIN_GRACE_S):
        log.warning("drain: the engine actors did not finish within %.0f s; stopping", drain.seconds + DRAIN_GRACE_S)
        _thread.interrupt_main()
