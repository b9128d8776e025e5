"""The continuous engine: the same rows as the lockstep engine on a mix of methods, a slow backend does not
hold up the others, in-flight questions stay bounded, and the answer job runs on it by default."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from engine_fixtures import PASSAGES, BatchGenerator
from fakes import FakeAttention, MemoryRetriever

from jobs.bench.rig.simulated import SimGenerator, SimScorer
from pipeline.backends import Backends, register_backend
from pipeline.config import DynragConfig
from pipeline.engine.continuous import ContinuousEngine, make_engine
from pipeline.engine.core import Engine, Outcome, Trace
from pipeline.engine.requests import Answer, Call, Completion, Generate, Question, Retrieve, SamplingSpec
from pipeline.engine.streaming import InFlight, StreamingGenerator
from pipeline.io.output import make_row
from pipeline.methods.registry import get_method

# one or two rounds, several rounds with logprobs, scoring, embedding and a named backend (attention)
MIXED = {
    "no-retrieval": {},
    "sr-rag": {"k": 2},
    "cfs": {"k": 3},
    "qdc": {"k": 3},
    "pairs": {"k": 2, "n": 3},
    "dpr-ais-rerank": {"k": 2, "n": 3},
    "dragin": {},
    "flare": {},
    "fl-rag": {},
}


def mixed(q: Question, params):
    """Each question runs the method its id names."""
    name = q.id.rsplit("-", 1)[0]
    spec = get_method(name)
    return (yield from spec.program(q, spec.params(MIXED[name])))


def _backends(generator=None):
    fake = SimScorer()  # outputs are functions of each input alone, as greedy decoding is
    return Backends(
        DynragConfig(),
        generator=generator or SimGenerator(),
        retriever=MemoryRetriever(PASSAGES),
        scorer=fake,
        embedder=fake,
        named={"attention": FakeAttention()},
    )


def _rows(outcomes) -> list[dict]:
    rows = [make_row(o, run_id="r", method="mixed", params_json="{}", chash="h", model="m") for o in outcomes]
    for r in rows:  # what differs between engines by design: timing, and which queries the cache already held
        for key in [k for k in r if k.startswith("time_")] + ["latency_s", "finished_at", "retrieval_cache_hits"]:
            r.pop(key)
        for d in r["retrieved"]:
            d.pop("at_s")
    return rows


@pytest.mark.parametrize("generator", [SimGenerator, BatchGenerator])  # prompts streamed, or batched by the lane
def test_continuous_rows_equal_lockstep_rows_on_mixed_methods(generator):
    qs = [
        Question(
            f"{m}-{i}",
            f"Who directed the film Jaws number {i}?" if i % 2 else f"What is the capital {i}?",
            answers=["Steven Spielberg"],
            supporting_titles=["Jaws (film)"],
        )
        for i in range(4)
        for m in MIXED
    ]
    lockstep = Engine(_backends(BatchGenerator())).run(qs, mixed, None)
    backends = _backends(generator())
    cont = ContinuousEngine(backends, max_in_flight=5, batch_wait_s=0.001, caps={"generate": 4}, batch_items=6)
    try:
        continuous = cont.run(qs, mixed, None)
    finally:
        cont.close()
    assert all(o.error is None for o in lockstep), [o.error for o in lockstep if o.error]
    assert _rows(continuous) == _rows(lockstep)
    assert sum(o.trace.retrieval_calls > 0 for o in continuous) > len(qs) // 2  # the mix really retrieved
    assert {"generate", "retrieve", "score", "embed", "attention.stats"} <= set(cont.batch_calls)
    assert backends.streams == (generator is SimGenerator)
    assert all(o.trace.latency_s > 0 for o in continuous)
    gen_time = [o.trace.time["generation"] for o in continuous]
    assert all(t > 0 for t in gen_time)  # every question got its share of generation time...
    sim = backends.generator.sim if generator is BatchGenerator else backends.generator
    if generator is SimGenerator:  # ...and the shares add up to the generator's own busy time
        assert sum(gen_time) == pytest.approx(sim.busy_s)
    else:  # ...to the lane's generate calls (split by tokens), which hold the generator's busy time
        assert sum(gen_time) == pytest.approx(cont.batch_seconds["generate"])
        assert 0 < sim.busy_s <= cont.batch_seconds["generate"]


def test_in_flight_splits_each_moment_equally_among_the_sequences_then():
    now = [0.0]
    flight = InFlight(clock=lambda: now[0])

    def at(t: float, action: str, key: str):
        now[0] = t
        return getattr(flight, action)(key)

    at(0, "start", "a")
    at(2, "start", "b")
    assert at(3, "finish", "a") == pytest.approx(2 + 1 / 2)  # alone for 2 s, then half of 1 s
    at(5, "start", "c")
    assert at(6, "finish", "b") == pytest.approx(1 / 2 + 2 + 1 / 2)
    assert at(8, "finish", "c") == pytest.approx(1 / 2 + 2)
    at(10, "start", "d")  # 8 to 10: nothing in flight, no one's time
    assert at(11, "finish", "d") == pytest.approx(1)
    assert flight.busy_s == pytest.approx(9)  # the shares' sum: 2.5 + 3 + 2.5 + 1


class HoldingGenerator(StreamingGenerator):
    """A streaming generator that delivers short outputs (max_tokens <= 4) at once from its own thread, and a
    long one only after `short` short prompts were submitted (or after 30 s: then `held_out` is set)."""

    def __init__(self, short: int):
        self.short, self.submitted, self.released, self.held_out = short, 0, threading.Event(), False

    def submit(self, prompt, sampling, chat) -> Future:
        fut: Future = Future()

        def deliver(long: bool):
            if long:
                self.held_out = not self.released.wait(30)
            fut.set_result(
                (Completion(f"{'long' if long else 'short'} {prompt}", completion_tokens=sampling.max_tokens), 0.001)
            )

        long = sampling.max_tokens > 4
        if not long:
            self.submitted += 1
            if self.submitted == self.short:
                self.released.set()
        threading.Thread(target=deliver, args=(long,), daemon=True).start()
        return fut


def test_a_streamed_short_answer_does_not_wait_for_a_long_output():
    """Program s makes three 2-token rounds while program l's 128-token output is still running: with call
    boundaries (one generate over both first prompts) s's second round could not start before l's output."""

    def prog(q: Question, params):
        for _ in range(1 if q.id == "l" else 3):
            out = (yield Generate([q.question], SamplingSpec(max_tokens=128 if q.id == "l" else 2)))[0]
        return Answer(out.text)

    gen = HoldingGenerator(short=3)
    eng = ContinuousEngine(Backends(DynragConfig(), generator=gen), batch_wait_s=0.001)
    try:
        out = eng.run([Question("l", "long"), Question("s", "short")], prog, None)
    finally:
        eng.close()
    assert not gen.held_out and [o.answer.prediction for o in out] == ["long long", "short short"]
    assert [o.trace.llm_calls for o in out] == [1, 3]


class BlockingRetriever(MemoryRetriever):
    """Searching blocks until `release` is set (at most `timeout` s)."""

    def __init__(self, timeout: float):
        super().__init__(PASSAGES)
        self.release, self.searching, self.timeout = threading.Event(), threading.Event(), timeout

    def search(self, queries, k, retriever="bm25"):
        self.searching.set()
        self.release.wait(self.timeout)
        return super().search(queries, k, retriever)


class ReleasingGenerator(SimGenerator):
    """Counts prompts submitted while a search is in progress; after 3 of them, lets the search finish.
    `hold`: a prompt submitted before the search starts is answered only once it has started, so that a
    loaded machine, slow to start the retrieve lane's thread, cannot run every round before the search."""

    def __init__(self, retriever: BlockingRetriever, hold: bool):
        super().__init__()
        self.retriever, self.hold, self.during_search = retriever, hold, 0

    def submit(self, prompt, sampling, chat) -> Future:
        ret = self.retriever
        if ret.searching.is_set() and not ret.release.is_set():
            self.during_search += 1
            if self.during_search == 3:
                ret.release.set()
        fut = super().submit(prompt, sampling, chat)
        if not self.hold or ret.searching.is_set():
            return fut
        held: Future = Future()

        def answer_once_searching() -> None:
            ret.searching.wait(ret.timeout)
            held.set_result(fut.result())

        threading.Thread(target=answer_once_searching, daemon=True).start()
        return held


