"""answer.look_ahead: a search a program announces (LookAhead) runs while its model call does, and its later
Retrieve takes the hits only where the retrieval cache's key matches; outputs are those without it."""

from __future__ import annotations

import json
import threading

import pytest
from engine_fixtures import PASSAGES
from fakes import MemoryRetriever
from test_engine_continuous import _rows

from jobs.bench.rig.simulated import SimBackends, SimGenerator
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.continuous import ContinuousEngine, make_engine
from pipeline.engine.core import Engine
from pipeline.engine.requests import Answer, Generate, LookAhead, Question, Retrieve
from pipeline.engine.search_cache import SearchCache
from pipeline.io.output import make_row
from pipeline.methods.registry import get_method

QUESTIONS = [Question(f"q{i}", text) for i, text in enumerate(["capital of France", "Jaws film", "capital of Italy"])]


class LoggingRetriever(MemoryRetriever):
    """Logs each searched query with its k; `searched` is set at the first search."""

    def __init__(self):
        super().__init__(PASSAGES)
        self.log: list[tuple[str, int]] = []
        self.searched = threading.Event()

    def search(self, queries, k, retriever="bm25"):
        self.log += [(q, k) for q in queries]
        self.searched.set()
        return super().search(queries, k, retriever)


class WaitingGenerator:
    """A batch generator that waits (at most `wait_s`) for a search to have run, and records whether one had."""

    def __init__(self, retriever: LoggingRetriever, wait_s: float):
        self.retriever, self.wait_s, self.saw_search = retriever, wait_s, []
        self.inner = SimGenerator()

    def generate(self, prompts, samplings, chats):
        self.saw_search.append(self.retriever.searched.wait(self.wait_s))
        return self.inner.generate(prompts, samplings, chats)


def ahead_then_ask(ahead_k: int, ask_k: int, ahead_query: str = ""):
    def program(q: Question, params):
        yield LookAhead(Retrieve([ahead_query or q.question], k=ahead_k))
        out = (yield Generate([q.question]))[0]
        hits = (yield Retrieve([q.question], k=ask_k))[0]
        return Answer(" | ".join([out.text, *(h.title for h in hits)]))

    return program


def run(program, *, look_ahead: bool, wait_s: float = 0.0, engine=ContinuousEngine):
    ret = LoggingRetriever()
    gen = WaitingGenerator(ret, wait_s)
    eng = engine(Backends(DynragConfig(), generator=gen, retriever=ret), look_ahead=look_ahead)
    try:
        return eng.run(QUESTIONS, program, None), ret, gen
    finally:
        eng.close()


def test_a_look_ahead_searches_while_the_model_runs_and_its_retrieve_takes_those_hits():
    on, ret_on, gen_on = run(ahead_then_ask(3, 3), look_ahead=True, wait_s=5.0)
    off, ret_off, gen_off = run(ahead_then_ask(3, 3), look_ahead=False, wait_s=0.2)
    assert [o.answer.prediction for o in on] == [o.answer.prediction for o in off]
    assert all(o.error is None for o in on + off)
    assert gen_on.saw_search == [True] and gen_off.saw_search == [False]  # on: the search ran before the model's
    assert sorted(ret_on.log) == sorted(ret_off.log) == sorted((q.question, 3) for q in QUESTIONS)  # each once
    for o in on:
        t = o.trace
        assert (t.look_ahead_searches, t.look_ahead_used, t.retrieval_calls, t.retrieval_cache_hits) == (1, 1, 1, 0)
        assert t.time["retrieval"] > 0  # the search's time is the question's, though it ran ahead
        extra = json.loads(make_row(o, run_id="r", method="m", params_json="{}", chash="h", model="m")["extra"])
        assert extra["look_ahead"] == {"searched": 1, "used": 1}
    assert all((o.trace.look_ahead_searches, o.trace.look_ahead_used) == (0, 0) for o in off)


@pytest.mark.parametrize(
    "ahead_k, ask_k, other_query, used",
    [(5, 2, False, True), (1, 3, False, False), (3, 3, True, False)],
    ids=["more-hits-ahead", "fewer-hits-ahead", "another-query"],
)
def test_a_look_ahead_is_taken_only_where_its_search_matches(ahead_k, ask_k, other_query, used):
    program = ahead_then_ask(ahead_k, ask_k, "Berlin Germany" if other_query else "")
    on, ret, _ = run(program, look_ahead=True)
    off, _, _ = run(program, look_ahead=False)
    assert [o.answer.prediction for o in on] == [o.answer.prediction for o in off]
    assert all(o.trace.look_ahead_used == used for o in on)
    asked = [(q.question, ask_k) for q in QUESTIONS]
    assert all(a in ret.log for a in asked) != used  # not taken: the asked search ran as well


