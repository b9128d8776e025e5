"""The engines: advance many questions' method programs at once and batch their requests.

A batch of pending requests of one kind becomes ONE backend call per group (one `generate` over every
waiting prompt, one `search` per retriever over every waiting query, ...), and each program gets its
share of the result. `Engine` (lockstep, here) serves one kind per round; `ContinuousEngine`
(continuous.py) serves every kind from its own queue at once. All accounting (calls, tokens, per-stage
time, retrieved documents, latency) happens here, the same for every method and engine. An exception inside one question's program, or a backend failure on one of its
items, becomes that question's `error`; the other questions go on.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar, cast

from pipeline.engine.drain import Drain
from pipeline.engine.requests import (
    WINDOW,
    Answer,
    Batched,
    Call,
    Completion,
    Embed,
    Generate,
    LookAhead,
    Prompt,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
    Score,
)
from pipeline.errors import EngineDead, QuestionError
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)
T = TypeVar("T")

STAGES = ("retrieval", "classification", "generation", "embedding", "attention", "method")  # attention: DRAGIN's pass


@dataclass
class Trace:
    """What one question's program cost and saw."""

    llm_calls: int = 0  # prompts generated
    retrieval_calls: int = 0  # queries searched
    classifier_calls: int = 0  # items scored
    embedding_calls: int = 0  # texts embedded
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those served from the generator's prefix cache
    retrieve_rounds: int = 0
    retrieval_cache_hits: int = 0  # queries answered without a search of their own (the retrieval cache)
    look_ahead_searches: int = 0  # queries its LookAheads sent to be searched before it asked (answer.look_ahead)
    look_ahead_used: int = 0  # of retrieval_calls, those its own look-ahead had searched (not cache hits)
    time: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    retrieved: list[dict[str, Any]] = field(default_factory=list)  # id, title, score, rank, step, path, round
    generations: list[dict[str, Any]] = field(default_factory=list)  # stage, text
    backend_calls: dict[str, int] = field(default_factory=dict)  # Call items by "backend.op"
    window_full: int = 0  # prompts not run because they and their max_tokens did not fit the window (WINDOW)
    started: float | None = None  # perf_counter when the program was started (just before its first request)
    finished: float | None = None  # perf_counter when it returned its answer or failed

    @property
    def latency_s(self) -> float | None:
        """The question's own wall time, first request to answer (waiting in queues included)."""
        return None if self.started is None or self.finished is None else self.finished - self.started


@dataclass
class Outcome:
    question: Question
    answer: Answer | None
    trace: Trace
    error: str | None = None
    error_kind: str | None = None  # "input": the question's own (final); "system": retried by a rerun


@dataclass
class ProgramState:
    """One question's method program as the engine holds it: its generator, trace, pending request and outcome."""

    index: int
    gen: Generator[Request, Any, Any]
    question: Question
    trace: Trace = field(default_factory=Trace)
    pending: Batched | None = None
    answer: Answer | None = None
    error: str | None = None
    error_kind: str | None = None
    kv_tokens: int = 0  # prompt and completion tokens of its latest generate call: the prefix its next round extends
    wrote: tuple[int, int] | None = None  # its latest generate call's completion tokens and max_tokens, until counted
    # prompt tokens its first generate call found in the prefix cache: blocks that other questions' prompts hold (a
    # method's instruction and few-shot head), shared rather than its own (None until that call returns)
    shared_head: int | None = None
    ahead: list[Retrieve] = field(default_factory=list)  # its LookAheads the engine has not started yet
    ahead_keys: set[tuple[str, str]] = field(default_factory=set)  # (retriever, query) its look-aheads searched
    owner: ProgramState | None = (
        None  # set on a look-ahead's search: the program it searches for (it has none of its own)
    )


def _no_program() -> Generator[Request, Any, Any]:
    """The program of a look-ahead's search: it has none to advance."""
    return
    yield


def request_kind(req: Batched) -> str:
    """The request's kind, its class name: Generate, Retrieve, Score, ..."""
    return type(req).__name__


def _pending(st: ProgramState) -> Batched:
    """The request `st` waits on: every state handed to a server has one."""
    return cast(Batched, st.pending)


Delivery = tuple[ProgramState, Any, "BaseException | None"]  # a program, the value sent to it, or the error thrown in
# A method program: started with a question and its parameters, it yields requests and returns its answer
# (an Answer, or a value whose str() is the prediction).
Program = Callable[[Question, Any], Generator[Request, Any, Any]]


