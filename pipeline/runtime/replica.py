"""One engine replica and its lifecycle, the same in-process and in a Ray engine actor (no Ray here).

A replica holds the backends, one engine and the writer of its parts. Its states:

    STARTING -> SERVING -> DRAINING -> CLOSED        (or FAILED from STARTING or SERVING)

It has one inbox (`Feed`: batches' questions, and the messages drain and stop) and one loop thread, the
engine's coordinator, which is the inbox's only consumer. A drain (SIGTERM, the node's drain notice, the
driver's request) is a message: no question is admitted after it, those in flight finish within its
deadline. An engine that cannot go on (vLLM's engine core died: EngineDead) ends the loop: FAILED. The
loop's one `finally` shuts the replica down: every waiting batch gets what finished of it, the engine's
lanes are joined, the backends the replica built are closed.

`answer(questions)` is the one path from a batch to its report, used by both runners: the questions go into
the inbox, the call waits for their outcomes, makes the rows, writes them as one part and returns the
batch's report. Calls run concurrently (several batches in the engine at once, so that a batch's slow
questions never leave it idle); each call's part holds its own batch.

    replica = Replica(cfg, spec, params, backends, writer, row_args).start()
    report = replica.answer(questions)          # from any number of threads
    replica.drain(30.0, "SIGTERM")              # from any thread, or a signal handler
    replica.close()

One replica may serve several runs at once (an experiment's runs, `run_methods`): each `answer` call names its
`ServedRun` (program, parameters, writer, row fields), its questions enter the one inbox tagged with it, and the engine
starts each question's program from its run, so one admission queue and one engine serve every run.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.engine.continuous import ContinuousEngine, Feed, make_engine
from pipeline.engine.drain import CLOSING, Drain
from pipeline.engine.requests import Question
from pipeline.errors import DynragError, first_line
from pipeline.io.output import batch_report, make_row
from pipeline.io.part_store import PartWriteError
from pipeline.runtime.waits import WaitExpired, until_stalled
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)

CLOSE_JOIN_S = 30.0  # for the loop to end once its inbox is closed


class State(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    CLOSED = "closed"
    FAILED = "failed"


ENDED = (State.CLOSED, State.FAILED)


class Next(enum.Enum):
    """What the process holding an ended replica does (`Replica.after_end`)."""

    STAY = "stay"
    EXIT = "exit"
    RESTART = "restart"


@dataclass(frozen=True)
class ServedRun:
    """A run as a replica serves it: what its questions are answered with and written by (its method program
    and parameters, the writer of its parts, the fields of its rows: make_row's keyword arguments)."""

    program: Callable[..., Any]
    params: Any
    writer: Any
    row_args: dict


class Replica:
    """See the module docstring. `backends`: a Backends, kept open (its owner closes it); else
    `make_backends()` builds one at `start` and the replica closes it. `where`: what each report says of where it runs.
    `on_ended(state)`: called once the replica has ended and no call is in flight (its parts are written).
    `answer_wait_s`: how long a batch waits for its answers with no progress of the engine (None: ray.stall_s; a
    Ray engine actor's is twice that, so that the driver's watchdog, which names the replica, speaks first)."""

    def __init__(
        self,
        cfg: Any,
        spec: Any,
        params: Any,
        backends: Any,
        writer: Any,
        row_args: dict,
        *,
        make_backends: Callable[[], Any] | None = None,
        drain: Drain | None = None,
        where: dict | None = None,
        on_ended: Callable[[State], None] | None = None,
        answer_wait_s: float | None = None,
    ):
        self.cfg, self.spec, self.params = cfg, spec, params
        self.answer_wait_s = answer_wait_s if answer_wait_s is not None else cfg.ray.stall_s
        self.backends, self._make_backends = backends, make_backends
        self.writer, self.row_args = writer, row_args
        # the run of `answer` calls that name none (None: a shared replica, whose every call names its run)
        self.run = ServedRun(spec.program, params, writer, row_args) if spec is not None else None
        self.drain_flag = drain or Drain(cfg.answer.drain_s)
        self.where = dict(where or {})
        self.on_ended = on_ended
        self.state = State.STARTING
        self.error: BaseException | None = None
        self.inbox = Feed(self._on_message, in_turn=cfg.answer.admission_order == "questions")
        self.engine: Any = None
        self._lock = threading.Lock()  # the state, the waiting batches, the calls
        self._waiting: dict[int, _Batch] = {}  # id(question) -> its batch
        self._calls = 0  # answer() calls between their start and their part written
        self._ended_told = False
        self._loop: threading.Thread | None = None
        self._first_call: float | None = None
        self._delivered = 0  # outcomes delivered

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Replica:
        """Build the backends (when given a builder) and the engine, load the generation model, start the
        loop: SERVING. A failure here is FAILED and raised."""
        try:
            if self.backends is None:
                self.backends = self._make_backends()  # type: ignore[misc]
            self.engine = make_engine(self.cfg, self.backends, self.drain_flag)
            load_generator(self.backends)
        except BaseException as err:
            self._end(State.FAILED, err)
            self._shutdown()
            raise
        with self._lock:
            if self.state is State.STARTING:  # a drain may have come while it started
                self.state = State.SERVING
        self._loop = threading.Thread(target=self._run, name="dynrag-replica", daemon=True)
        self._loop.start()
        return self

    def drain(self, seconds: float, why: str) -> None:
        """Admit no more questions; finish those in flight within `seconds`. Safe from a signal handler. The
        engine's Drain flag (an Event) is set at once, so a coordinator busy in a long step stops admitting
        as soon as it looks; the message brings the state to DRAINING on the loop's thread."""
        self.drain_flag.request(seconds, why)
        self.inbox.send(("drain", seconds, why))

    def stop(self) -> None:
        """No more batches will come: the loop ends once those in flight are done."""
        self.inbox.close()

    def close(self, timeout: float = CLOSE_JOIN_S) -> None:
        """End now and wait for the loop's shutdown: questions still in flight are left unanswered (the
        batches waiting get what finished); a replica that never started closes its own parts."""
        with self._lock:
            busy = bool(self._waiting)
        if busy:
            self.drain(0.0, CLOSING)
        self.stop()
        if self._loop is not None and self._loop is not threading.current_thread():
            self._loop.join(timeout)
            if self._loop.is_alive():
                log.warning("replica: the loop did not end within %.0f s", timeout)
        elif self._loop is None:
            self._shutdown()

    def withdraw(self, out: str) -> None:
        """A shared replica's run (into `out`) ended, answered or failed: its questions are no longer awaited
        (Feed.expect)."""
        self.inbox.withdraw(out)

    # -- what its process does next ------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        """Its engine failed: every answer() raises that error from now on."""
        return self.state is State.FAILED

    def keeps_batch(self, report: dict) -> bool:
        """Whether the batch `report` answered is returned as it is (else the process holding it exits
        without a result, and the batch goes to the restarted actor): not when a drain for its node left
        part of it unanswered."""
        return bool(report.get("complete")) or not self.drain_flag.for_the_node

    def after_end(self) -> Next:
        """What the process holding this ended replica does: restart (its engine failed: within the failure
        budget, the driver's to say), exit (drained for its node: Ray restarts it elsewhere) or stay."""
        if self.failed:
            return Next.RESTART
        return Next.EXIT if self.drain_flag.for_the_node else Next.STAY

    # -- the one batch path ---------------------------------------------------------------------------
    def answer(
        self,
        questions: list[Question],
        batch_ids: list[str] | None = None,
        skipped: int = 0,
        run: ServedRun | None = None,
    ) -> dict:
        """Answer `questions` with `run` (default: the replica's own), write their rows as one part (keyed by
        `batch_ids`, else the rows' ids) and return the batch's report (`batch_report`, plus "part",
        "complete", "replica", "generator"). "complete" is False when a drain left some of them unanswered
        (they are a rerun's); a FAILED replica raises the error its engine failed with, a store that refuses
        the part its PartWriteError, and an engine that makes no progress for ray.stall_s while the batch waits
        WaitExpired (waits.py). Any other error is this batch's: its questions become error rows with the
        cause (`_batch_failed`)."""
        run = run or self.run
        if run is None:
            raise ValueError("a shared replica's answer() names its run")
        with self._lock:
            self._calls += 1
            self._first_call = self._first_call or time.time()
        try:
            try:
                outcomes = self._outcomes(questions, run) if questions else []
                rows = [make_row(o, **run.row_args) for o in outcomes]
                part = run.writer.write(rows, batch_ids)
                if part:
                    fault_point("ray.part_written", until=lambda: self.drain_flag.requested)
                with self._lock:
                    report = batch_report(rows, skipped, self.engine.new_calls() if self.engine else {})
                report.update(
                    part=part or "",
                    complete=len(outcomes) == len(questions),
                    replica=self.where,
                    generator=self._generator_busy(),
                )
                return report
            except (PartWriteError, WaitExpired):  # the store refuses after its retries, or the engine is stuck:
                raise  # the job's end, with its line
            except Exception as err:
                if self.failed:  # the engine failed: the replica's end (its process restarts), not the batch's
                    raise
                return self._batch_failed(questions, batch_ids, skipped, run, err)
        finally:
            with self._lock:
                self._calls -= 1
            self._tell_if_ended()

    def give_up(
        self,
        questions: list[Question],
        batch_ids: list[str] | None,
        skipped: int,
        cause: str,
        run: ServedRun | None = None,
    ) -> dict:
        """A batch not to answer again (it has killed its replica's process before, or failed in this call:
        `_batch_failed`): its questions written as error rows with `cause` (error_kind "system": a rerun tries
        them again), reported as `answer` does. Error rows that cannot be written either raise a DynragError
        (one line): the job ends."""
        from pipeline.engine.core import Outcome, Trace

        run = run or self.run
        if run is None:
            raise ValueError("a shared replica's give_up() names its run")
        log.error("replica %s: %d questions not answered: %s", self.where.get("pid", ""), len(questions), cause)
        try:
            rows = [make_row(Outcome(q, None, Trace(), cause, "system"), **run.row_args) for q in questions]
            part = run.writer.write(rows, batch_ids)
        except Exception as err:
            raise DynragError(
                f"the error rows of {len(questions)} questions could not be written ({first_line(err)}); "
                f"they were not answered: {cause}"
            ) from err
        report = batch_report(rows, skipped, {})
        report.update(part=part or "", complete=True, replica=self.where, generator=None)
        return report

    def _batch_failed(
        self, questions: list[Question], batch_ids: list[str] | None, skipped: int, run: ServedRun, err: Exception
    ) -> dict:
        """A batch whose rows could not be made, written or reported while its replica is sound (a row that Arrow
        refuses, an error in make_row or in the report): that batch's failure, not the replica's. Its questions
        become error rows with the cause (`give_up`), written and reported as any batch's, and the replica goes
        on with the next batch, in-process and in a Ray engine actor alike."""
        log.debug("replica %s: a batch failed", self.where.get("pid", ""), exc_info=err)
        return self.give_up(
            questions, batch_ids, skipped, f"this batch failed before its rows were written: {first_line(err)}", run
        )

    def _outcomes(self, questions: list[Question], run: ServedRun) -> list:
        got = _Batch(questions, run)
        with self._lock:
            if self.state is State.FAILED:
                raise self.error  # type: ignore[misc]
            if self.state is not State.SERVING:  # drained: these questions are a rerun's
                return []
            self._waiting.update((id(q), got) for q in questions)
        self.inbox.put(questions, source=run.writer.out)  # a run by its output folder (Feed)
        wait_s, stall_s = self.answer_wait_s, self.cfg.ray.stall_s  # no progress: no row, no engine call
        limit = f"ray.stall_s={stall_s:g}" if wait_s == stall_s else f"{wait_s / stall_s:g} x ray.stall_s = {wait_s:g}"
        what = f"the answers of a batch of {len(questions)} questions from this replica's engine"
        return until_stalled(got.future, self.progress, wait_s, what, limit)

    # -- the loop (the inbox's one consumer) ------------------------------------------------------------
    def _run(self) -> None:
        try:
            if isinstance(self.engine, ContinuousEngine):
                for outcome in self.engine.stream(self.inbox, self._program, None):
                    self._deliver([outcome])
            else:  # the lockstep engine: one batch at a time, in the order they came
                for group in self.inbox.batches(self.cfg.answer.batch_questions):
                    if self.drain_flag.requested:
                        break
                    self._deliver(self.engine.run(group, self._program, None))
        except BaseException as err:  # the engine cannot go on (say vLLM's engine core died)
            log.error("replica %s: the engine failed: %r", self.where.get("pid", ""), err)
            self._end(State.FAILED, err)
        else:
            self._end(State.CLOSED)
        finally:
            self._shutdown()
            self._tell_if_ended()

    def _program(self, question: Question, _: Any):
        """The question's program, started from the run its batch was given with (the loop's thread)."""
        with self._lock:
            run = self._waiting[id(question)].run
        return run.program(question, run.params)

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "drain":
            _, seconds, why = message
            with self._lock:
                if self.state in (State.STARTING, State.SERVING):
                    self.state = State.DRAINING
            if seconds:
                log.warning("replica %s: %s, draining (up to %.0f s)", self.where.get("pid", ""), why, seconds)

    def progress(self) -> int:
        """A count that grows with each outcome and each backend call the engine completes (the driver's stall
        watch reads it)."""
        return self._delivered + (self.engine.calls_made() if self.engine is not None else 0)

    def _deliver(self, outcomes: list) -> None:
        with self._lock:
            self._delivered += len(outcomes)
            for o in outcomes:
                self._waiting.pop(id(o.question)).add(o)

    def _end(self, state: State, err: BaseException | None = None) -> None:
        """The loop ended: every batch still waiting gets what finished of it (or the error)."""
        with self._lock:
            if self.state not in ENDED:
                self.state, self.error = state, err
            waiting, self._waiting = set(self._waiting.values()), {}
        for got in waiting:
            if err is not None:
                got.fail(err)
            else:
                got.finish()

    def _shutdown(self) -> None:
        """Join the engine's lanes, then close what this replica built; failures logged, not raised."""
        parts = [self.engine] + ([self.backends] if self._make_backends else [])
        for part in parts:
            if part is None:
                continue
            try:
                part.close()
            except Exception as err:
                log.warning("replica: closing %s failed: %s", type(part).__name__, err)

    def _tell_if_ended(self) -> None:
        with self._lock:
            if self.state not in ENDED or self._calls or self._ended_told:
                return
            self._ended_told = True
        if self.on_ended is not None:
            self.on_ended(self.state)

    def _generator_busy(self) -> dict[str, float] | None:
        """The generator's busy seconds (time with a sequence in flight) and the seconds since this replica's
        first batch: their ratio is its generator busy fraction."""
        flight = getattr(getattr(self.backends, "_generator", None), "flight", None)
        if flight is None or self._first_call is None:
            return None
        return {"busy_s": flight.busy_s, "active_s": time.time() - self._first_call, "pid": self.where.get("pid")}


def batches_held(cfg: Any, batch: int) -> int:
    """Batches a replica holds at once: `ray.actor_batches`, else enough for twice `answer.max_in_flight`
    questions (at least 2); 1 for the lockstep engine. Held beyond what is in flight, a batch's questions
    are admitted as others finish; with only as many as can be in flight, a batch's questions start and
    end together and the generator idles while the next batch retrieves (measured: cfs through Ray,
    generator busy 0.80 with 2 x 256 questions held for 512 in flight, 0.97 with 8 x 128;
    `dynrag bench pipeline --simulate-gpu --runtime ray`)."""
    if cfg.answer.engine != "continuous":
        return 1
    return cfg.ray.actor_batches or max(2, -(-2 * cfg.answer.max_in_flight // batch))


def load_generator(backends) -> None:
    """Load the generation model now: a model that cannot be loaded (missing weights, code it would have
    to run without generation.trust_remote_code, an unsafe pickle) is one error for the job, not one per row."""
    from pipeline.backends import BackendError
    from pipeline.errors import first_line

    try:
        _ = backends.generator  # a property: loads the model
    except Exception as exc:
        detail = first_line(exc)
        if "custom code" in str(exc) or "trust_remote_code" in str(exc):
            detail = (
                f"{type(exc).__name__}: the model folder ships its own code, which runs only with "
                "generation.trust_remote_code=true"
            )
        raise BackendError(f"cannot load the generation model {backends.cfg.generation.model}: {detail}") from exc


class _Batch:
    """One call's questions and their outcomes, collected from the loop thread."""

    def __init__(self, questions: list[Question], run: ServedRun):
        self.run = run
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
