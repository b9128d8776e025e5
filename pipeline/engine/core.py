"""The engine: advances many questions' method programs at once and batches their requests.

Each round, the engine takes every pending request of one kind (the kind with the most waiting
items), makes ONE batched backend call for all of them (one `generate` over every waiting prompt,
one `search` per retriever over every waiting query, ...), and sends each program its share of the
result. All accounting (calls, tokens, per-stage time, retrieved documents) happens here, the same
for every method. An exception inside one question's program, or a backend failure on one of its
items, becomes that question's `error`; the other questions go on.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

from pipeline.engine.requests import Answer, Call, Embed, Generate, Question, Request, Retrieve, Score

log = logging.getLogger(__name__)

STAGES = ("retrieval", "classification", "generation", "embedding", "method")


@dataclass
class Trace:
    """What one question's program cost and saw."""

    llm_calls: int = 0  # prompts generated
    retrieval_calls: int = 0  # queries searched
    classifier_calls: int = 0  # items scored
    embedding_calls: int = 0  # texts embedded
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retrieve_rounds: int = 0
    time: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    retrieved: list[dict[str, Any]] = field(default_factory=list)  # id, title, score, rank, step, path, round
    generations: list[dict[str, Any]] = field(default_factory=list)  # stage, text
    backend_calls: dict[str, int] = field(default_factory=dict)  # Call items by "backend.op"


@dataclass
class Outcome:
    question: Question
    answer: Answer | None
    trace: Trace
    error: str | None = None


@dataclass
class _State:
    index: int
    gen: Generator[Request, Any, Answer]
    trace: Trace = field(default_factory=Trace)
    pending: Request | None = None
    answer: Answer | None = None
    error: str | None = None


def _kind(req: Request) -> str:
    return type(req).__name__