class BaseEngine:
    """Steps method programs and serves batches of their requests; subclasses decide when each batch goes.

    `backends` needs: `generate(prompts, samplings, chats) -> list[Completion | Exception]`,
    `search(queries, k, retriever) -> list[list[Hit]]`, `score(items, classifier) -> list[float]`,
    `embed(texts, model) -> ndarray`, `call(backend, op, items) -> list` and `defaults(req) -> (k, retriever)`.
    `clock` times stages and latency (tests pass a fake one).
    """

    def __init__(
        self,
        backends: Any,
        clock: Callable[[], float] = time.perf_counter,
        drain: Drain | None = None,
        scheduling: str = "fcfs",
        look_ahead: bool = False,
    ):
        self.backends = backends
        # LookAheads are searched (answer.look_ahead) where the retrieval cache can keep their hits
        self.look_ahead = look_ahead and getattr(backends, "search_cache", None) is not None
        self.clock = clock
        self.by_program = scheduling == "program"  # answer.scheduling: model calls ranked by program_priority
        self.drain = drain or Drain()  # once requested: admit no more questions; drop those in flight at its deadline
        self.batch_calls: dict[str, int] = defaultdict(int)  # backend calls made, by kind
        self.batch_seconds: dict[str, float] = defaultdict(float)  # time inside them, by kind
        self._stats_lock = threading.Lock()  # batches may be served from several threads
        self._calls_seen: dict[str, int] = {}  # batch_calls at the previous new_calls()

    # ---- public ---------------------------------------------------------------------------
    def run(self, questions: list[Question], program: Program, params: Any) -> list[Outcome]:
        """Every question's outcome, in the order given."""
        return [o for _, o in sorted(self._outcomes(questions, program, params), key=lambda t: t[0])]

    def stream(self, questions: Iterable[Question], program: Program, params: Any) -> Iterator[Outcome]:
        """Outcomes as questions finish (any order); `questions` is consumed lazily."""
        for _, outcome in self._outcomes(questions, program, params):
            fault_point("engine.question_done", until=lambda: self.drain.requested)
            yield outcome

    def stream_batches(
        self, questions: Iterable[Question], program: Program, params: Any, n: int | None
    ) -> Iterator[list[Outcome]]:
        """`stream`'s outcomes in lists of `n` (the last may be shorter), e.g. one output part each."""
        return batched(self.stream(questions, program, params), n)

    def new_calls(self) -> dict[str, int]:
        """Backend calls (by kind) made since the previous `new_calls()`: a batch's share, for its report."""
        with self._stats_lock:
            now = dict(self.batch_calls)
        new = {k: v - self._calls_seen.get(k, 0) for k, v in now.items() if v != self._calls_seen.get(k, 0)}
        self._calls_seen = now
        return new

    def calls_made(self) -> int:
        """Backend calls completed so far, of every kind."""
        with self._stats_lock:
            return sum(self.batch_calls.values())

    def close(self) -> None:
        """Release what the engine holds (its worker threads, if any); the backends stay open."""

    def _outcomes(self, questions: Iterable[Question], program: Program, params: Any) -> Iterator[tuple[int, Outcome]]:
        raise NotImplementedError

    # ---- stepping a program ---------------------------------------------------------------
    def _start(self, i: int, q: Question, program: Program, params: Any) -> ProgramState | Outcome:
        """A started program, advanced to its first request, or the question's outcome when it has none."""
        if q.error:
            return Outcome(q, None, Trace(), q.error, "input")
        try:
            st = ProgramState(i, program(q, params), q)
        except Exception as exc:  # a program that fails before its first yield
            return Outcome(q, None, Trace(), _describe(exc), _error_kind(exc))
        self._advance(st, None)
        return st if st.pending is not None else self._outcome(st)

    def _ended(self, st: ProgramState) -> None:
        """`st`'s program made its last call: under program scheduling, the generator may give back the KV blocks
        it held for the program between calls (answer.kv_pin_s, pipeline/backends/kv_pins.py)."""
        ended = getattr(self.backends, "program_ended", None) if self.by_program else None
        if ended is not None:
            ended(st.index)

    @staticmethod
    def _outcome(st: ProgramState) -> Outcome:
        return Outcome(st.question, st.answer, st.trace, st.error, st.error_kind)

    def _advance(self, st: ProgramState, value: Any, exc: BaseException | None = None) -> None:
        if isinstance(exc, EngineDead):  # not this question's failure: nothing more can be answered
            raise exc
        t0 = self.clock()
        if st.trace.started is None:
            st.trace.started = t0
        st.pending = None
        try:
            req = st.gen.throw(exc) if exc is not None else st.gen.send(value)
            while isinstance(req, LookAhead):  # not waited on: the program goes on at once
                if not isinstance(req.search, Retrieve):
                    raise TypeError(f"a LookAhead holds {type(req.search).__name__}, not a Retrieve")
                if self.look_ahead:
                    st.ahead.append(req.search)
                req = st.gen.send(None)
            if not isinstance(req, (Generate, Retrieve, Score, Embed, Call)):
                raise TypeError(f"a method yielded {type(req).__name__}, not a request")
            if not request_size(req):
                raise ValueError(f"a method yielded an empty {request_kind(req)} request")
            if isinstance(req, Call) and req.stage not in STAGES:
                raise ValueError(f"Call stage {req.stage!r} is not one of {', '.join(STAGES)}")
            st.pending = req
        except StopIteration as stop:
            ans = stop.value
            st.answer = ans if isinstance(ans, Answer) else Answer(prediction="" if ans is None else str(ans))
        except Exception as err:
            st.error, st.error_kind = _describe(err), _error_kind(err)
            st.gen.close()
            log.debug("question %d failed:\n%s", st.index, traceback.format_exc())
        finally:
            t1 = self.clock()
            st.trace.time["method"] += t1 - t0
            if st.pending is None:
                st.trace.finished = t1

    def _cached(self, st: ProgramState) -> dict[str, list] | None:
        """The hits of each query of the search `st` waits on, where the retrieval cache answers it whole (a
        look-ahead's, a repeated query's): served where it is, from these very hits (another lane may evict
        the entries meanwhile), with no backend call to wait for. None otherwise."""
        cache = getattr(self.backends, "search_cache", None)
        if not isinstance(st.pending, Retrieve) or not cache:  # (an empty cache: the retriever may not be built)
            return None
        k, retriever = self.backends.defaults(st.pending)
        scope = self.backends.search_scope()
        hits = {}
        for q in st.pending.queries:
            found = cache.get(scope, retriever, q, k)
            if found is None:
                return None
            hits[q] = found
        return hits

    def _look_aheads(self, st: ProgramState) -> list[ProgramState]:
        """Searches for `st`'s LookAheads not started yet: states with no program (`owner`: `st`), whose
        delivery puts their hits in the retrieval cache and nothing else."""
        out = []
        for req in st.ahead if st.pending is not None else ():  # a finished program will not ask
            retriever = self.backends.defaults(req)[1]
            st.ahead_keys.update((retriever, q) for q in req.queries)
            search = ProgramState(st.index, _no_program(), st.question, pending=req, owner=st)
            search.trace.started = self.clock()
            out.append(search)
        st.ahead.clear()
        return out

    # ---- serving one batch of pending requests of one kind ---------------------------------
    def serve(self, states: list[ProgramState]) -> list[Delivery]:
        """One batched backend call per group of `states` (all pending the same kind), with the accounting;
        returns what to send each program. Does not advance them (the caller does)."""
        return getattr(self, f"_serve_{request_kind(_pending(states[0])).lower()}")(states)

    def _call(self, kind: str, fn: Callable[[], Any], expected: int) -> tuple[Any, float]:
        t0 = self.clock()
        out = fn()
        secs = self.clock() - t0
        with self._stats_lock:
            self.batch_calls[kind] += 1
            self.batch_seconds[kind] += secs
        if len(out) != expected:
            raise RuntimeError(f"the {kind} backend returned {len(out)} results for {expected} inputs")
        return out, secs

    def _serve_generate(self, states: list[ProgramState]) -> list[Delivery]:
        prompts, samplings, chats, owner = generate_prompts(states, self.by_program)
        try:
            outs, dt = self._call("generate", lambda: self.backends.generate(prompts, samplings, chats), len(prompts))
        except Exception as err:
            return self._per_question(states, self._serve_generate, err)
        weights = [(o.prompt_tokens + o.completion_tokens) if not isinstance(o, BaseException) else 0 for o in outs]
        total = sum(weights)  # the batch's time, shared by tokens processed (equally when nothing was generated)
        return self._generated(states, owner, outs, [dt * (w / total if total else 1 / len(outs)) for w in weights])

    @staticmethod
    def _generated(
        states: list[ProgramState], owner: list[ProgramState], outs: list, costs: list[float]
    ) -> list[Delivery]:
        """Account each prompt's output (`costs`: its share of generation time) to its program; what to send each."""
        results: dict[int, list[Any]] = defaultdict(list)
        kv: dict[int, int] = defaultdict(int)
        cached: dict[int, int] = defaultdict(int)
        wrote: dict[int, tuple[int, int]] = {}  # completion tokens and max_tokens of the prompts a model ran
        for st, out, cost in zip(owner, outs, costs):
            st.trace.time["generation"] += cost
            if isinstance(out, Completion) and out.finish_reason == WINDOW:  # not run: the program decides what next
                st.trace.window_full += 1
                results[id(st)].append(out)
                continue
            st.trace.llm_calls += not (isinstance(out, Completion) and out.finish_reason == "none")  # no model ran
            if not isinstance(out, BaseException):
                st.trace.prompt_tokens += out.prompt_tokens
                st.trace.completion_tokens += out.completion_tokens
                st.trace.cached_prompt_tokens += out.cached_prompt_tokens
                kv[id(st)] += out.prompt_tokens + out.completion_tokens
                cached[id(st)] += out.cached_prompt_tokens
                if out.finish_reason != "none":
                    written, asked = wrote.get(id(st), (0, 0))
                    max_tokens = cast(Generate, st.pending).sampling.max_tokens or 0
                    wrote[id(st)] = (written + out.completion_tokens, asked + max_tokens)
                st.trace.generations.append({"stage": cast(Generate, st.pending).stage, "text": out.text})
            results[id(st)].append(out)
        deliveries: list[Delivery] = []
        for st in states:
            st.kv_tokens = kv[id(st)] or st.kv_tokens
            if st.shared_head is None and kv[id(st)]:
                st.shared_head = cached[id(st)]
            st.wrote = wrote.get(id(st), st.wrote)
            res = results[id(st)]
            failed = next((r for r in res if isinstance(r, BaseException)), None)
            deliveries.append((st, None if failed else res, failed))
        return deliveries

    def _serve_retrieve(self, states: list[ProgramState], known: dict[str, list] | None = None) -> list[Delivery]:
        """`known`: hits already taken from the retrieval cache (`_cached`), used as the cache's."""
        groups: dict[str, list[ProgramState]] = defaultdict(list)
        resolved: dict[int, tuple[int, str]] = {}
        for st in states:
            k, retriever = self.backends.defaults(_pending(st))
            resolved[id(st)] = (k, retriever)
            groups[retriever].append(st)
        deliveries: list[Delivery] = []
        for retriever, group in groups.items():
            queries = [q for st in group for q in cast(Retrieve, st.pending).queries]
            kmax = max(resolved[id(st)][0] for st in group)
            try:
                hits, cached, dt = self._search(queries, kmax, retriever, known or {})
            except Exception as err:
                deliveries += self._per_question(group, self._serve_retrieve, err)
                continue
            searched = max(len(cached) - sum(cached), 1)
            pos = 0
            for st in group:
                req = cast(Retrieve, st.pending)
                k = resolved[id(st)][0]
                n = len(req.queries)
                mine = [list(h[:k]) for h in hits[pos : pos + n]]
                unsearched = cached[pos : pos + n]
                ahead = sum(c and (retriever, q) in st.ahead_keys for q, c in zip(req.queries, unsearched))
                pos += n
                tr = st.trace
                tr.retrieve_rounds += 1
                tr.retrieval_calls += n
                tr.look_ahead_used += ahead
                tr.retrieval_cache_hits += sum(unsearched) - ahead
                tr.time["retrieval"] += dt * (n - sum(unsearched)) / searched
                step = req.step or f"retrieve-{tr.retrieve_rounds}"
                at = self.clock() - cast(float, tr.started)  # when, in the question (started: at its first request)
                for qi, ranked in enumerate(mine):
                    for rank, h in enumerate(ranked, 1):
                        tr.retrieved.append(
                            {
                                "id": h.id,
                                "title": h.title,
                                "score": float(h.score),
                                "rank": rank,
                                "step": step,
                                "path": req.path or ("query" if len(req.queries) == 1 else f"query-{qi}"),
                                "round": tr.retrieve_rounds,
                                "at_s": at,
                            }
                        )
                deliveries.append((st, mine, None))
        return deliveries

    def _search(
        self, queries: list[str], k: int, retriever: str, known: dict[str, list]
    ) -> tuple[list, list[bool], float]:
        """Each query's hits (at least `k` where the index holds them), whether each came without a search of its
        own (from `known` or the backends' `search_cache`, or a repeat of a query earlier in this batch), and the
        seconds searching: one batched search over the queries the cache does not hold, each once."""
        cache = getattr(self.backends, "search_cache", None)
        if cache is None:
            hits, dt = self._call("retrieve", partial(self.backends.search, queries, k, retriever), len(queries))
            return hits, [False] * len(queries), dt
        scope = self.backends.search_scope()
        got = [known[q] if q in known else cache.get(scope, retriever, q, k) for q in queries]
        todo = list(dict.fromkeys(q for q, h in zip(queries, got) if h is None))
        fresh, dt = {}, 0.0
        if todo:
            found, dt = self._call("retrieve", partial(self.backends.search, todo, k, retriever), len(todo))
            fresh = dict(zip(todo, found))
            for q, h in fresh.items():
                cache.put(scope, retriever, q, k, h)
        first = set(todo)  # a repeated query is searched for its first occurrence only
        cached = []
        for q, h in zip(queries, got):
            cached.append(h is not None or q not in first)
            first.discard(q)
        return [h if h is not None else fresh[q] for q, h in zip(queries, got)], cached, dt

    def _serve_grouped(
        self,
        states: list[ProgramState],
        key: Callable[[Any], Any],
        items: Callable[[Any], list[Any]],
        kind: Callable[[Any], str],
        fn: Callable[[Any, list[Any]], Any],
        account: Callable[[ProgramState, int, float], None],
    ) -> list[Delivery]:
        """Score, Embed and Call: one backend call per group (same `key`), results split by item counts.
        `key` and `items` take a request of the states' one kind (Score, Embed or Call)."""
        groups: dict[Any, list[ProgramState]] = defaultdict(list)
        for st in states:
            groups[key(_pending(st))].append(st)
        deliveries: list[Delivery] = []
        for gk, group in groups.items():
            flat = [it for st in group for it in items(_pending(st))]
            try:
                results, dt = self._call(kind(gk), partial(fn, gk, flat), len(flat))
            except Exception as err:
                deliveries += self._per_question(group, self.serve, err)
                continue
            pos = 0
            for st in group:
                n = len(items(_pending(st)))
                account(st, n, dt * n / max(len(flat), 1))
                deliveries.append((st, results[pos : pos + n], None))
                pos += n
        return deliveries

    def _serve_score(self, states: list[ProgramState]) -> list[Delivery]:
        def account(st: ProgramState, n: int, secs: float) -> None:
            st.trace.classifier_calls += n
            st.trace.time["classification"] += secs

        return self._serve_grouped(
            states,
            lambda r: r.classifier,
            lambda r: r.items,
            lambda _: "score",
            lambda name, items: [*self.backends.score(items, name)],
            account,
        )

    def _serve_embed(self, states: list[ProgramState]) -> list[Delivery]:
        def account(st: ProgramState, n: int, secs: float) -> None:
            st.trace.embedding_calls += n
            st.trace.time["embedding"] += secs

        return self._serve_grouped(
            states,
            lambda r: r.model,
            lambda r: r.texts,
            lambda _: "embed",
            lambda model, texts: self.backends.embed(texts, model),
            account,
        )

    def _serve_call(self, states: list[ProgramState]) -> list[Delivery]:
        def account(st: ProgramState, n: int, secs: float) -> None:
            req = cast(Call, st.pending)
            name = f"{req.backend}.{req.op}"
            st.trace.backend_calls[name] = st.trace.backend_calls.get(name, 0) + n
            st.trace.time[req.stage] += secs
            if req.stage == "classification":  # a classifier's call (Adaptive-RAG's router), counted as Score's
                st.trace.classifier_calls += n

        return self._serve_grouped(
            states,
            lambda r: (r.backend, r.op),
            lambda r: r.items,
            lambda k: f"{k[0]}.{k[1]}",
            lambda k, items: [*self.backends.call(k[0], k[1], items)],
            account,
        )

    def _per_question(
        self, states: list[ProgramState], serve: Callable[[list[ProgramState]], list[Delivery]], err: BaseException
    ) -> list[Delivery]:
        """A batched call failed: alone, the error is this question's; else retry each question alone (not
        when the backend is dead: `_advance` ends the run with it)."""
        if len(states) == 1 or isinstance(err, EngineDead):
            return [(st, None, err) for st in states]
        log.warning(
            "a batched %s call over %d questions failed (%s); retrying per question",
            request_kind(_pending(states[0])),
            len(states),
            err,
        )
        return [d for st in states for d in serve([st])]


