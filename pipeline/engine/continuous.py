"""The continuous engine: no round barrier. Each backend kind has its own queue served by its own worker
thread; programs advance as soon as their own result is back, and new questions are admitted as others
finish (at most `max_in_flight` started and unfinished at once; under program scheduling, only while the
generator's KV cache has room for them: admission.py).

The calling thread is the coordinator: it admits questions, advances programs and queues their requests
by lane (`generate`, `retrieve`, `score`, `embed`, one `call:<backend>` per named backend, so a backend
object is always called from the same thread). A lane whose worker is free sends its queue as one batch
when the batch is full (`caps`, in items), when no batch is in flight anywhere (nothing more can arrive),
or when its oldest request has waited `batch_wait_s` (other lanes' results may bring more). Batches are
served by the same `BaseEngine.serve` as the lockstep engine, with the same accounting. A search the retrieval
cache answers whole (a repeated query, a LookAhead's) is served on the coordinator at once, never queued behind a
search in flight. A LookAhead's search (answer.look_ahead) is queued in the retrieve lane with no program to
advance; it goes after every program's own search, in batches of at most LOOK_AHEAD_BATCH, and is dropped once its
question has ended or the cache holds its hits.

A streaming generator (`pipeline/engine/streaming.py`) has no generate lane: each Generate request's
prompts are submitted as soon as it is made, and the program advances when its last prompt is done, so a
32-token answer never waits for a 128-token pseudo-context that happened to be in the same call.

Questions may come from a `Feed` (a Ray engine actor's batches, put while earlier ones run). A `Drain`
(SIGTERM) stops admission; the run ends when nothing is in flight, or at the drain's deadline.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, cast

from pipeline.config import FORWARD_BATCH, DynragConfig
from pipeline.engine.admission import KV_FILL, KvBudget, call_size
from pipeline.engine.core import (
    BaseEngine,
    Engine,
    Outcome,
    Program,
    ProgramState,
    generate_prompts,
    program_priority,
    request_kind,
    request_size,
)
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Batched, Call, Generate, Question
from pipeline.engine.streaming import collect, resolved

log = logging.getLogger(__name__)


DRAIN_POLL_S = 0.2  # the coordinator's longest wait before it looks at a drain request again
WAKE: tuple[None, list] = (None, [])  # an inbox event with no deliveries: a Feed has more questions
GATHER_S = 2.0  # Feed.expect: the longest the first questions wait for the other sources' (the six runs of a
# table put theirs within 15 ms of the first; a run that ends without putting any is withdrawn at once)
NOTHING_YET = Question("", "")  # what iterating a Feed gives when no question is waiting and it is not closed


class Feed:
    """A replica's inbox (pipeline/runtime/replica.py): questions that arrive while a continuous engine runs,
    and messages for its coordinator (a drain, a stop). Any thread, or a signal handler, may `put` or `send`;
    only the coordinator consumes: `poll` hands it the messages (`on_message`, on its own thread) and
    iterating gives it the questions. `close` when no more will come.

    Questions come out first in, first out. An experiment's shared replica names its runs' output folders as the
    sources to `expect`: no question comes out until every one has put its questions (GATHER_S at most after the
    first put; a run that ends is `withdraw`n), then the runs' questions come run by run in the experiment's order,
    as `--sequential` starts them, whatever order their threads put them in (first in, first out admitted the runs
    in that order, which varied from process to process: a run admitted last found the prompts it shares with
    another evicted, docs/benchmarks.md, issue 62). `in_turn` (answer.admission_order=questions): the sources in
    turn, every run's first question, then every run's second, so that a question's runs share their prompts (the
    standard template over the question's passages) in the prefix cache."""

    def __init__(self, on_message: Callable[[Any], None] | None = None, in_turn: bool = False) -> None:
        self.in_turn = in_turn
        self._sources: dict[Hashable, deque[Question]] = {}  # by source, only those with questions waiting
        self._messages: queue.SimpleQueue = queue.SimpleQueue()  # reentrant: safe from a signal handler
        self._closed = False
        self._lock = threading.Lock()
        self._arrived = threading.Event()  # for `batches`, which waits instead of being woken
        self.on_message = on_message or (lambda message: None)
        self.wake: Callable[[], None] = lambda: None  # set by the engine that reads the feed
        self._rank: dict[Hashable, int] = {}  # the expected sources, in their order
        self._awaited: set[Hashable] = set()  # expected sources that have neither put questions nor withdrawn
        self._taken: dict[Hashable, int] = {}  # questions given out, by source (in_turn's turns)
        self._first_put: float | None = None

    def expect(self, sources: Sequence[Hashable]) -> None:
        """Hold the questions until every one of `sources` has put its own (GATHER_S at most after the first put);
        then give them source by source in this order (in turn, with `in_turn`)."""
        with self._lock:
            self._rank = {src: i for i, src in enumerate(sources)}
            self._awaited = set(sources) - set(self._taken) - set(self._sources)

    def withdraw(self, source: Hashable) -> None:
        """`source` ended (answered, had nothing to answer, or failed): no longer awaited."""
        with self._lock:
            self._awaited.discard(source)
        self.wake()

    def _gathering(self) -> bool:
        """Whether the questions are held for sources still to come (under the lock)."""
        if not self._awaited or self._closed or self._first_put is None:
            return False
        if time.monotonic() - self._first_put < GATHER_S:
            return True
        log.info(
            "feed: %d sources came within %.0f s; the others join later", len(self._rank) - len(self._awaited), GATHER_S
        )
        self._awaited.clear()  # waited long enough: the sources that came go on
        return False

    def put(self, questions: Iterable[Question], source: Hashable = None) -> None:
        with self._lock:
            if not self.in_turn and not self._rank:  # first in, first out: one queue
                source = None
            self._awaited.discard(source)
            self._first_put = self._first_put or time.monotonic()
            got = self._sources.setdefault(source, deque())
            got.extend(questions)
            if not got:
                del self._sources[source]
        self._arrived.set()
        self.wake()

    def send(self, message: Any) -> None:
        self._messages.put(message)
        self._arrived.set()
        self.wake()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._arrived.set()
        self.wake()

    def _take(self) -> Question:
        """The next question (under the lock, some waiting): the first source's by rank (unranked ones after, as
        they came), or in turn: the source given out fewest so far, ties by rank."""
        last = len(self._rank)
        if self.in_turn:
            source = min(self._sources, key=lambda s: (self._taken.get(s, 0), self._rank.get(s, last)))
        else:
            source = min(self._sources, key=lambda s: self._rank.get(s, last))
        items = self._sources[source]
        item = items.popleft()
        self._taken[source] = self._taken.get(source, 0) + 1
        if not items:
            del self._sources[source]
        return item

    def poll(self) -> None:
        """Hand every waiting message to `on_message` (the coordinator's thread: the one consumer)."""
        while True:
            try:
                message = self._messages.get_nowait()
            except queue.Empty:
                return
            self.on_message(message)

    def __iter__(self) -> Iterator[Question]:
        """The questions as they come; NOTHING_YET whenever none is waiting; ends once closed and empty."""
        while True:
            with self._lock:
                if self._gathering():
                    item = NOTHING_YET
                elif self._sources:
                    item = self._take()
                elif self._closed:
                    return
                else:
                    item = NOTHING_YET
            yield item

    def batches(self, size: int) -> Iterator[list[Question]]:
        """The questions in groups of at most `size`, waiting for them (the lockstep engine's loop); ends once
        closed and empty. Messages are polled between groups."""
        while True:
            self.poll()
            with self._lock:
                held = self._gathering()
                group = [] if held else [self._take() for _ in range(min(size, sum(map(len, self._sources.values()))))]
                closed = self._closed
            if group:
                yield group
            elif closed:
                return
            else:
                self._arrived.wait(DRAIN_POLL_S)
                self._arrived.clear()