def test_the_lockstep_engine_and_a_run_without_a_retrieval_cache_search_only_what_is_asked():
    _, ret, _ = run(ahead_then_ask(3, 3, "Berlin Germany"), look_ahead=True, engine=Engine)
    assert ("Berlin Germany", 3) not in ret.log
    cfg = DynragConfig()
    cfg.answer.retrieval_cache = 0
    cfg.answer.look_ahead = True
    ret = LoggingRetriever()
    eng = make_engine(cfg, Backends(cfg, generator=WaitingGenerator(ret, 0), retriever=ret))
    try:
        out = eng.run(QUESTIONS, ahead_then_ask(3, 3, "Berlin Germany"), None)
    finally:
        eng.close()
    assert all(o.error is None for o in out) and ("Berlin Germany", 3) not in ret.log


def sim_rows(method: str, params: dict, look_ahead: bool, questions: list[Question]) -> tuple[list, list]:
    cfg = DynragConfig()
    cfg.answer.look_ahead = look_ahead
    spec = get_method(method)
    p = spec.params(params)
    eng = make_engine(cfg, SimBackends(scale=0, kv_tokens=None)(cfg))
    try:
        out = eng.run(questions, lambda q, _: spec.program(q, p), None)
    finally:
        eng.close()
    assert all(o.error is None for o in out), [o.error for o in out if o.error]
    return _rows(out), [o.trace for o in out]


@pytest.mark.parametrize(
    "method, params",
    [
        ("pairs", {"k": 2, "n": 3}),
        ("dpr-ais", {"k": 2, "n": 3}),
        ("adaptive-rag", {"classifier": "unused: the latency model's router", "k": 3}),
    ],
)
def test_methods_that_look_ahead_give_the_same_rows_with_it_on_or_off(method, params):
    qs = [Question(f"q{i}", f"Who founded the city number {i} and when?", answers=["Rome"]) for i in range(24)]
    rows_off, traces_off = sim_rows(method, params, False, qs)
    rows_on, traces_on = sim_rows(method, params, True, qs)
    strip = [{**r, "extra": _without_look_ahead(r["extra"])} for r in rows_on]
    assert strip == rows_off
    searched, used = (sum(getattr(t, f) for t in traces_on) for f in ("look_ahead_searches", "look_ahead_used"))
    assert 0 < used <= searched <= len(qs)  # (a look-ahead still waiting when its question asks is not searched)
    assert all(t.look_ahead_used <= t.look_ahead_searches for t in traces_on)
    assert sum(t.look_ahead_searches for t in traces_off) == 0


def _without_look_ahead(extra: str | None) -> str | None:
    if extra is None:
        return None
    rest = {k: v for k, v in json.loads(extra).items() if k != "look_ahead"}
    return json.dumps(rest, default=str) if rest else None


class GatedRetriever(MemoryRetriever):
    """A query with "slow" in it blocks its search until `release` is set (at most 5 s: then `timed_out`)."""

    def __init__(self):
        super().__init__(PASSAGES)
        self.release, self.timed_out = threading.Event(), False

    def search(self, queries, k, retriever="bm25"):
        if any("slow" in q for q in queries):
            self.timed_out = not self.release.wait(5)
        return super().search(queries, k, retriever)


def test_a_search_the_cache_holds_is_answered_at_once_while_the_retrieval_lane_is_busy():
    ret = GatedRetriever()

    def program(q: Question, params):
        return Answer((yield Retrieve([q.question], k=2))[0][0].title)

    eng = ContinuousEngine(Backends(DynragConfig(), generator=WaitingGenerator(ret, 0), retriever=ret))
    try:
        assert eng.run([Question("warm", "capital of Italy")], program, None)[0].answer.prediction == "Rome"
        order = []
        for o in eng.stream(
            [Question("a", "slow capital of France"), Question("b", "capital of Italy")], program, None
        ):
            order.append((o.question.id, o.answer.prediction))
            ret.release.set()  # the first answer lets the slow search end
    finally:
        eng.close()
    assert order == [("b", "Rome"), ("a", "Paris")] and not ret.timed_out