def three_rounds_or_retrieve(q: Question, params):
    if q.id.startswith("r"):
        hits = yield Retrieve([q.question], k=1)
        return Answer(hits[0][0].title)
    for _ in range(3):
        out = (yield Generate([q.question]))[0]
    return Answer(out.text)


@pytest.mark.parametrize("engine", ["continuous", "lockstep"])
def test_a_slow_backend_does_not_stop_the_others(engine):
    ret = BlockingRetriever(30 if engine == "continuous" else 0.5)  # lockstep would wait it out
    gen = ReleasingGenerator(ret, hold=engine == "continuous")
    cfg = DynragConfig()
    cfg.answer.engine = engine
    eng = make_engine(cfg, Backends(cfg, generator=gen, retriever=ret))
    qs = [Question("r1", "capital of France"), Question("g1", "a"), Question("g2", "b")]
    try:
        out = eng.run(qs, three_rounds_or_retrieve, None)
    finally:
        eng.close()
    assert all(o.error is None for o in out) and out[0].answer.prediction == "Paris"
    if engine == "continuous":  # all three generate rounds ran while the search was blocked
        assert gen.during_search == 3
    else:  # the round barrier: nothing else runs during a retrieval round
        assert gen.during_search == 0


def test_in_flight_questions_never_exceed_the_bound():
    live, peak, lock = [0], [0], threading.Lock()
    served: dict[str, int] = {}  # live question -> results it has received
    joined_running: list[str] = []  # questions admitted while another one was already being served

    def counted(q: Question, params):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            if any(served.values()):
                joined_running.append(q.id)
            served[q.id] = 0
        try:
            for _ in range(1 + int(q.id) % 3):  # 1 to 3 rounds: questions finish at different times
                hits = yield Retrieve([q.question], k=1)
                served[q.id] += 1
                out = (yield Generate([hits[0][0].title]))[0]
                served[q.id] += 1
            return Answer(out.text)
        finally:
            with lock:
                live[0] -= 1
                del served[q.id]

    eng = ContinuousEngine(
        Backends(DynragConfig(), generator=SimGenerator(), retriever=MemoryRetriever(PASSAGES)),
        max_in_flight=4,
        batch_wait_s=0.001,
    )
    try:
        out = list(eng.stream((Question(str(i), f"capital {i}") for i in range(40)), counted, None))
    finally:
        eng.close()
    assert len(out) == 40 and all(o.error is None for o in out)
    assert peak[0] == 4  # admitted up to the bound as others finished, never beyond
    # admitted as others finished, not in waves (lockstep batches of 4 would start only after a whole wave)
    assert joined_running