# queries in a batch of look-aheads (sent only while no program's own search waits): a search asked for meanwhile
# waits for at most this many
LOOK_AHEAD_BATCH = 16
# close() waits this long in all for the lanes' batches in flight (a search, a model call) before it returns
LANE_JOIN_TIMEOUT_S = 60.0


def lane(req: Batched) -> str:
    return f"call:{req.backend}" if isinstance(req, Call) else request_kind(req).lower()


class ContinuousEngine(BaseEngine):
    def __init__(
        self,
        backends: Any,
        *,
        max_in_flight: int = 256,
        batch_wait_s: float = 0.01,
        caps: dict[str, int] | None = None,
        batch_items: int = 256,
        kv_fill: float = KV_FILL,
        **kw: Any,
    ):
        super().__init__(backends, **kw)
        self.max_in_flight, self.batch_wait_s, self.kv_fill = max_in_flight, batch_wait_s, kv_fill
        self.caps, self.batch_items = dict(caps or {}), batch_items  # items per batch, by lane; else batch_items
        self._lanes: dict[str, tuple[queue.Queue, threading.Thread]] = {}  # lane -> its worker's jobs, thread

    def close(self) -> None:
        """Stop the lane workers and wait for each to finish its batch in flight (at most LANE_JOIN_TIMEOUT_S
        in all), so that the backends' owner does not close a backend while a lane is still calling it."""
        lanes, self._lanes = self._lanes, {}
        for jobs, _ in lanes.values():
            jobs.put(None)
        deadline = time.monotonic() + LANE_JOIN_TIMEOUT_S
        for name, (_, thread) in lanes.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("engine lane %s is still busy after %.0f s: closing without it", name, LANE_JOIN_TIMEOUT_S)

    # ---- the coordinator ---------------------------------------------------------------------
    def _outcomes(self, questions: Iterable[Question], program: Program, params: Any) -> Iterator[tuple[int, Outcome]]:
        inbox: queue.Queue = queue.Queue()  # (lane, deliveries) from the workers, for this run only
        waiting: dict[str, deque[tuple[float, ProgramState]]] = {}  # lane -> (queued at, program), oldest first
        busy: dict[str, int] = {}  # lane -> batches (or streamed requests) in flight
        done: list[tuple[int, Outcome]] = []
        todo = iter(enumerate(questions))
        live, more = 0, True
        streamed: list[bool] = []  # whether the generator streams: asked once per run, at its first Generate
        # program scheduling: admission held while the KV cache is full
        budget = KvBudget(self._kv_capacity(), self.kv_fill)
        default_max_tokens = getattr(self.backends, "default_max_tokens", 0)  # a call's max_tokens left None

        def streams() -> bool:
            if not streamed:
                streamed.append(self.backends.streams)
            return streamed[0]

        def settle(st: ProgramState) -> None:
            nonlocal live
            while True:
                for search in self._look_aheads(st):
                    waiting.setdefault(lane(cast(Batched, search.pending)), deque()).append((time.monotonic(), search))
                hits = self._cached(st)
                if hits is None:
                    break
                ((_, value, exc),) = self._serve_retrieve([st], hits)  # from the cache: no queue, no lane
                self._advance(st, value, exc)
            if st.wrote is not None:  # its generate call returned: what it wrote of its max_tokens
                budget.wrote(*st.wrote)
                st.wrote = None
            if st.pending is None:
                live -= 1
                budget.release(st.index)
                self._ended(st)
                done.append((st.index, self._outcome(st)))
            else:
                shared = st.shared_head or 0  # other questions' blocks (a method's head): not counted as its own
                budget.record(st.index, st.kv_tokens - shared)
                if isinstance(st.pending, Generate):
                    prompt, most = call_size(st.pending, default_max_tokens)
                    budget.expect(st.index, (max(prompt - shared, 0), most))
                waiting.setdefault(lane(st.pending), deque()).append((time.monotonic(), st))

        feed = questions if isinstance(questions, Feed) else None
        if feed is not None:  # questions arrive during the run: take what is there, woken by more
            feed.wake = lambda: inbox.put(WAKE)
        while True:
            if feed is not None:
                feed.poll()  # its messages (a drain, a stop) on this thread, before admitting
            while more and live < self.max_in_flight and budget.admits(live) and not self.drain.requested:  # admit
                nxt = next(todo, None)
                if nxt is None:
                    more = False
                    break
                if nxt[1] is NOTHING_YET:
                    break
                started = self._start(*nxt, program, params)
                if isinstance(started, Outcome):
                    done.append((nxt[0], started))
                else:
                    live += 1
                    settle(started)
            wait = self._dispatch(waiting, busy, inbox, streams)
            yield from done
            done.clear()
            if not live and (not more or self.drain.requested):
                return
            if self.drain.expired():  # a drain of 0 s is the run ending on an error: quiet
                say = log.warning if self.drain.seconds else log.debug
                say("drain: %d questions still in flight after %.0f s, not answered", live, self.drain.seconds)
                return
            try:  # a drain comes from a signal handler or another thread: look at it every DRAIN_POLL_S
                events = [inbox.get(timeout=min(wait or DRAIN_POLL_S, DRAIN_POLL_S))]
            except queue.Empty:
                continue  # a partial batch has waited long enough
            while not inbox.empty():
                events.append(inbox.get_nowait())
            for name, deliveries in events:
                if name is None:  # a Feed's wake-up: more questions to admit
                    continue
                busy[name] -= 1
                if not busy[name]:
                    del busy[name]
                for st, value, exc in deliveries:
                    if st.owner is not None:  # a look-ahead searched: its time is its question's (if still open)
                        if st.owner.trace.finished is None:
                            st.owner.trace.time["retrieval"] += st.trace.time["retrieval"]
                        continue
                    self._advance(st, value, exc)
                    settle(st)

    def _moot(self, search: ProgramState) -> bool:
        owner = cast(ProgramState, search.owner)
        return owner.pending is None or self._cached(search) is not None

    def _batch_order(self, item: tuple[float, ProgramState]) -> tuple[bool, int]:
        st = item[1]
        return st.owner is not None, program_priority(st) if self.by_program else 0

    def _kv_capacity(self) -> int | None:
        """The generator's KV cache in tokens, for admission under program scheduling (None: not bounded)."""
        capacity = getattr(self.backends, "kv_capacity", None)
        return capacity() if self.by_program and capacity is not None else None

    def _dispatch(self, waiting: dict, busy: dict, inbox: queue.Queue, streams: Callable[[], bool]) -> float | None:
        """Send every lane's batch that should go; returns how long the coordinator may wait for a result
        before a partial batch is due (None: until a result comes)."""
        now, due = time.monotonic(), None
        for name, items in waiting.items():
            if name == "generate" and items and streams():
                while items:
                    self._stream(items.popleft()[1], inbox)
                    busy[name] = busy.get(name, 0) + 1
            if not items or name in busy:
                continue
            if any(st.owner is not None for _, st in items):  # a look-ahead is moot once its question ended or
                # the cache holds its hits (its question asked first)
                waiting[name] = items = deque(t for t in items if t[1].owner is None or not self._moot(t[1]))
                if not items:
                    continue
            cap = self.caps.get(name, self.batch_items)
            full = sum(request_size(st.pending) for _, st in items) >= cap
            oldest = min(t for t, _ in items) if self.by_program else items[0][0]  # (fcfs: the deque's order)
            left = self.batch_wait_s - (now - oldest)
            if full or not busy or left <= 0:
                # programs' own requests before look-aheads, and (program) the earliest-admitted questions' first
                waiting[name] = items = deque(sorted(items, key=self._batch_order))  # (stable: fcfs keeps its order)
                ahead = items[0][1].owner is not None  # only look-aheads wait: a small batch of them
                room = min(cap, LOOK_AHEAD_BATCH) if ahead else cap
                batch: list[ProgramState] = []
                n = 0
                while (
                    items
                    and (items[0][1].owner is not None) == ahead
                    and (not batch or n + request_size(items[0][1].pending) <= room)
                ):
                    st = items.popleft()[1]
                    batch.append(st)
                    n += request_size(st.pending)
                    if st.owner is not None:
                        st.owner.trace.look_ahead_searches += request_size(st.pending)
                self._worker(name).put((batch, inbox))
                busy[name] = 1
            else:
                due = left if due is None else min(due, left)
        return due

    def _stream(self, st: ProgramState, inbox: queue.Queue) -> None:
        """Submit `st`'s prompts to the streaming generator; its delivery reaches `inbox` when all are done."""
        prompts, samplings, chats, owner = generate_prompts([st], self.by_program)

        def finish(outs: list, costs: list[float]) -> None:
            with self._stats_lock:
                self.batch_calls["generate"] += 1
                self.batch_seconds["generate"] += sum(costs)
            try:
                deliveries = self._generated([st], owner, outs, costs)
            except BaseException as err:  # a bug in accounting: the question fails, the run goes on
                deliveries = [(st, None, err)]
            inbox.put(("generate", deliveries))

        futures = []
        for args in zip(prompts, samplings, chats):
            try:
                futures.append(self.backends.submit(*args))
            except Exception as err:  # the prompt fails, its question with it
                futures.append(resolved(err))
        collect(futures, finish)  # a prompt whose future fails or is cancelled is its question's error

    # ---- workers ---------------------------------------------------------------------------------
    def _worker(self, name: str) -> queue.Queue:
        if name not in self._lanes:
            jobs: queue.Queue = queue.Queue()
            thread = threading.Thread(target=self._serve_lane, args=(name, jobs), name=f"dynrag-{name}", daemon=True)
            thread.start()
            self._lanes[name] = (jobs, thread)
        return self._lanes[name][0]

    def _serve_lane(self, name: str, jobs: queue.Queue) -> None:
        while (job := jobs.get()) is not None:
            states, inbox = job
            try:
                deliveries = self.serve(states)
            except BaseException as err:  # a bug in serving: the batch's questions fail, the run goes on
                deliveries = [(st, None, err) for st in states]
            inbox.put((name, deliveries))