class Engine:
    """Runs method programs over a batch of questions against a `Backends` object.

    `backends` needs: `generate(prompts, samplings, chats) -> list[Completion | Exception]`,
    `search(queries, k, retriever) -> list[list[Hit]]`, `score(items, classifier) -> list[float]`,
    `embed(texts, model) -> ndarray`, `call(backend, op, items) -> list` and `defaults(req) -> (k, retriever)`.
    """

    def __init__(self, backends: Any):
        self.backends = backends
        self.batch_calls: dict[str, int] = defaultdict(int)  # backend calls made, by kind
        self.batch_seconds: dict[str, float] = defaultdict(float)  # time inside them, by kind

    # ---- public ---------------------------------------------------------------------------
    def run(self, questions: list[Question], program: Callable[[Question, Any], Generator], params: Any) -> list[Outcome]:
        states: list[_State] = []
        outcomes: dict[int, Outcome] = {}
        for i, q in enumerate(questions):
            if q.error:
                outcomes[i] = Outcome(q, None, Trace(), q.error)
                continue
            try:
                st = _State(i, program(q, params))
            except Exception as exc:  # a program that fails before its first yield
                outcomes[i] = Outcome(q, None, Trace(), _describe(exc))
                continue
            states.append(st)
            self._advance(st, None)

        while True:
            waiting: dict[str, list[_State]] = defaultdict(list)
            for st in states:
                if st.pending is not None:
                    waiting[_kind(st.pending)].append(st)
            if not waiting:
                break
            kind = max(waiting, key=lambda k: sum(_size(st.pending) for st in waiting[k]))
            getattr(self, f"_do_{kind.lower()}")(waiting[kind])

        for st in states:
            outcomes[st.index] = Outcome(questions[st.index], st.answer, st.trace, st.error)
        return [outcomes[i] for i in range(len(questions))]

    # ---- stepping a program ---------------------------------------------------------------
    def _advance(self, st: _State, value: Any, exc: BaseException | None = None) -> None:
        t0 = time.perf_counter()
        try:
            req = st.gen.throw(exc) if exc is not None else st.gen.send(value)
            if not isinstance(req, (Generate, Retrieve, Score, Embed, Call)):
                raise TypeError(f"a method yielded {type(req).__name__}, not a request")
            if not _size(req):
                raise ValueError(f"a method yielded an empty {_kind(req)} request")
            if isinstance(req, Call) and req.stage not in STAGES:
                raise ValueError(f"Call stage {req.stage!r} is not one of {', '.join(STAGES)}")
            st.pending = req
        except StopIteration as stop:
            st.pending = None
            ans = stop.value
            st.answer = ans if isinstance(ans, Answer) else Answer(prediction="" if ans is None else str(ans))
        except Exception as err:
            st.pending = None
            st.error = _describe(err)
            st.gen.close()
            log.debug("question %d failed:\n%s", st.index, traceback.format_exc())
        finally:
            st.trace.time["method"] += time.perf_counter() - t0

    def _deliver(self, st: _State, value: Any, exc: BaseException | None = None) -> None:
        st.pending = None
        self._advance(st, value, exc)

    def _call(self, kind: str, fn: Callable[[], Any], expected: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = fn()
        secs = time.perf_counter() - t0
        self.batch_calls[kind] += 1
        self.batch_seconds[kind] += secs
        if len(out) != expected:
            raise RuntimeError(f"the {kind} backend returned {len(out)} results for {expected} inputs")
        return out, secs

    # ---- one batched call per kind -----------------------------------------------------------
    def _do_generate(self, states: list[_State]) -> None:
        prompts, samplings, chats, owner = [], [], [], []
        for st in states:
            req: Generate = st.pending
            for p in req.prompts:
                prompts.append(p)
                samplings.append(req.sampling)
                chats.append(req.chat)
                owner.append(st)
        try:
            outs, dt = self._call("generate", lambda: self.backends.generate(prompts, samplings, chats),
                                  len(prompts))
        except Exception as err:
            return self._per_question(states, self._do_generate, err)
        weights = [(o.prompt_tokens + o.completion_tokens) if not isinstance(o, BaseException) else 0 for o in outs]
        total = sum(weights)
        results: dict[int, list] = defaultdict(list)
        for st, out, w in zip(owner, outs, weights):
            # the batch's time, shared by tokens processed (equally when nothing was generated)
            st.trace.time["generation"] += dt * (w / total if total else 1 / len(outs))
            st.trace.llm_calls += 1
            if not isinstance(out, BaseException):
                st.trace.prompt_tokens += out.prompt_tokens
                st.trace.completion_tokens += out.completion_tokens
                st.trace.generations.append({"stage": st.pending.stage, "text": out.text})
            results[id(st)].append(out)
        for st in states:
            res = results[id(st)]
            failed = next((r for r in res if isinstance(r, BaseException)), None)
            self._deliver(st, None if failed else res, failed)

    def _do_retrieve(self, states: list[_State]) -> None:
        groups: dict[str, list[_State]] = defaultdict(list)
        resolved: dict[int, tuple[int, str]] = {}
        for st in states:
            k, retriever = self.backends.defaults(st.pending)
            resolved[id(st)] = (k, retriever)
            groups[retriever].append(st)
        for retriever, group in groups.items():
            queries = [q for st in group for q in st.pending.queries]
            kmax = max(resolved[id(st)][0] for st in group)
            try:
                hits, dt = self._call("retrieve", lambda: self.backends.search(queries, kmax, retriever), len(queries))
            except Exception as err:
                self._per_question(group, self._do_retrieve, err)
                continue
            pos = 0
            for st in group:
                req: Retrieve = st.pending
                k = resolved[id(st)][0]
                mine = [list(h[:k]) for h in hits[pos:pos + len(req.queries)]]
                pos += len(req.queries)
                tr = st.trace
                tr.retrieve_rounds += 1
                tr.retrieval_calls += len(req.queries)
                tr.time["retrieval"] += dt * len(req.queries) / max(len(queries), 1)
                step = req.step or f"retrieve-{tr.retrieve_rounds}"
                for qi, ranked in enumerate(mine):
                    for rank, h in enumerate(ranked, 1):
                        tr.retrieved.append({"id": h.id, "title": h.title, "score": float(h.score), "rank": rank,
                                             "step": step, "path": req.path or ("query" if len(req.queries) == 1 else f"query-{qi}"),
                                             "round": tr.retrieve_rounds})
                self._deliver(st, mine)

    def _do_score(self, states: list[_State]) -> None:
        groups: dict[str, list[_State]] = defaultdict(list)
        for st in states:
            groups[st.pending.classifier].append(st)
        for name, group in groups.items():
            items = [it for st in group for it in st.pending.items]
            try:
                scores, dt = self._call("score", lambda: self.backends.score(items, name), len(items))
            except Exception as err:
                self._per_question(group, self._do_score, err)
                continue
            pos = 0
            for st in group:
                n = len(st.pending.items)
                st.trace.classifier_calls += n
                st.trace.time["classification"] += dt * n / max(len(items), 1)
                mine = list(scores[pos:pos + n])
                pos += n
                self._deliver(st, mine)

    def _do_embed(self, states: list[_State]) -> None:
        groups: dict[str | None, list[_State]] = defaultdict(list)
        for st in states:
            groups[st.pending.model].append(st)
        for model, group in groups.items():
            texts = [t for st in group for t in st.pending.texts]
            try:
                vecs, dt = self._call("embed", lambda: self.backends.embed(texts, model), len(texts))
            except Exception as err:
                self._per_question(group, self._do_embed, err)
                continue
            pos = 0
            for st in group:
                n = len(st.pending.texts)
                st.trace.embedding_calls += n
                st.trace.time["embedding"] += dt * n / max(len(texts), 1)
                mine = vecs[pos:pos + n]
                pos += n
                self._deliver(st, mine)

    def _do_call(self, states: list[_State]) -> None:
        groups: dict[tuple[str, str], list[_State]] = defaultdict(list)
        for st in states:
            groups[(st.pending.backend, st.pending.op)].append(st)
        for (backend, op), group in groups.items():
            items = [it for st in group for it in st.pending.items]
            try:
                results, dt = self._call(f"{backend}.{op}", lambda: self.backends.call(backend, op, items), len(items))
            except Exception as err:
                self._per_question(group, self._do_call, err)
                continue
            pos = 0
            for st in group:
                req: Call = st.pending
                n = len(req.items)
                st.trace.backend_calls[f"{backend}.{op}"] = st.trace.backend_calls.get(f"{backend}.{op}", 0) + n
                st.trace.time[req.stage] += dt * n / max(len(items), 1)
                mine = list(results[pos:pos + n])
                pos += n
                self._deliver(st, mine)

    def _per_question(self, states: list[_State], do: Callable[[list[_State]], None], err: BaseException) -> None:
        """A batched call failed: alone, the error is this question's; else retry each question alone."""
        if len(states) == 1:
            self._deliver(states[0], None, err)
            return
        log.warning("a batched %s call over %d questions failed (%s); retrying per question",
                    _kind(states[0].pending), len(states), err)
        for st in states:
            do([st])


def _size(req: Request | None) -> int:
    if req is None:
        return 0
    if isinstance(req, Generate):
        return len(req.prompts)
    if isinstance(req, Retrieve):
        return len(req.queries)
    if isinstance(req, (Score, Call)):
        return len(req.items)
    return len(req.texts)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"
