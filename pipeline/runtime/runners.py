"""Where an answer job's batches are answered, chosen once: `make_runner(cfg)` is the one place that reads
`runtime.mode` for answering (as vLLM's `EngineCoreClient.make_client` chooses its client once).

- `LocalRunner`: in this process. The driver streams the questions, one `Replica` answers them in batches
  (replica.py), the index and the model are opened here and checked before any row is written.
- `RayRunner`: on a Ray cluster. The questions stream from the dataset through Ray Data to engine actors, each
  a `Replica` (ray_runner.py); the driver reads only the dataset's first record, the index's manifest and the
  model's name, and leaves pulling, loading and searching to the actors on their own nodes.

Both give the driver (answer.py) the same thing: one report per batch naming its staged attempt, which the
driver commits (commit.py), so skips, progress, the ledger and the summary are counted once, for both.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.config import DynragConfig
from pipeline.engine.core import batched
from pipeline.engine.drain import Drain
from pipeline.errors import DynragError

log = logging.getLogger(__name__)

WAIT_LOOK_S = 1.0  # how often a runner's wait for its next report looks whether it can still come
SETTLE_S = 60.0  # the longest an experiment's Ray job waits, at its end, for its runs to commit what they were handed


@dataclass(frozen=True)
class Batches:
    """What a runner needs to answer a run's pending questions."""

    dataset: str
    out: str
    index: str | None
    questions: Any  # the pending questions (LocalRunner); None where the runner reads the dataset itself
    counts: dict  # pending_questions' counts ("skipped")
    cfg: DynragConfig
    spec: Any
    params: Any
    row_args: dict
    header: dict | None
    done: Container[str]  # the ids answered under the output (IdSet)
    limit: int | None


class Runner(Protocol):
    name: str
    in_process: bool  # whether this process answers: it streams the questions and holds the backends

    def generator_on_gpu(self, cfg: DynragConfig) -> bool: ...

    def open_index(self, index: str, cfg: DynragConfig, stack: contextlib.ExitStack) -> tuple[dict, Any]: ...

    def backends(self, cfg: DynragConfig, retriever: Any, generator: Any, stack: contextlib.ExitStack) -> Any: ...

    def check_model(self, cfg: DynragConfig) -> None: ...

    def answer(self, job: Batches, *, backends: Any, drain: Drain, replica: Any = None) -> Iterator[dict]: ...

    def shared(self, outs: list[str], cfg: DynragConfig, backends: Any, drain: Drain) -> Any: ...