class ForgetfulCache(SearchCache):
    """Each entry is evicted as soon as it is read (as another lane's searches may evict it)."""

    def get(self, scope, retriever, query, k):
        hits = super().get(scope, retriever, query, k)
        with self._lock:
            self._entries.pop((scope, retriever, query), None)
        return hits


def test_a_search_served_from_the_cache_uses_the_hits_it_found_there():
    ret = LoggingRetriever()

    def program(q: Question, params):
        return Answer((yield Retrieve([q.question], k=2))[0][0].title)

    backends = Backends(DynragConfig(), generator=WaitingGenerator(ret, 0), retriever=ret)
    backends.search_cache = ForgetfulCache(100)
    eng = ContinuousEngine(backends)
    try:
        eng.run([Question("warm", "capital of Italy")], program, None)
        backends.search_cache.put(
            backends.search_scope(), "bm25", "capital of France", 2, ret.search(["capital of France"], 2)[0]
        )
        ret.log.clear()
        (out,) = eng.run([Question("a", "capital of France")], program, None)
    finally:
        eng.close()
    assert out.answer.prediction == "Paris" and out.trace.retrieval_cache_hits == 1
    assert ret.log == []  # not searched again on the coordinator after the entry went


class BatchLog(MemoryRetriever):
    """Logs each search's queries; "ahead" queries are the look-aheads'."""

    def __init__(self):
        super().__init__(PASSAGES)
        self.batches: list[list[str]] = []
        self.cv = threading.Condition()

    def search(self, queries, k, retriever="bm25"):
        with self.cv:
            self.batches.append(list(queries))
            self.cv.notify_all()
        return super().search(queries, k, retriever)

    def searched_ahead(self) -> int:
        return sum(q.startswith("ahead") for b in self.batches for q in b)


def ahead_of(then_generate: bool):
    def program(q: Question, params):
        yield LookAhead(Retrieve([f"ahead {q.id}"], k=2))  # never asked for: a wasted search where it runs
        if then_generate:
            yield Generate([q.question])
        return Answer((yield Retrieve([q.question], k=2))[0][0].title)

    return program


def test_a_programs_own_search_goes_before_look_aheads_and_a_look_ahead_its_question_outran_is_dropped():
    ret = BatchLog()
    eng = ContinuousEngine(Backends(DynragConfig(), generator=SimGenerator(), retriever=ret), look_ahead=True)
    qs = [Question(f"q{i}", f"capital of France {i}") for i in range(40)]
    try:
        out = eng.run(qs, ahead_of(then_generate=False), None)
    finally:
        eng.close()
    assert {o.answer.prediction for o in out} == {"Paris"}
    assert ret.batches[0] == [q.question for q in qs]  # the 40 searches asked, none of the 40 look-aheads
    assert ret.searched_ahead() == 0  # their questions had ended when the lane was free
    assert all(o.trace.look_ahead_searches == 0 for o in out)


class HeldGenerator:
    """Answers only once the retriever has searched `n` look-aheads (at most 5 s)."""

    def __init__(self, ret: BatchLog, n: int):
        self.ret, self.n, self.inner = ret, n, SimGenerator()

    def generate(self, prompts, samplings, chats):
        with self.ret.cv:
            self.ret.cv.wait_for(lambda: self.ret.searched_ahead() >= self.n, timeout=5)
        return self.inner.generate(prompts, samplings, chats)


def test_look_aheads_are_searched_in_small_batches_while_no_program_waits_on_a_search():
    from pipeline.engine.continuous import LOOK_AHEAD_BATCH

    ret = BatchLog()
    eng = ContinuousEngine(Backends(DynragConfig(), generator=HeldGenerator(ret, 40), retriever=ret), look_ahead=True)
    qs = [Question(f"q{i}", "capital of France") for i in range(40)]
    try:
        out = eng.run(qs, ahead_of(then_generate=True), None)
    finally:
        eng.close()
    assert {o.answer.prediction for o in out} == {"Paris"}
    ahead = [b for b in ret.batches if b[0].startswith("ahead")]
    assert [len(b) for b in ahead] == [LOOK_AHEAD_BATCH, LOOK_AHEAD_BATCH, 40 - 2 * LOOK_AHEAD_BATCH]
    assert all(q.startswith("ahead") for b in ahead for q in b)
    assert sum(o.trace.look_ahead_searches for o in out) == 40 and all(o.trace.look_ahead_used == 0 for o in out)