class Engine(BaseEngine):
    """The lockstep engine: questions start together, `batch_questions` at a time (None: all given); each
    round serves every pending request of one kind (the kind with the most waiting items) and waits for it
    before the next round, and the next questions start when the whole batch has finished."""

    def __init__(self, backends: Any, batch_questions: int | None = None, **kw: Any):
        super().__init__(backends, **kw)
        self.batch_questions = batch_questions

    def _outcomes(self, questions: Iterable[Question], program: Program, params: Any) -> Iterator[tuple[int, Outcome]]:
        for wave in self._waves(questions, program, params):
            yield from wave

    def stream_batches(
        self, questions: Iterable[Question], program: Program, params: Any, n: int | None
    ) -> Iterator[list[Outcome]]:
        if n != self.batch_questions:
            return super().stream_batches(questions, program, params, n)
        return ([o for _, o in wave] for wave in self._waves(questions, program, params))  # a wave is a batch

    def _waves(
        self, questions: Iterable[Question], program: Program, params: Any
    ) -> Iterator[Iterator[tuple[int, Outcome]]]:
        """Each batch of `batch_questions`, run in lockstep: its outcomes, as they are decided."""
        for batch in batched(enumerate(questions), self.batch_questions):
            if self.drain.requested:  # no new batch starts (its questions stay unanswered: a rerun answers them)
                return
            yield self._lockstep(batch, program, params)

    def _lockstep(
        self, batch: list[tuple[int, Question]], program: Program, params: Any
    ) -> Iterator[tuple[int, Outcome]]:
        states: list[ProgramState] = []
        for i, q in batch:
            st = self._start(i, q, program, params)
            if isinstance(st, Outcome):
                yield i, st
            else:
                states.append(st)
        while True:
            waiting: dict[str, list[ProgramState]] = defaultdict(list)
            for st in states:
                if st.pending is not None:
                    waiting[request_kind(st.pending)].append(st)
            if not waiting or self.drain.expired():
                break
            kind = max(waiting, key=lambda k: sum(request_size(st.pending) for st in waiting[k]))
            for st, value, exc in self.serve(waiting[kind]):
                self._advance(st, value, exc)
                if st.pending is None:
                    self._ended(st)
        for st in states:
            if st.pending is None:  # else still in flight when a drain ran out: not answered
                yield st.index, self._outcome(st)


