"""`runtime.mode=ray`: questions stream from the dataset file through a Ray Data pipeline of engine actors,
and the actors write the rows.

The dataset is read on a worker (ray_questions.py: dynrag's own loader, the first `limit` questions less
those already answered; a local file on the driver's node; the read task asks no CPU), never held by the
driver. Each engine actor holds the backends (a vLLM or transformers generator, the index, scorer,
embedder; the index, or the scorer and embedder, served instead by the retrieval and scorer pools when
configured, pools.py) and runs the same engine (`answer.engine`) over each batch it receives, so
predictions equal the in-process run. It writes each batch's rows as one Parquet part under the output
(`PartWriter`: one object per write attempt, keyed by the batch's question ids; readers take each question
once) and sends the driver only a small report (`batch_report`: counts and the part, for the driver's
ledger). So the output must be a URI or a folder every
node shares (`check_shared`). Actors are data-parallel replicas (`ray.actors`, one per GPU on a cluster:
`ray.actor_num_gpus=1`, or one per `generation.engine_kwargs.tensor_parallel_size` GPUs of a node); their
resources are configurable (`ray.actor_num_cpus`, `ray.actor_num_gpus`; ray_resources.py).

An engine actor is a thin adapter over a `Replica` (replica.py: the lifecycle, the batch path). A
tensor-parallel replica's actor claims a placement group of its own (one per replica, made by the driver,
claimed by actor id: a restarted actor gets its group back) and hosts its generator in it (ray_host.py), so
vLLM's workers share the group's GPUs on one node; the groups, and every actor, go with the job. The driver's one supervisor
thread feeds `RunControl` (ray_control.py) the drain (its own SIGTERM, Ray's node drain notices) and ends
the job with one line when a replica is over its failure budget or no replica has run for `ray.replica_wait_s`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Container, Generator
from dataclasses import dataclass
from typing import Any, NoReturn, overload

from pipeline.config import DynragConfig
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Question
from pipeline.errors import DynragError, first_line
from pipeline.runtime.waits import WaitExpired, bounded_get, expired

log = logging.getLogger(__name__)

WATCH_S = 1.0  # how often an engine actor asks the driver's RunControl what to do (its heartbeat)
SUPERVISE_S = 1.0  # how often the driver's supervisor looks at the drain, the nodes and the replicas
# for a drained actor's returned batches to be committed by the driver before it exits: they are, within a second,
# unless Ray Data gave one of them in a task with a batch this actor leaves for another (a task's results go
# together): then that batch is answered again elsewhere, and its attempt here is dropped at the commit
COMMIT_WAIT_S = 10.0
CALL_TIMEOUT_S = 10.0  # for one of the supervisor's calls to RunControl
# the supervisor's looks in a row that may fail before it ends the job: one call that times out can be transient
# (RunControl busy with a burst of heartbeats and batch begins from many replicas, the GCS slow for a moment), so
# one failure must not end a job of hours; three in a row (at least 3 s, at most ~33 s) is no longer a hiccup but a
# driver whose watchdogs (a replica over its budget, none running, one stuck) are all blind
CALL_FAILURES = 3
READER_JOIN_S = 30.0  # for the stream's reader thread to end once the job's actors are gone
DRAIN_GRACE_S = 60.0  # beyond answer.drain_s: for the actors to write their parts and the stream to end


class EngineActor:
    """A Ray Data actor: a thin adapter over one `Replica` (the backends, the engine, the part writer). It
    registers with the driver's `RunControl`, answers each batch it is given through `Replica.answer`
    (`ray.actor_batches` calls at once, each in its own Ray thread), turns its SIGTERM and the driver's
    instructions (a drain) into the replica's drain message, and once the replica has ended and written
    what it finished, exits for Ray to restart it (a pre-empted node, an engine that died) or stays (the
    driver's own drain)."""

    def __init__(
        self,
        cfg_json: dict,
        index_dir: str | None,
        runs: list[dict],
        pools: dict[str, list] | None = None,
        control: Any = None,
        make_backends: Callable[..., Any] | None = None,
        groups: list | None = None,
    ):
        """`runs`: what each run of the job answers with and writes to (`RayRun.for_actor`): its method, its
        parameters bound by the driver (None: the configuration's), its row fields, output and header.
        `groups`: the tensor-parallel replicas' placement groups, one of which this actor claims."""
        import ray

        from pipeline.io.output_lock import check_same_host, check_shared
        from pipeline.methods.registry import all_one_call
        from pipeline.runtime.ray_logs import own_worker_logging

        own_worker_logging()
        cfg = DynragConfig.model_validate(cfg_json)
        for run in runs:
            check_shared(run["out"])
        self.runs = [_run(cfg, run) for run in runs]
        for path in {p for run in self.runs for p in run.params.state_files()}:  # the driver holds them: one host
            check_same_host(path)
        ctx = ray.get_runtime_context() if ray.is_initialized() else None  # None: built by a test, no Ray
        self.actor_id: str = (ctx.get_actor_id() or "") if ctx else ""
        node: str = ctx.get_node_id() if ctx else ""
        self.control = control
        # every call to the driver's RunControl waits at most ray.stall_s (waits.py): a driver that long silent is gone
        self.call_s, self.limit = cfg.ray.stall_s, f"ray.stall_s={cfg.ray.stall_s:g}"
        me = ctx.current_actor if ctx and self.actor_id else None  # so that the driver can end it
        failures = (
            self._ask(control.register.remote(self.actor_id, node, os.getpid(), me), "register") if control else 0
        )
        self.groups = groups or []
        self.claimed = self._claim() if control is not None and self.groups else None  # before anything can fail
        if failures > cfg.ray.replica_failures:
            raise DynragError(f"engine replica {self.actor_id[:8]} is over its failure budget")
        self.begun: set[str] = set()  # keys of the batches begun and not ended (RunControl.begin)
        # a batch's turn waits at most 2 x ray.stall_s without progress: the driver's watchdog names a stuck replica first
        self.turns = Turns(
            lambda: self.replica.progress() if self.replica is not None else 0,
            2 * cfg.ray.stall_s,
            f"2 x ray.stall_s = {2 * cfg.ray.stall_s:g}",
        )
        self.replica: Any = None  # once built
        self.one_call = all_one_call([run["method"] for run in runs])  # what a hosted generator needs to know
        self._ended = threading.Event()
        if control is not None:  # the heartbeat starts now: pulling the index and loading the model take a while
            threading.Thread(target=self._watch, name="dynrag-watch", daemon=True).start()
        try:
            self.replica = self._start(cfg, index_dir, pools, node, make_backends)
        except BaseException as err:
            self._ended.set()
            if control is not None:  # a constructor that fails counts in the replica's failure budget
                try:
                    self._ask(control.start_failed.remote(self.actor_id, node, first_line(err)), "start_failed")
                except WaitExpired as silent:  # the start's own error is the one to raise
                    log.error("%s", silent)
            raise
        if threading.current_thread() is threading.main_thread():  # where Ray runs an actor's constructor
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _start(self, cfg, index_dir, pools, node, make_backends) -> Any:
        """The replica, started: its index (unless a pool serves it), placed per the GPU plan, and its engine."""

        from pipeline.backends import Backends
        from pipeline.runtime.gpu_plan import replica_gpu_plan
        from pipeline.runtime.pools import PoolClient
        from pipeline.runtime.replica import Replica
        from platform_shims.device import own_cuda

        call_s = 2 * cfg.ray.stall_s  # (PoolClient: the driver's watchdog ends a stuck pool call at ray.stall_s)
        remote = {kind: PoolClient(actors, self.control, call_s) for kind, actors in (pools or {}).items()}
        scorer = remote.get("scorer")
        local = None  # this replica's own index, opened once (unless a retrieval pool searches)
        if index_dir and "retrieval" not in remote and own_cuda():
            from pipeline.backends.retrieval import IndexRetriever

            local = IndexRetriever(index_dir, cfg)
        plan = replica_gpu_plan(cfg, local, frozenset(remote))  # None without CUDA; refuses a misfit
        if local is not None:
            local.place(plan.index if plan else None)

        hosted = self._host(cfg, make_backends)  # a tensor-parallel replica's generator, in its group

        def build():
            return (make_backends or Backends)(
                cfg,
                index_dir,
                retriever=remote.get("retrieval") or local,
                scorer=scorer,
                embedder=scorer,
                **({"generator": hosted} if hosted is not None else {}),
            )

        return Replica(
            cfg,
            None,
            None,
            None,
            None,
            {},
            make_backends=build,
            where={
                "pid": os.getpid(),
                "node": node,
                **({"group": hosted.where["group"], "group_node": hosted.where["node"]} if hosted else {"group": None}),
            },
            on_ended=self._on_ended,
            answer_wait_s=2 * cfg.ray.stall_s,  # the driver's watchdog (RunControl.stuck) names a stuck replica first
        ).start()

    def _claim(self) -> int | None:
        """The placement group this tensor-parallel replica uses (RunControl.claim_group): the one Ray started it
        in (GroupDealer), else a free one."""
        import ray

        here = ray.util.get_current_placement_group()
        placed = next((i for i, g in enumerate(self.groups) if here is not None and g.id == here.id), None)
        return self._ask(self.control.claim_group.remote(self.actor_id, len(self.groups), placed), "claim_group")

    def _host(self, cfg: DynragConfig, make_backends: Callable[..., Any] | None) -> Any:
        """A tensor-parallel replica's generator host (ray_host.py), in the placement group this actor claimed;
        None for a replica of one GPU or none (its generator is its own)."""
        if not self.groups:
            return None
        from pipeline.runtime.ray_host import HostedGenerator

        if self.claimed is None:
            raise DynragError(
                f"every one of the {len(self.groups)} replicas' placement groups is held by another actor"
            )
        hosted = HostedGenerator.start(self.groups[self.claimed], cfg, self.one_call, make_backends)
        # its GPUs' node: this actor's where Ray Data started it in its group (GroupDealer), else maybe not; a
        # drain or loss of either is the replica's (RunControl.group_node)
        self._ask(self.control.group_node.remote(self.actor_id, hosted.where["node"]), "group_node")
        return hosted

    def __call__(self, batch: Any) -> dict[str, list]:
        """One Ray Data batch: its rows (ray_questions.py: a batch of one run each; one row per call as the job maps
        them) answered at once, each its own part; a part and a report (JSON) each."""
        from platform_shims.faults import fault_point

        fault_point("ray.engine_batch", until=lambda: self.replica.drain_flag.requested)
        rows = [
            ([Question.from_dict(json.loads(t)) for t in qs], int(skipped), int(run))
            for qs, skipped, run in zip(*batch.select(["qs", "skipped", "run"]).to_pydict().values())
        ]
        if len(rows) == 1:
            ((questions, skipped, run),) = rows
            reports = [self._answer(run, questions, skipped)]
        else:  # several batches in one call (another mapping of the dataset): answered side by side
            import concurrent.futures as cf

            with cf.ThreadPoolExecutor(len(rows), thread_name_prefix="dynrag-runs") as pool:
                futures = [pool.submit(self._answer, run, qs, n) for qs, n, run in rows]
                reports = [f.result() for f in futures]
        return {"part": [r.get("part", "") for r in reports], "report": [json.dumps(r) for r in reports]}

    def _answer(self, run_index: int, questions: list[Question], skipped: int) -> dict:
        from pipeline.io.part_store import batch_key

        ids = [q.id for q in questions]
        run = self.runs[run_index]
        key = f"{run.row_args['run_id']}-{batch_key(ids)}"  # the attempt's key (part_store.attempt_key)
        self.turns.enter()
        try:
            dead = self._begin(key)
            if poison(dead, self.replica.cfg.ray.batch_deaths):
                report = self.replica.give_up(questions, ids, skipped, _poison_cause(dead), run)
            else:
                with self.turns.alone() if dead else self.turns.shared():
                    # its death, if it dies now, is its own; not when the engine failed while it waited for its
                    # turn (answer() then raises at once, and the batch goes to the restarted actor unmarked)
                    if dead and self.control is not None and not self.replica.failed:
                        self.control.alone.remote(key, os.getpid())
                    report = self.replica.answer(questions, ids, skipped, run)
        except Exception as err:
            if self.replica.failed:  # the engine failed: this process exits for a restart, or the driver ends the job
                if self.control is None:
                    raise
                self._park()
            # what answer() raises with a sound engine ends the job with this line, never a park: the store refuses
            # the part after its retries, or the error rows of a batch that failed (Replica._batch_failed) could not
            # be written either
            line = str(err) if isinstance(err, DynragError) else first_line(err)
            report = {"fatal": f"engine replica {self.actor_id[:8]}: {line}"}
        if "fatal" not in report and not self.replica.keeps_batch(report):
            self._park()  # drained part way for its node: the batch goes to the restarted actor
        if self.control is not None:
            self.control.end.remote(key)
            self.begun.discard(key)
        self.turns.leave(returned=key if report.get("part") else None)  # a batch with no rows has none to commit
        return {**report, "run": run_index}

    def _park(self) -> NoReturn:
        """No result for Ray Data: once this process is gone (`_on_ended`), Ray Data sends the batch to the
        restarted actor (its staged attempt never committed)."""
        self.turns.leave()
        threading.Event().wait()
        raise AssertionError("unreachable")

    def _begin(self, key: str) -> list[dict]:
        if self.control is None:
            return []
        self.begun.add(key)
        return self._ask(self.control.begin.remote(key, self.actor_id, os.getpid()), "begin")

    def _ask(self, ref: Any, call: str) -> Any:
        """The answer of `call` to the driver's RunControl, at most ray.stall_s (else WaitExpired, naming it)."""
        return bounded_get(ref, f"RunControl.{call} (the driver's run control)", self.call_s, self.limit)

    def _on_sigterm(self, signum, frame) -> None:
        """SIGTERM to this process (a pre-empted node's processes all get it): drain, then exit (`_on_ended`)."""
        self.replica.drain(self.replica.cfg.answer.drain_s, "SIGTERM")

    def _watch(self) -> None:
        """Ask the driver what to do, every WATCH_S, from the constructor's start until the replica has ended:
        the heartbeat, with its progress; drain when the driver says so."""
        while not self._ended.is_set():
            replica = self.replica
            progress = replica.progress() if replica is not None else 0
            try:
                got = self._ask(
                    self.control.instructions.remote(self.actor_id, progress, self.turns.busy), "instructions"
                )
            except WaitExpired as silent:  # no heartbeat reached the driver: its watchdogs see that; asked again
                log.error("%s", silent)
                continue
            if got is not None and replica is not None and replica.state.value in ("starting", "serving"):
                seconds, why = got
                replica.drain(seconds, why)
            time.sleep(WATCH_S)

    def _on_ended(self, state) -> None:
        """The replica has ended and written what it finished; its process does what the replica says next
        (`Replica.after_end`): exit once its returned batches are committed (drained for its node, or its engine
        failed within the failure budget: Ray restarts the actor and Ray Data re-runs the batches it held), or
        stay (the driver's own drain, or an engine failed past its budget: its batches fail, the job ends)."""
        from pipeline.runtime.replica import Next

        self._ended.set()
        then = self.replica.after_end()
        if self.control is None:
            return
        try:
            if then is Next.RESTART:
                if not self._ask(
                    self.control.engine_failed.remote(self.actor_id, repr(self.replica.error)), "engine_failed"
                ):
                    return
                log.error("engine actor %d: the engine failed, restarting the actor", os.getpid())
            elif then is Next.STAY:
                self.control.drained.remote(self.actor_id)
                return
            else:
                # the batches it leaves were drained, not killed: their next attempt counts no death
                self._ask([self.control.end.remote(key) for key in list(self.begun)], "end")
                self._ask(self.control.drained.remote(self.actor_id), "drained")
                log.warning(
                    "engine actor %d: drained (%s) and written; exiting", os.getpid(), self.replica.drain_flag.why
                )
        except WaitExpired as silent:  # the driver is gone or stuck: this process exits all the same
            log.error("%s", silent)
        threading.Thread(target=self._exit_once_committed, name="dynrag-exit", daemon=True).start()

    def _exit_once_committed(self) -> None:
        """Exit once every call has returned its result (or parked) and the driver has committed the batches
        this process returned (at most COMMIT_WAIT_S): a drained replica's last batches reach the driver,
        instead of being answered again elsewhere. Not Ray's own exit: it waits for the calls still running,
        and those hold batches only partly answered, which Ray Data sends to the restarted actor once this
        process is gone."""
        import ray

        t0 = time.monotonic()
        returned = self.turns.wait_idle(COMMIT_WAIT_S)
        idle_s, deadline, committed = time.monotonic() - t0, time.monotonic() + COMMIT_WAIT_S, not returned
        while self.control is not None and not committed and time.monotonic() < deadline:
            try:
                committed = ray.get(self.control.all_committed.remote(sorted(returned)), timeout=WATCH_S * 5)
            except Exception as err:  # the driver is gone: nothing more to wait for
                log.debug("commit wait: %s", err)
                break
            time.sleep(0.2)
        log.warning(
            "engine actor %d: exits (its calls ended in %.1f s; its %d returned batches %s in %.1f s)",
            os.getpid(),
            idle_s,
            len(returned),
            "committed" if committed else "not all committed",
            time.monotonic() - t0 - idle_s,
        )
        os._exit(1)


def _run(cfg: DynragConfig, run: dict) -> Any:
    """A run as its engine actors answer it (`replica.ServedRun`): its method's program, the parameters the driver
    bound (else the configuration's), a writer of its staged attempts and its row fields."""
    from pipeline.io.output import PartWriter
    from pipeline.methods.registry import get_method
    from pipeline.runtime.replica import ServedRun

    spec = get_method(run["method"])
    params = spec.params(cfg.method.params, cfg) if run.get("params") is None else spec.params(run["params"])
    writer = PartWriter(run["out"], run["row_args"]["run_id"], run.get("header"))
    return ServedRun(spec.program, params, writer, run["row_args"])


def poison(dead: list[dict], batch_deaths: int) -> bool:
    """Whether a batch whose earlier attempts died as `dead` is given up (its questions become error rows): it
    died `batch_deaths` times, once at least while it was alone in its process (`Turns.alone`). A batch only
    held beside one that killed the process is then answered alone, and lives."""
    return len(dead) >= batch_deaths and any(d.get("alone") for d in dead)


class Turns:
    """The batches a replica process answers at once: shared (the default, several at a time) or one alone (a
    batch whose earlier attempt died with its process: run with nothing beside it, so that a death then is its
    own). `returned`: the keys of the batches whose results this process returned."""

    def __init__(
        self, progress: Callable[[], int] | None = None, stall_s: float = 1800.0, limit: str | None = None
    ) -> None:
        """`progress`: the replica's progress count; a batch waiting for its turn while it stays the same for
        `stall_s` ends with WaitExpired (the batches ahead of it are stuck), naming the setting `limit`."""
        self._progress = progress or (lambda: 0)
        self._stall_s = stall_s
        self._limit = limit or f"ray.stall_s={stall_s:g}"
        self._cond = threading.Condition()
        self._sharing = 0  # batches answering, shared
        self._alone = False  # one batch answering alone
        self._queued_alone = 0  # batches waiting to answer alone (shared ones wait behind them)
        self._calls = 0  # calls inside __call__, not parked
        self.returned: set[str] = set()

    def enter(self) -> None:
        with self._cond:
            self._calls += 1

    def leave(self, returned: str | None = None) -> None:
        with self._cond:
            self._calls -= 1
            if returned:
                self.returned.add(returned)
            self._cond.notify_all()

    def _wait_turn(self, ready: Callable[[], bool], turn: str) -> None:
        """Under the condition: wait until `ready()`, for as long as the replica makes progress (at most
        `stall_s` without any), else WaitExpired naming the batches ahead."""
        last, since = self._progress(), time.monotonic()
        while not self._cond.wait_for(ready, timeout=WATCH_S):
            now, seen = time.monotonic(), self._progress()
            if seen != last:
                last, since = seen, now
            elif now - since > self._stall_s:
                ahead = "a batch answering alone" if self._alone else f"{self._sharing} batches answering"
                raise WaitExpired(expired(f"{turn} behind {ahead}", now - since, self._limit, "with no progress"))

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            self._wait_turn(lambda: not self._alone and not self._queued_alone, "a batch's turn to answer")
            self._sharing += 1
        try:
            yield
        finally:
            with self._cond:
                self._sharing -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self._cond:
            self._queued_alone += 1
            try:
                self._wait_turn(lambda: not self._alone and not self._sharing, "a batch's turn to answer alone")
            finally:
                self._queued_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        return self._calls > 0

    def wait_idle(self, timeout: float) -> set[str]:
        """Wait (at most `timeout`) until no call is inside `__call__`; the keys returned."""
        with self._cond:
            self._cond.wait_for(lambda: self._calls <= 0, timeout)
            return set(self.returned)


def _poison_cause(dead: list[dict]) -> str:
    last = dead[-1]
    return (
        f"this batch's replica process died {len(dead)} times while answering it (last pid {last['pid']} on node "
        f"{str(last['node'])[:8]}): not retried again"
    )


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


@dataclass(frozen=True)
class RayRun:
    """One run of a Ray answer job: where its rows go and what they are answered with."""

    out: str
    method: str
    row_args: dict
    header: dict[str, str] | None
    done: Container[str]  # the ids answered under the output (IdSet)
    params: dict | None = None  # the method's parameters bound to the run (MethodParams.for_output)

    def for_actor(self) -> dict:
        return {
            "out": _for_workers(self.out),
            "method": self.method,
            "row_args": self.row_args,
            "header": self.header,
            "params": self.params,
        }


def answer_with_ray(
    dataset: str,
    out: str,
    cfg: DynragConfig,
    index_dir: str | None,
    row_args: dict,
    *,
    header: dict[str, str] | None,
    done: Container[str],
    limit: int | None,
    drain: Drain | None = None,
    make_backends: Callable[..., Any] | None = None,
    params: dict | None = None,
) -> Generator[dict[str, Any], None, None]:
    """One run's batches (`answer_runs_with_ray`): each report, told committed once the caller asks for the next."""
    run = RayRun(out, cfg.method.name, row_args, header, done, params)
    reports = answer_runs_with_ray(
        dataset, cfg, index_dir, [run], limit=limit, drain=drain, make_backends=make_backends
    )
    with contextlib.closing(reports):
        for _, report, committed in reports:
            yield report
            committed()


def answer_runs_with_ray(
    dataset: str,
    cfg: DynragConfig,
    index_dir: str | None,
    runs: list[RayRun],
    *,
    limit: int | None,
    drain: Drain | None = None,
    make_backends: Callable[..., Any] | None = None,
    settle: Callable[[], None] | None = None,
) -> Generator[tuple[int, dict[str, Any], Callable[[], None]], None, None]:
    """Answer the pending questions of `dataset` for each of `runs` (an experiment's runs at once, through one
    set of engine actors) into parts under each run's output; yield (run index, report, committed) for each
    batch as it comes: `committed()`, once the caller has committed the report's attempt, tells the replicas
    (a drained one waits for its returned batches to be committed before it exits).

    `drain` (set by SIGTERM) is passed on to the engine actors (through `RunControl`): they admit no more
    questions, finish those in flight within `answer.drain_s`, write them and say so; once every replica
    has, the driver stops feeding. `make_backends` replaces `Backends` in the engine and pool actors (the
    latency-model bench). `settle`, at the stream's end, returns once the caller has committed what it was given
    (callers that commit on threads of their own); a `committed()` after the job's end tells no one."""
    import ray

    from pipeline.backends.orphan_guard import OrphanGuard
    from pipeline.runtime.pools import pool_stats, start_pool
    from pipeline.runtime.ray_control import RunControl
    from pipeline.runtime.ray_logs import route_ray_worker_output
    from pipeline.runtime.ray_questions import question_dataset
    from pipeline.runtime.ray_resources import (
        GroupDealer,
        cluster_gpu_nodes,
        engine_actor_options,
        places_actors_in_groups,
        replica_gpus,
        replica_groups,
    )
    from pipeline.runtime.replica import batches_held
    from platform_shims.raytools import init_ray, ray_address, shutdown_ray

    local = not ray.is_initialized() and ray_address(cfg.runtime.ray_address, os.environ) == "local"
    guard = OrphanGuard() if local else None  # a local Ray's processes die with this job, even by SIGKILL
    started = init_ray(cfg.runtime.ray_address, cfg.ray.num_cpus, log_to_driver=True)
    # an engine actor whose constructor fails (an index pull cut by a pre-emption) is replaced by Ray Data up to
    # ray.replica_failures times in a row (its default, 0, ended the job at the first)
    ray.data.DataContext.get_current().max_consecutive_actor_init_deaths = cfg.ray.replica_failures
    if started:
        ray.data.DataContext.get_current().enable_progress_bars = False
        route_ray_worker_output()  # workers' library output to the run's log file, their dynrag lines shown
    if drain is not None:
        from pipeline.runtime.signals import sigterm_drains

        sigterm_drains(drain)  # Ray's own SIGTERM handler exits at once
    pools: dict[str, list] = {}
    groups: list = []  # the tensor-parallel replicas' placement groups (claimed by their engine actors)
    control, supervisor, teller = None, None, None
    try:
        gpus = replica_gpus(cfg, *cluster_gpu_nodes())  # replicas that cannot fit stop the job here
        placed = places_actors_in_groups()
        groups.extend(replica_groups(cfg, gpus, placed))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        control = (  # lives (and goes) with the driver
            ray.remote(RunControl)
            .options(num_cpus=0, scheduling_strategy=here)
            .remote(cfg.ray.replica_failures, cfg.ray.batch_deaths)
        )
        if cfg.ray.retrieval_actors and index_dir:
            pools["retrieval"] = start_pool(cfg, "retrieval", _for_workers(index_dir), make_backends, control)
        if cfg.ray.scorer_actors:
            pools["scorer"] = start_pool(cfg, "scorer", None, make_backends, control)
        supervisor = Supervisor(cfg, control, drain, groups)
        teller = CommitTeller(control)
        batch = cfg.ray.batch_questions or cfg.answer.batch_questions
        ds = question_dataset(_for_workers(dataset), cfg, [run.done for run in runs], limit, batch)
        calls = batches_held(cfg, batch)
        with warnings.catch_warnings():  # its deprecation is known: places_actors_in_groups
            warnings.filterwarnings("ignore", message=".*ray_remote_args_fn.* is deprecated")
            ds = ds.map_batches(
                EngineActor,
                fn_constructor_args=(
                    cfg.model_dump(mode="json"),
                    _for_workers(index_dir),
                    [run.for_actor() for run in runs],
                    pools,
                    control,
                    make_backends,
                    groups,
                ),
                batch_size=1,  # a row is a batch of questions (ray_questions.py): one call, one batch
                batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(
                    size=cfg.ray.actors,
                    max_concurrent_calls_per_actor=calls,  # each call in its own thread: the actor takes the next
                    enable_true_multi_threading=calls > 1,  # batch while the previous one's questions finish
                    max_tasks_in_flight_per_actor=calls + 1,
                ),
                **engine_actor_options(
                    cfg, gpus, GroupDealer(control, groups, *_DRIVER_CALL) if groups and placed else None
                ),
            )
        stream = ds.iter_batches(batch_size=None, batch_format="numpy")
        try:
            for got in supervisor.watching(stream):
                for part, text in zip(got["part"], got["report"]):
                    report = json.loads(text)
                    if "fatal" in report:
                        raise DynragError(report["fatal"])
                    yield report.pop("run"), report, functools.partial(teller.tell, part)
                if drain is not None and drain.requested and _drained(control) >= cfg.ray.actors:
                    log.warning("drain: every engine actor has drained; the rest of the questions are left for a rerun")
                    break
        except ray.exceptions.RayError as err:  # Ray Data's own end of the job: a replica that could not start
            try:
                started_not = bounded_get(control.start_failure.remote(), *_DRIVER_CALL)
            except WaitExpired as silent:  # Ray Data's error stands
                log.error("%s", silent)
                raise err from None
            if started_not:
                raise DynragError(started_not) from err
            raise
        for kind, actors in pools.items():  # the pools' share of the work, before they go
            log.info("%s pool served (op: [calls, items]): %s", kind, pool_stats(actors))
        log.info("ray data blocks: %s", json.dumps(blocks_produced(ds.stats())))
    finally:
        if teller is not None:
            if sys.exc_info()[0] is None and settle is not None:
                settle()  # an experiment's runs: the batches handed to them committed first (runners.RayRuns)
            teller.close()
        # every actor the job made goes with it (on an error too: the engine actors Ray Data would leave
        # waiting, and with them the stream the supervisor's reader thread is blocked on)
        for actor in [a for actors in pools.values() for a in actors] + _replica_handles(control):
            try:
                ray.kill(actor, no_restart=True)
            except Exception as err:  # gone already
                log.debug("kill: %s", err)
        if supervisor is not None:
            supervisor.stop()
        if control is not None:
            ray.kill(control)
        _remove_groups(groups)
        if started:  # in the background, joined once the caller's last merge is done (answer.py); the guard
            shutdown_ray(wait=False, then=guard.close if guard is not None else None)  # kept until Ray is down
        elif guard is not None:
            guard.close()


def blocks_produced(stats: str) -> dict[str, int]:
    """Blocks each operator of a Ray Data dataset produced, read off its `stats()` (one block a batch here,
    ray_questions.py: a job's blocks grow with its batches, never with its questions)."""
    import re

    found = re.findall(r"^Operator \d+ (.+?): \d+ tasks executed, (\d+) blocks produced", stats, re.MULTILINE)
    return {name: int(n) for name, n in found}


# a driver's call to RunControl outside the supervisor: as long as the supervisor lets its own calls fail before it
# ends the job (CALL_FAILURES x CALL_TIMEOUT_S)
_DRIVER_CALL = (
    "RunControl (the driver's run control)",
    CALL_FAILURES * CALL_TIMEOUT_S,
    f"CALL_FAILURES x CALL_TIMEOUT_S = {CALL_FAILURES * CALL_TIMEOUT_S:g}",
)


def _drained(control: Any) -> int:
    """How many engine actors have drained (RunControl.drained_count), at most _DRIVER_CALL's limit."""
    return bounded_get(control.drained_count.remote(), *_DRIVER_CALL)


class CommitTeller:
    """Tells the replicas (through RunControl) that the driver has committed a batch, until the job's end: once
    `close`d (before its actors go and Ray shuts down), a commit is not told (the replicas are gone), so that no
    run's thread calls into Ray after the shutdown (an experiment's runs commit on threads of their own)."""

    def __init__(self, control: Any):
        self.control, self.closed, self._lock = control, False, threading.Lock()

    def tell(self, part: str) -> None:
        """The batch of staged attempt `part` ("": no rows) is committed."""
        from pipeline.io.part_store import attempt_key

        with self._lock:
            if part and not self.closed:
                self.control.committed.remote(attempt_key(part))

    def close(self) -> None:
        with self._lock:
            self.closed = True


def _replica_handles(control: Any) -> list:
    import ray

    try:
        return ray.get(control.handles.remote(), timeout=30) if control is not None else []
    except Exception as err:  # the control actor is gone: Ray ends the job's actors with the driver
        log.debug("replica handles: %s", err)
        return []


class Supervisor:
    """The driver's one watcher thread, every SUPERVISE_S: passes the driver's drain (its SIGTERM) and the
    nodes Ray is draining to `RunControl`, and ends the job with one line (`watching` raises it) when a
    replica is over its failure budget, when no replica has run for `ray.replica_wait_s` (its GPUs never came
    back, or its placement group cannot be placed: the line names what it asks for), when the driver's
    drain has not ended the stream by its deadline and a grace period, or when its own looks keep failing
    (CALL_FAILURES in a row: a job must not go on unwatched). When the cluster goes away under a job, the
    stream's own error reaches the driver first (within a turn), and the driver stops this thread."""

    def __init__(self, cfg: DynragConfig, control: Any, drain: Drain | None, groups: list):
        self.cfg, self.control, self.drain, self.groups = cfg, control, drain, groups
        self.line: str | None = None
        self.reader: threading.Thread | None = None  # reads the stream (`watching`)
        self._drained_at: float | None = None  # when this thread saw the driver's drain (monotonic)
        self._asked = False  # whether RunControl was asked to drain the replicas
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dynrag-supervisor", daemon=True)
        self._thread.start()

    def watching(self, stream):
        """`stream`'s items, ended by the supervisor's line (a DynragError) when it has one. The stream is read
        on a thread of its own: it blocks while no replica runs, and the line must end the job even then."""
        import queue

        items: queue.Queue = queue.Queue(maxsize=1)
        end = object()

        def hand(got: tuple) -> bool:
            """Hand `got` to the driver's thread, waiting while it has not taken the last one; False once the
            driver has stopped watching (a drain, a fatal report: it reads no more, and this thread must end)."""
            while not self._done.is_set():
                try:
                    items.put(got, timeout=SUPERVISE_S)
                    return True
                except queue.Full:
                    continue
            return False

        def read() -> None:
            try:
                for item in stream:
                    if not hand((item, None)):
                        return  # nothing more is read from Ray: the thread ends before Ray's shutdown
                hand((end, None))
            except BaseException as err:  # the stream's own error, raised on the driver's thread
                hand((end, err))

        self.reader = threading.Thread(target=read, name="dynrag-stream", daemon=True)
        self.reader.start()
        while True:
            try:
                item, err = items.get(timeout=SUPERVISE_S)
            except queue.Empty:
                item, err = None, None
            if self.line:
                raise DynragError(self.line)
            if err is not None:
                raise err
            if item is end:
                return
            if item is not None:
                yield item

    def stop(self) -> None:
        """Stop watching; wait for this thread and the stream's reader to end (its actors are gone by now): a
        thread still in a Ray call when the driver's Ray shuts down ends the whole process."""
        self._done.set()
        self._thread.join(SUPERVISE_S + CALL_TIMEOUT_S)
        if self.reader is not None:
            self.reader.join(READER_JOIN_S if self.line is None else 5.0)
            if self.reader.is_alive():  # blocked on actors that never started (the job's line said so)
                from platform_shims.compat import no_implicit_ray_init

                no_implicit_ray_init()  # its next call into Ray fails instead of starting a Ray of its own

    def _run(self) -> None:
        """Every SUPERVISE_S: a look at the job (`_look`), then the drain's deadline, whatever the look did. A look
        that fails (a call to RunControl that times out, a node table Ray cannot give) is let go CALL_FAILURES - 1
        times in a row; the next one ends the job with one line."""
        t0, failures = time.time(), 0
        while not self._done.wait(SUPERVISE_S):
            line = None
            if self.drain is not None and self.drain.requested and self._drained_at is None:
                self._drained_at = time.monotonic()  # the deadline runs from here, whether or not RunControl hears
            try:
                line = self._look(t0)
                failures = 0
            except Exception as err:
                failures += 1
                log.warning("supervisor: its look at the job failed (%d in a row): %s", failures, first_line(err))
                if failures >= CALL_FAILURES:
                    line = (
                        f"the driver's supervisor failed {failures} times in a row to ask RunControl about the job "
                        f"(the last: {first_line(err)}): no watchdog can run; stopping"
                    )
            line = line or self._drain_overdue()
            if line:
                self.line = line
                log.error("%s", line)
                return

    def _look(self, t0: float) -> str | None:
        """One look at the job: the drain and the nodes passed to RunControl; the job's line, if it must end."""
        import ray

        from platform_shims.compat import draining_nodes

        control = self.control
        if self._drained_at is not None and not self._asked:
            control.request.remote(self.drain.seconds)  # type: ignore[union-attr]
            self._asked = True
        draining = draining_nodes()
        control.set_draining.remote(draining)
        control.set_lost.remote([*draining, *(n["NodeID"] for n in ray.nodes() if not n["Alive"])])
        line = ray.get(control.fatal.remote(), timeout=CALL_TIMEOUT_S)
        if line:
            return line
        seen = ray.get(control.last_seen.remote(), timeout=CALL_TIMEOUT_S)
        line = stalled(seen, t0, time.time(), self.cfg.ray.replica_wait_s)
        if line:
            return line + _asked_for(self.groups, self.cfg)
        return ray.get(control.stuck.remote(time.time(), self.cfg.ray.stall_s), timeout=CALL_TIMEOUT_S)

    def _drain_overdue(self) -> str | None:
        """The job's line when the driver's drain has not ended the stream by its deadline and a grace period."""
        if self._drained_at is None or self.drain is None:
            return None
        limit = self.drain.seconds + DRAIN_GRACE_S
        if time.monotonic() - self._drained_at <= limit:
            return None
        return f"drain: the engine actors did not finish within {limit:.0f} s"


def stalled(last_seen: float | None, started: float, now: float, wait_s: float) -> str | None:
    """The job's line when no engine replica has run (heartbeat) for `wait_s` seconds, else None."""
    since = last_seen if last_seen is not None else started
    if now - since <= wait_s:
        return None
    what = "has started" if last_seen is None else "has been running"
    return f"no engine replica {what} for {now - since:.0f} s (ray.replica_wait_s={wait_s:g}): stopping"


def _asked_for(groups: list, cfg: DynragConfig) -> str:
    """What the replicas ask of the cluster, for the stalled line."""
    from pipeline.runtime.ray_resources import places_actors_in_groups, replica_bundles, tensor_parallel_size

    tp = tensor_parallel_size(cfg)
    if tp > 1 and places_actors_in_groups():
        bundles = replica_bundles(tp, dict(cfg.ray.actor_resources), cfg.ray.actor_num_cpus)
        return f"; each replica asks for a placement group of {bundles} on one node (its actor in the first bundle)"
    if tp > 1:
        bundles = replica_bundles(tp, dict(cfg.ray.actor_resources))
        return f"; each replica asks for {cfg.ray.actor_num_cpus:g} CPU and a placement group of {bundles} on one node"
    extra = "".join(f", {v:g} {k}" for k, v in cfg.ray.actor_resources.items())
    return f"; each replica asks for {cfg.ray.actor_num_cpus:g} CPU, {cfg.ray.actor_num_gpus:g} GPU{extra}"


def _remove_groups(groups: list) -> None:
    from ray.util import remove_placement_group

    for g in list(groups):
        try:
            remove_placement_group(g)
        except Exception as err:  # the cluster is going away: nothing to keep
            log.warning("removing placement group %s failed: %s", g.id.hex(), err)