class LocalRunner:
    name = "local"
    in_process = True

    def generator_on_gpu(self, cfg: DynragConfig) -> bool:
        from platform_shims.device import cuda_available

        return cuda_available()

    def open_index(self, index: str, cfg: DynragConfig, stack: contextlib.ExitStack) -> tuple[dict, Any]:
        """The index opened once: its manifest and its retriever (closed by `stack`)."""
        from pipeline.backends.retrieval import IndexRetriever

        retriever = IndexRetriever(index, cfg)
        stack.callback(retriever.close)
        return retriever.index.manifest, retriever

    def backends(self, cfg: DynragConfig, retriever: Any, generator: Any, stack: contextlib.ExitStack) -> Any:
        """The run's backends (closed by `stack`), the index placed per the GPU plan and searched once."""
        from pipeline.backends import Backends
        from pipeline.methods.registry import all_one_call
        from pipeline.runtime.gpu_plan import replica_gpu_plan

        one_call = all_one_call([cfg.method.name])
        backends = Backends(cfg, retriever=retriever, generator=generator, one_call=one_call)
        stack.callback(backends.close)
        plan = replica_gpu_plan(cfg, retriever)  # None without CUDA; refuses a plan that does not fit
        if retriever is not None:
            retriever.place(plan.index if plan else None)
            retriever.search(["preflight"], 1, cfg.retrieval.retriever)
        return backends

    def check_model(self, cfg: DynragConfig) -> None:
        from pipeline.assets.models import resolve_model

        resolve_model(cfg.generation.model, cfg.paths.cache_dir)

    def answer(self, job: Batches, *, backends: Any, drain: Drain, replica: Any = None) -> Iterator[dict]:
        """Answer `job.questions` through one Replica (replica.py) in batches of `answer.batch_questions`, holding
        as many at once as a Ray engine actor does (`batches_held`), each staged as one attempt; yields each
        batch's report as it is written. `backends` stay open (their owner closes them); the generation model
        is loaded first (one error, not one per row). `replica`: a started Replica serving other runs too
        (an experiment's), which answers this run's batches and stays open."""
        import concurrent.futures as cf
        import functools

        from pipeline.io.output import PartWriter, batch_report
        from pipeline.runtime.replica import Replica, ServedRun, batches_held

        cfg, counts, size = job.cfg, job.counts, job.cfg.answer.batch_questions
        writer = PartWriter(job.out, job.row_args["run_id"], job.header)
        own = replica is None
        replica = replica or Replica(cfg, job.spec, job.params, backends, writer, job.row_args, drain=drain).start()
        answer = functools.partial(replica.answer, run=ServedRun(job.spec.program, job.params, writer, job.row_args))
        held = batches_held(cfg, size)
        pool = cf.ThreadPoolExecutor(held, thread_name_prefix="dynrag-batch")
        reported = 0  # questions skipped as answered, reported so far
        try:
            batches, pending = batched(job.questions, size), set[cf.Future]()
            while True:
                while len(pending) < held and not drain.requested:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    pending.add(pool.submit(answer, batch))
                if not pending:
                    break
                # each batch's own wait is bounded (Replica._outcomes: ray.stall_s without progress ends it), so
                # this loop ends; it looks every second
                done, pending = cf.wait(pending, timeout=WAIT_LOOK_S, return_when=cf.FIRST_COMPLETED)
                failed = [f for f in done if f.exception(timeout=0) is not None]  # (done: no wait)
                for future in done - set(failed):  # the batches written are committed before a failure ends the run
                    report = future.result(timeout=0)
                    report["skipped"], reported = counts["skipped"] - reported, counts["skipped"]
                    yield report
                if failed:
                    failed[0].result(timeout=0)
            if counts.get("skipped", 0) > reported:
                yield batch_report([], counts["skipped"] - reported, {})
        finally:
            if own:  # (a shared replica's batches in flight finish and are written; its owner closes it)
                replica.close()  # on an interrupt, the batches in flight end with what finished
            pool.shutdown(wait=True, cancel_futures=True)

    def shared(self, outs: list[str], cfg: DynragConfig, backends: Any, drain: Drain) -> Any:
        """What an experiment's runs (into `outs`, in their order) share: one started Replica over `backends` (one
        engine and admission queue for every run's questions, admitted in the runs' order: Feed)."""
        from pipeline.runtime.replica import Replica

        replica = Replica(cfg, None, None, backends, None, {}, drain=drain).start()
        replica.inbox.expect(outs)
        return replica


class RayRunner:
    name = "ray"
    in_process = False

    def generator_on_gpu(self, cfg: DynragConfig) -> bool:
        """On the engine replicas: a GPU when they ask for one (so a GPU config that ray.gpu_fallback runs on CPU
        keeps bfloat16: give such a run an explicit dtype, as cluster/dynrag-local.yaml does)."""
        from pipeline.runtime.ray_resources import replica_gpu_request

        return replica_gpu_request(cfg) > 0

    def open_index(self, index: str, cfg: DynragConfig, stack: contextlib.ExitStack) -> tuple[dict, Any]:
        """The manifest only (and, for a local folder, its files' sizes under index.verify=size): nothing of the
        index is pulled onto the driver, often a head node with no disk to spare."""
        from indexing.versions.remote import index_manifest

        return index_manifest(index, check_sizes=cfg.index.verify == "size"), None

    def backends(self, cfg: DynragConfig, retriever: Any, generator: Any, stack: contextlib.ExitStack) -> Any:
        return None  # each actor builds its own

    def check_model(self, cfg: DynragConfig) -> None:
        """The name's form only: the replicas resolve (download) it on their own nodes."""
        from pipeline.assets.models import KNOWN_MODELS, ModelNotFound

        name = cfg.generation.model
        if name not in KNOWN_MODELS and not name.startswith((".", "/", "~")) and name.count("/") != 1:
            raise ModelNotFound(f"model {name!r} is not a known model, a folder, nor a hub name of the form org/name")

    def answer(self, job: Batches, *, backends: Any, drain: Drain, replica: Any = None) -> Iterator[dict]:
        """The actors' reports as they come (ray_runner.py). `replica`: a `RayRuns` answering this run beside
        the experiment's other runs, through one set of engine actors."""
        if replica is not None:
            return replica.answer(job)
        from indexing import pin_index
        from pipeline.runtime.ray_runner import answer_with_ray

        return answer_with_ray(
            job.dataset,
            job.out,
            job.cfg,
            pin_index(job.index) if job.index else None,  # one version for every replica, whatever is published
            job.row_args,
            header=job.header,
            done=job.done,
            limit=job.limit,
            params=job.params.model_dump(mode="json"),
            drain=drain,
        )

    def shared(self, outs: list[str], cfg: DynragConfig, backends: Any, drain: Drain) -> RayRuns:
        """What an experiment's runs (into `outs`) share: one set of engine actors (`RayRuns`); `backends` unused."""
        return RayRuns(len(outs), cfg, drain)