def test_errors_stay_in_their_rows_on_the_continuous_engine():
    from fakes import RecordingGenerator

    def prog(q: Question, params):
        if q.id == "boom":
            raise ValueError("this question's program fails")
        out = (yield Generate([q.question]))[0]
        return Answer(out.text)

    eng = ContinuousEngine(Backends(DynragConfig(), generator=RecordingGenerator(fail_on="poison")))
    qs = [Question("a", "fine"), Question("boom", "x"), Question("p", "poison"), Question("e", "", error="empty")]
    try:
        out = eng.run(qs, prog, None)
    finally:
        eng.close()
    assert out[0].answer.prediction == "fake answer"
    assert "ValueError" in out[1].error and "poison" in out[2].error and out[3].error == "empty"


SLOW_BUILD_S = 1.0


@register_backend("test-slow-to-build")
class SlowToBuild:
    """A named backend whose constructor takes SLOW_BUILD_S (a model loading)."""

    def __init__(self, cfg, backends):
        time.sleep(SLOW_BUILD_S)

    def echo(self, items):
        return list(items)


def test_a_backend_being_built_does_not_hold_up_the_other_lanes():
    """While the call lane builds its backend, a generate-only question runs its three rounds: the parts
    are built under their own locks, and the coordinator asks whether the generator streams once."""

    def prog(q: Question, params):
        if q.id == "call":
            return Answer((yield Call("test-slow-to-build", "echo", [q.question]))[0])
        for _ in range(3):
            out = (yield Generate([q.question]))[0]
        return Answer(out.text)

    eng = ContinuousEngine(Backends(DynragConfig(), generator=SimGenerator()), batch_wait_s=0.001)
    try:
        out = eng.run([Question("call", "x"), Question("gen", "y")], prog, None)
    finally:
        eng.close()
    assert all(o.error is None for o in out) and out[0].answer.prediction == "x"
    assert out[0].trace.latency_s >= SLOW_BUILD_S  # the call question did wait for its backend
    assert out[1].trace.latency_s < SLOW_BUILD_S / 2  # a generous bound: the other question did not