def batched(items: Iterable[T], n: int | None) -> Iterator[list[T]]:
    """`items` in lists of `n` in order, the last one shorter (None: one list of them all)."""
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def request_size(req: Batched | None) -> int:
    """How many items the request asks for (prompts, queries, pairs, ...); 0 for none."""
    if req is None:
        return 0
    if isinstance(req, Generate):
        return len(req.prompts)
    if isinstance(req, Retrieve):
        return len(req.queries)
    if isinstance(req, (Score, Call)):
        return len(req.items)
    return len(req.texts)


def program_priority(st: ProgramState) -> int:
    """A model call's rank under answer.scheduling=program (lower is served first): its question's admission
    order. So a question's next round goes before every round of the questions admitted after it, while its
    previous prompt's KV blocks are likely still in the prefix cache (SearchAgent-X's observation: multi-round
    programs re-read their context); and nobody starves, because a rank never changes and every program ends."""
    return st.index


def generate_prompts(
    states: list[ProgramState], by_program: bool = False
) -> tuple[list[Prompt], list[SamplingSpec], list[bool], list[ProgramState]]:
    """The prompts of `states`' Generate requests, flat, with each one's sampling (with `by_program`, carrying its
    program_priority), chat flag and program."""
    prompts: list[Prompt] = []
    samplings: list[SamplingSpec] = []
    chats: list[bool] = []
    owner: list[ProgramState] = []
    for st in states:
        req = cast(Generate, st.pending)
        sampling = replace(req.sampling, priority=program_priority(st)) if by_program else req.sampling
        for p in req.prompts:
            prompts.append(p)
            samplings.append(sampling)
            chats.append(req.chat)
            owner.append(st)
    return prompts, samplings, chats, owner


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _error_kind(err: BaseException) -> str:
    return "input" if isinstance(err, QuestionError) else "system"