class RayRuns:
    """Several runs of one dataset through one set of Ray engine actors (an experiment's runs at once, as the
    in-process runs share one Replica). Each run's driver thread (run_answer) calls `answer(job)`; once every
    run has come (or withdrawn, `withdraw`), one Ray job answers them all (ray_runner.answer_runs_with_ray),
    and each run's reports reach its own thread, which commits them. `drain_flag`: the runs' one drain."""

    def __init__(self, runs: int, cfg: DynragConfig, drain: Drain | None = None):
        self.expected, self.cfg = runs, cfg
        self.drain_flag = drain or Drain(cfg.answer.drain_s)
        self._lock = threading.Lock()
        self._jobs: list[Batches] = []
        self._queues: list[Any] = []
        self._handed: list[int] = []  # per run: reports handed to its thread and not yet committed
        self._gone: list[bool] = []  # per run: its thread has stopped taking reports
        self._settled = threading.Condition()
        self._thread: Any = None  # the one Ray job's thread (`_serve`), once every run has come

    def answer(self, job: Batches) -> Iterator[dict]:
        import queue

        inbox: queue.Queue = queue.Queue()
        with self._lock:
            run = len(self._jobs)
            self._jobs.append(job)
            self._queues.append(inbox)
            self._handed.append(0)
            self._gone.append(False)
            self._start_when_all_came()
        return self._reports(run, inbox)

    def withdraw(self, out: str) -> None:
        """The run into `out` ended; before it came (its checks failed, or it had nothing to answer), the others go
        without it."""
        with self._lock:
            if any(j.out == out for j in self._jobs):
                return  # it came: it ends with the job
            self.expected -= 1
            self._start_when_all_came()

    def close(self) -> None:
        """Nothing to release: the job's actors went with it."""

    def _start_when_all_came(self) -> None:
        if self._jobs and len(self._jobs) == self.expected:
            self._thread = threading.Thread(target=self._serve, name="dynrag-ray-runs", daemon=True)
            self._thread.start()

    def _reports(self, run: int, inbox) -> Iterator[dict]:
        """The run's reports as the Ray job's thread hands them (its own waits are bounded: ray_runner.py), until
        its None; a thread that ended without one (it always sends its last word) ends the run with one line."""
        import queue

        try:
            while True:
                try:
                    item = inbox.get(timeout=WAIT_LOOK_S)
                except queue.Empty:
                    thread = self._thread
                    if thread is not None and not thread.is_alive() and inbox.empty():
                        raise DynragError("the experiment's Ray job ended without a word for this run") from None
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                report, committed = item
                yield report
                committed()  # the caller has committed it: the replicas may count it so
                self._settle_one(run, handed=-1)
        finally:
            with self._settled:
                self._gone[run] = True
                self._settled.notify_all()

    def _settle_one(self, run: int, handed: int) -> None:
        with self._settled:
            self._handed[run] += handed
            self._settled.notify_all()

    def _all_committed(self) -> None:
        """Wait, at most SETTLE_S, until each run's thread has committed what it was handed (or stopped taking
        reports): the job's actors and Ray go only after (answer_runs_with_ray's `settle`)."""
        with self._settled:
            if not self._settled.wait_for(
                lambda: all(gone or not handed for handed, gone in zip(self._handed, self._gone)), SETTLE_S
            ):
                log.warning("the runs have not committed every batch after %.0f s: their actors go now", SETTLE_S)

    def _serve(self) -> None:
        from indexing import pin_index
        from pipeline.runtime.ray_runner import RayRun, answer_runs_with_ray

        first = self._jobs[0]
        runs = [
            RayRun(j.out, j.spec.name, j.row_args, j.header, j.done, j.params.model_dump(mode="json"))
            for j in self._jobs
        ]
        index = pin_index(first.index) if first.index else None  # one version for every replica and run
        try:
            for i, report, committed in answer_runs_with_ray(
                first.dataset,
                first.cfg,
                index,
                runs,
                limit=first.limit,
                drain=self.drain_flag,
                settle=self._all_committed,
            ):
                self._settle_one(i, handed=1)
                self._queues[i].put((report, committed))
        except BaseException as err:  # every run ends with the job's error
            for q in self._queues:
                q.put(err)
        else:
            for q in self._queues:
                q.put(None)


def make_runner(cfg: DynragConfig) -> Runner:
    """The runner of `runtime.mode`: the one choice of where a job's batches are answered."""
    return RayRunner() if cfg.runtime.mode == "ray" else LocalRunner()