class ClosingRetriever(MemoryRetriever):
    """A search blocks until `release` is set; `events` records "search done" and the close's return, in order."""

    def __init__(self):
        super().__init__(PASSAGES)
        self.searching, self.release, self.events = threading.Event(), threading.Event(), []

    def search(self, queries, k, retriever="bm25"):
        self.searching.set()
        self.release.wait(30)
        self.events.append("search done")
        return super().search(queries, k, retriever)


def retrieve_once(q: Question, params):
    return Answer((yield Retrieve([q.question], k=1))[0][0].title)


def test_close_waits_for_a_lane_still_inside_a_search():
    """The owner closes the backends after the engine: close must not return while a lane still searches."""
    ret = ClosingRetriever()
    eng = ContinuousEngine(Backends(DynragConfig(), generator=SimGenerator(), retriever=ret), batch_wait_s=0.001)
    out: list = []
    runner = threading.Thread(
        target=lambda: out.extend(eng.run([Question("q", "capital of France")], retrieve_once, None))
    )
    runner.start()
    assert ret.searching.wait(30)
    closer = threading.Thread(target=lambda: (eng.close(), ret.events.append("close returned")))
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # still waiting for the search
    ret.release.set()
    closer.join(30)
    runner.join(30)
    assert ret.events == ["search done", "close returned"]
    assert [o.answer.prediction for o in out] == ["Paris"]


def test_close_with_idle_lanes_returns_at_once_and_leaves_no_lane_thread():
    before = set(threading.enumerate())
    eng = ContinuousEngine(_backends(), batch_wait_s=0.001)
    qs = [Question(f"{m}-0", "Who directed the film Jaws?") for m in ("sr-rag", "cfs", "pairs")]
    out = eng.run(qs, mixed, None)
    lanes = {t.name for t in set(threading.enumerate()) - before if t.name.startswith("dynrag-")}
    t0 = time.monotonic()
    eng.close()
    assert time.monotonic() - t0 < 1
    assert all(o.error is None for o in out) and {"dynrag-retrieve", "dynrag-score"} <= lanes
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("dynrag-")]


def test_close_gives_up_on_a_stuck_lane_after_its_timeout(monkeypatch, caplog):
    import pipeline.engine.continuous as continuous

    monkeypatch.setattr(continuous, "LANE_JOIN_TIMEOUT_S", 0.2)
    ret = ClosingRetriever()
    eng = ContinuousEngine(Backends(DynragConfig(), generator=SimGenerator(), retriever=ret), batch_wait_s=0.001)
    runner = threading.Thread(target=eng.run, args=([Question("q", "capital of France")], retrieve_once, None))
    runner.start()
    try:
        assert ret.searching.wait(30)
        eng.close()  # returns, naming the lane it left behind
        assert ret.events == [] and "engine lane retrieve is still busy" in caplog.text
    finally:
        ret.release.set()
        runner.join(30)


@pytest.mark.parametrize("engine", ["continuous", "lockstep"])
def test_a_cancelled_prompt_is_its_questions_error_and_the_run_goes_on(engine):
    from fakes import CancellingGenerator

    def two_rounds(q: Question, params):
        first = (yield Generate([q.question]))[0]
        return Answer((yield Generate([f"{q.question} then {first.text}"]))[0].text)

    cfg = DynragConfig()
    cfg.answer.engine = engine
    eng = make_engine(cfg, Backends(cfg, generator=CancellingGenerator()))
    qs = [Question("a", "first"), Question("c", "please cancel"), Question("b", "second")]
    out: list = []
    runner = threading.Thread(target=lambda: out.extend(eng.run(qs, two_rounds, None)), daemon=True)
    try:
        runner.start()
        runner.join(30)  # a waiter left unresolved would hang here
    finally:
        eng.close()
    assert len(out) == 3, "the run did not finish"
    assert [o.error is None for o in out] == [True, False, True]
    assert "CancelledError" in out[1].error and out[1].error_kind == "system"  # a rerun retries it
    assert all(o.answer.prediction for o in (out[0], out[2]))