def generate_cap(cfg: DynragConfig) -> int:
    """Prompts per generate call of the continuous engine: `generation.batch_size` where set; else a transformers
    generator's forward batch, and for vLLM every prompt waiting up to `answer.max_in_flight`: vLLM schedules its
    own running batch, and calls of 64 made a second call wait for the longest answer of the first (sr-rag, 100
    questions: 2% slower than one call)."""
    g = cfg.generation
    if g.batch_size is not None:
        return g.batch_size
    return cfg.answer.max_in_flight if g.backend == "vllm" else FORWARD_BATCH


def make_engine(cfg: DynragConfig, backends: Any, drain: Drain | None = None) -> BaseEngine:
    """The engine `answer.engine` names, configured from `cfg` (a DynragConfig), stopping on `drain`."""
    a = cfg.answer
    if a.engine == "lockstep":
        return Engine(backends, batch_questions=a.batch_questions, drain=drain, scheduling=a.scheduling)
    return ContinuousEngine(
        backends,
        scheduling=a.scheduling,
        look_ahead=a.look_ahead,
        max_in_flight=a.max_in_flight,
        batch_wait_s=a.batch_wait_s,
        caps={"generate": generate_cap(cfg)},
        batch_items=a.batch_items,
        kv_fill=a.kv_fill,
        drain=drain,
    )