class DyingGenerator(SimGenerator):
    """The simulated streaming generator whose engine dies at the prompt containing "die": that prompt and
    every later one get EngineDead (as vLLM's dead engine core answers every request); batch calls too."""

    def __init__(self):
        super().__init__()
        self.dead = False

    def submit(self, prompt, sampling, chat) -> Future:
        from pipeline.errors import EngineDead

        self.dead = self.dead or "die" in str(prompt)
        if not self.dead:
            return super().submit(prompt, sampling, chat)
        fut: Future = Future()
        fut.set_exception(EngineDead("the engine core died"))
        return fut

    def generate(self, prompts, samplings, chats):
        from pipeline.errors import EngineDead

        self.dead = self.dead or any("die" in str(p) for p in prompts)
        if self.dead:
            raise EngineDead("the engine core died")
        return super().generate(prompts, samplings, chats)


@pytest.mark.parametrize("engine", ["continuous", "lockstep"])
@pytest.mark.parametrize("streams", [True, False])
def test_a_dead_engine_ends_the_run_instead_of_failing_every_later_question(engine, streams):
    """EngineDead is not a question's error (a CancelledError or a too-long prompt is): the run stops with it,
    so that an engine actor exits for Ray to restart it, and no question gets an error row for it."""
    from pipeline.errors import EngineDead

    def one_round(q: Question, params):
        return Answer((yield Generate([q.question]))[0].text)

    cfg = DynragConfig()
    cfg.answer.engine = engine
    dying = DyingGenerator()
    batch_only = type("BatchOnly", (), {"generate": lambda self, *a: dying.generate(*a)})()
    eng = make_engine(cfg, Backends(cfg, generator=dying if streams else batch_only))
    qs = [Question(f"q{i}", "please die" if i == 3 else f"question {i}") for i in range(8)]
    finished: list = []
    try:
        with pytest.raises(EngineDead, match="engine core died"):
            for o in eng.stream(iter(qs), one_round, None):
                finished.append(o)
    finally:
        eng.close()
    assert all(o.error is None for o in finished)  # what finished before the death stands; nothing else


class CallSizes:
    """A batch-only generator that records each call's size."""

    def __init__(self):
        self.sizes: list[int] = []

    def generate(self, prompts, samplings, chats):
        self.sizes.append(len(prompts))
        return [Completion(text="x", prompt_tokens=1, completion_tokens=1) for _ in prompts]


@pytest.mark.parametrize(
    ("backend", "batch_size", "calls"),
    [("vllm", None, [100]), ("transformers", None, [64, 36]), ("vllm", 30, [30, 30, 30, 10])],
)
def test_a_batched_vllm_call_takes_every_prompt_waiting(backend, batch_size, calls):
    """vLLM schedules its own running batch, so one round of 100 single-call questions is one generate call (two
    calls of 64 and 36 made the second wait for the first one's longest answer); a transformers generator's
    forward batch stays 64, and generation.batch_size, where set, wins."""
    gen = CallSizes()
    cfg = DynragConfig()
    cfg.generation.backend, cfg.generation.batch_size = backend, batch_size
    eng = make_engine(cfg, Backends(cfg, generator=gen))

    def one_call(q: Question, params):
        return Answer((yield Generate([q.question]))[0].text)

    try:
        out = eng.run([Question(f"q{i}", f"question {i}") for i in range(100)], one_call, None)
    finally:
        eng.close()
    assert all(o.error is None for o in out) and len(out) == 100
    assert gen.sizes == calls


ROW_ARGS = {"run_id": "r", "method": "m", "params_json": "{}", "chash": "h", "model": "m"}


def test_a_rows_finished_at_is_when_its_question_ended_not_when_its_batch_was_written():
    """A question that ended 2 s before its row was made (its batch still running) carries that time: its start is
    finished_at - latency_s. A row written for a question that never ran (an error row) carries the time it was made."""
    now = time.perf_counter()
    ran = Outcome(Question("a", "q"), None, Trace(started=now - 5.0, finished=now - 2.0), "failed", "input")
    row = make_row(ran, **ROW_ARGS)
    assert abs(row["finished_at"] - (time.time() - 2.0)) < 0.5 and row["latency_s"] == pytest.approx(3.0)
    never = make_row(Outcome(Question("b", "q"), None, Trace(), "gave up", "system"), **ROW_ARGS)
    assert abs(never["finished_at"] - time.time()) < 0.5
