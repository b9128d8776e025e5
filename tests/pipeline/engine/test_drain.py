"""Draining (SIGTERM): the engines admit no more questions, finish those in flight within the deadline and
drop the rest; a Feed's questions arrive while the continuous engine runs (a Ray engine actor's batches,
taken while the previous batch's last questions finish); the replica's lifecycle (serving, a drain message,
a failed engine, a poison batch). No Ray here: the replica is called from threads as Ray Data's concurrent
calls to its engine actor are (tests/pipeline/runtime/test_engine_ray.py runs it through Ray)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from jobs.bench.rig.simulated import Cost, SimGenerator
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.continuous import NOTHING_YET, ContinuousEngine, Feed
from pipeline.engine.core import Engine
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Answer, Generate, Question, SamplingSpec
from pipeline.runtime.signals import Interrupted, stop_on_sigterm

FAST = Cost(0.02)  # 0.3 ms per modelled 15 ms decode step


def tokens_by_id(q: Question, started: list[str]):
    """A program of one generation; a question whose id starts with "slow" generates 400x longer."""
    started.append(q.id)
    n = 4000 if q.id.startswith("slow") else 10
    out = (yield Generate([q.question], SamplingSpec(max_tokens=n)))[0]
    return Answer(out.text)


def questions(n: int, prefix: str = "q") -> list[Question]:
    return [Question(f"{prefix}{i}", f"question {prefix} {i}") for i in range(n)]


def continuous(drain: Drain, max_in_flight: int = 4, cost: Cost = FAST) -> ContinuousEngine:
    return ContinuousEngine(
        Backends(DynragConfig(), generator=SimGenerator(cost)), max_in_flight=max_in_flight, drain=drain
    )


def test_a_drain_admits_no_more_questions_and_finishes_those_in_flight():
    drain, started, got = Drain(30), [], []
    engine = continuous(drain)
    try:
        for outcome in engine.stream(questions(40), tokens_by_id, started):
            got.append(outcome)
            if len(got) == 2:
                drain.request()
                at_request = len(started)
    finally:
        engine.close()
    assert all(o.error is None and o.answer.prediction for o in got)
    assert sorted(o.question.id for o in got) == sorted(started)  # every question started was finished...
    # ...those in flight at the request (the coordinator may have been admitting one as it came), and no other
    assert 2 < len(got) and len(started) <= at_request + 1 < 40


def test_a_drain_that_runs_out_drops_what_is_still_in_flight():
    drain, started = Drain(0.3), []
    engine = continuous(drain, cost=Cost(1.0))  # the slow question needs >= 15 s of decode steps
    qs = [Question("slow0", "a long one"), *questions(3)]
    t0 = time.monotonic()
    got = []
    try:
        for outcome in engine.stream(qs, tokens_by_id, started):
            got.append(outcome.question.id)
            drain.request()
    finally:
        engine.close()
    assert "slow0" in started and "slow0" not in got and got  # the short ones finished, the long one dropped
    assert time.monotonic() - t0 < 5


def test_the_lockstep_engine_drains_at_its_batch_boundary():
    drain, started, got = Drain(30), [], []
    engine = Engine(Backends(DynragConfig(), generator=SimGenerator(FAST)), batch_questions=5, drain=drain)
    for outcome in engine.stream(questions(20), tokens_by_id, started):
        got.append(outcome.question.id)
        drain.request()
    assert got == started == [f"q{i}" for i in range(5)]  # the first batch finished; no other started


def test_a_feeds_questions_are_admitted_while_earlier_ones_are_in_flight():
    feed, started, got = Feed(), [], []
    engine = continuous(Drain(), max_in_flight=16, cost=Cost(0.08))  # the long one: 4.8 s, the short ones 12 ms
    feed.put([Question("slow0", "a long one"), *questions(2, "a")])
    done = threading.Event()

    def consume():
        for outcome in engine.stream(feed, tokens_by_id, started):
            got.append(outcome.question.id)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    try:
        while len(got) < 2:  # the first batch's short questions are done, its long one is in flight
            time.sleep(0.005)
        feed.put(questions(3, "b"))  # a second batch: admitted at once, finished before the long one
        while len(got) < 5:
            time.sleep(0.005)
        assert "slow0" not in got and {"b0", "b1", "b2"} <= set(got)
        feed.close()
        assert done.wait(60) and got[-1] == "slow0" and len(got) == 6
    finally:
        engine.close()


def test_a_feed_gives_its_questions_first_in_first_out_by_its_sources_rank_or_in_turn():
    def fill(feed: Feed, rank: list[str] | None = None) -> Feed:
        if rank:
            feed.expect(rank)
        feed.put(questions(3, "a"), source="run a")
        feed.put(questions(2, "b"), source="run b")
        feed.put([], source="run c")  # nothing: no turn
        feed.put(questions(1, "c"), source="run a")  # a source's later batch comes after its earlier one
        feed.close()
        return feed

    assert [q.id for q in fill(Feed())] == ["a0", "a1", "a2", "b0", "b1", "c0"]  # as put
    assert [q.id for q in fill(Feed(), ["run b", "run a"])] == ["b0", "b1", "a0", "a1", "a2", "c0"]  # by rank
    assert [q.id for q in fill(Feed(in_turn=True))] == ["a0", "b0", "a1", "b1", "a2", "c0"]
    assert [q.id for q in fill(Feed(in_turn=True), ["run b", "run a"])] == ["b0", "a0", "b1", "a1", "a2", "c0"]
    groups = [[q.id for q in g] for g in fill(Feed(in_turn=True)).batches(3)]
    assert groups == [["a0", "b0", "a1"], ["b1", "a2", "c0"]]


def test_a_feed_expecting_sources_holds_the_questions_until_they_came_or_the_wait_ended(monkeypatch):
    import pipeline.engine.continuous as continuous_module

    feed = Feed()
    feed.expect(["run a", "run b", "run c"])
    feed.put(questions(2, "c"), source="run c")
    feed.put(questions(2, "b"), source="run b")
    taken = iter(feed)
    assert next(taken) is NOTHING_YET  # run a's are awaited
    feed.put(questions(2, "a"), source="run a")
    assert [next(taken).id for _ in range(6)] == ["a0", "a1", "b0", "b1", "c0", "c1"]  # the runs' order
    withdrawn = Feed()
    withdrawn.expect(["run a", "run b"])
    withdrawn.put(questions(1, "b"), source="run b")
    assert next(iter(withdrawn)) is NOTHING_YET
    withdrawn.withdraw("run a")  # it ended without putting any (nothing to answer, or failed)
    assert next(iter(withdrawn)).id == "b0"
    monkeypatch.setattr(continuous_module, "GATHER_S", 0.05)
    late = Feed()
    late.expect(["run a", "run b"])
    late.put(questions(1, "a"), source="run a")
    assert next(iter(late)) is NOTHING_YET
    time.sleep(0.1)  # the wait is bounded: the sources that came go on
    assert next(iter(late)).id == "a0"


def test_the_first_sigterm_requests_the_drain_and_the_second_stops_at_once():
    drain = Drain(30)
    with stop_on_sigterm(drain), pytest.raises(Interrupted, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs in this (the main) thread
        assert drain.requested and 29 < drain.remaining() <= 30
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


# ---- the replica (pipeline/runtime/replica.py): its calls made from threads, as Ray Data's are ----------------


class _Writer:
    """A PartWriter's interface, keeping the parts in memory."""

    def __init__(self):
        self.out = "memory"  # a PartWriter's output folder: the replica's inbox names the run by it
        self.parts: list[tuple[list[dict], list[str] | None]] = []

    def write(self, rows, batch_ids=None):
        if not rows:
            return None
        self.parts.append((rows, batch_ids))
        return f"part-{len(self.parts)}"


def _replica(cost: Cost, max_new_tokens: int = 16, on_ended=None, generator=None, **answer):
    from pipeline.methods.registry import get_method
    from pipeline.runtime.replica import Replica

    cfg = DynragConfig()
    cfg.method.name = "no-retrieval"
    for key, value in answer.items():
        setattr(cfg.answer, key, value)

    class Sim(SimGenerator):  # every answer max_new_tokens long at most (the simulation's default is 32)
        def _one(self, prompt, sampling):
            return SimGenerator._one(prompt, dataclasses.replace(sampling, max_tokens=max_new_tokens))

    spec = get_method("no-retrieval")
    row_args = dict(run_id="r1", method="no-retrieval", params_json="{}", chash="h", model="m")
    backends = Backends(cfg, None, generator=generator or Sim(cost))
    replica = Replica(
        cfg,
        spec,
        spec.params({}, cfg),
        None,
        _Writer(),
        row_args,
        on_ended=on_ended,
        make_backends=lambda: backends,
        where={"pid": os.getpid()},
    )
    return replica.start()


def test_the_replicas_concurrent_calls_share_one_engine_and_each_writes_its_own_part():
    from pipeline.runtime.replica import State

    replica = _replica(FAST)
    assert replica.state is State.SERVING
    results: dict[str, dict] = {}
    calls = [threading.Thread(target=lambda n=n: results.__setitem__(n, replica.answer(questions(6, n)))) for n in "ab"]
    for t in calls:
        t.start()
    for t in calls:
        t.join(60)
    assert [results[n]["rows"] for n in "ab"] == [6, 6] and all(results[n]["complete"] for n in "ab")
    assert results["a"]["part"] != results["b"]["part"]
    assert [t.name for t in threading.enumerate()].count("dynrag-replica") == 1  # one loop for both
    assert results["b"]["generator"]["busy_s"] > 0
    assert sorted(r["question_id"] for r in replica.writer.parts[0][0]) in (
        sorted(f"{n}{i}" for i in range(6)) for n in "ab"
    )  # a part is its own batch
    replica.close()
    assert replica.state is State.CLOSED


def test_a_drain_message_writes_what_finished_takes_no_more_and_ends_the_replica_once_written():
    from pipeline.runtime.replica import State

    ended: list = []
    replica = _replica(Cost(1.0), max_new_tokens=2000, on_ended=ended.append, drain_s=0.5)  # an answer >= 7 s
    result: dict = {}
    call = threading.Thread(target=lambda: result.update(replica.answer(questions(3))))
    call.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    replica.drain(0.5, "test")  # as SIGTERM's handler does: a message on the inbox
    call.join(30)
    assert not call.is_alive() and time.monotonic() - t0 < 3
    assert result["rows"] == 0 and not result["complete"]  # in flight at the deadline: not written
    assert replica.state is State.CLOSED and ended == [State.CLOSED]  # told once, after the call wrote
    later = replica.answer(questions(3, "later"))
    assert later["rows"] == 0 and later["part"] == "" and not later["complete"]
    assert ended == [State.CLOSED]


@pytest.mark.parametrize(
    ("why", "then", "keeps"),
    [("SIGTERM", "exit", False), ("node draining", "exit", False), ("the job is stopping", "stay", True)],
)
def test_a_replica_drained_for_its_node_says_its_process_exits_and_hands_its_unfinished_batch_on(why, then, keeps):
    """The lifecycle's decisions are the replica's: drained for its node (SIGTERM, a drain notice) its process
    exits and a part-answered batch goes to the restarted actor; drained by the driver it stays and returns it."""
    replica = _replica(Cost(1.0), max_new_tokens=2000, drain_s=0.5)
    result: dict = {}
    call = threading.Thread(target=lambda: result.update(replica.answer(questions(3))))
    call.start()
    time.sleep(0.3)
    replica.drain(0.5, why)
    replica.drain(0.5, "the job is stopping" if why != "the job is stopping" else "SIGTERM")  # the first reason holds
    call.join(30)
    assert not result["complete"] and replica.keeps_batch(result) is keeps
    assert replica.keeps_batch({**result, "complete": True})  # a finished batch is always returned
    assert replica.after_end().value == then and replica.drain_flag.why == why


def test_an_undrained_replica_stays_and_one_whose_engine_failed_asks_for_a_restart():
    from concurrent.futures import Future

    from pipeline.errors import EngineDead

    replica = _replica(FAST)
    replica.answer(questions(2))
    replica.close()
    assert replica.after_end().value == "stay"  # closed by its owner: nothing for the process to do

    class Dying(SimGenerator):
        def submit(self, prompt, sampling, chat):
            fut: Future = Future()
            fut.set_exception(EngineDead("the engine core died"))
            return fut

    failed = _replica(FAST, generator=Dying(FAST))
    with pytest.raises(EngineDead):
        failed.answer(questions(2))
    assert failed.after_end().value == "restart"


def test_an_engine_that_cannot_go_on_fails_the_replica_and_every_batch_it_holds():
    from concurrent.futures import Future

    from pipeline.errors import EngineDead
    from pipeline.runtime.replica import State

    class Dying(SimGenerator):
        def submit(self, prompt, sampling, chat):
            fut: Future = Future()
            fut.set_exception(EngineDead("the engine core died"))
            return fut

    ended: list = []
    replica = _replica(FAST, on_ended=ended.append, generator=Dying(FAST))
    with pytest.raises(EngineDead):
        replica.answer(questions(4))
    assert replica.state is State.FAILED and ended == [State.FAILED]
    with pytest.raises(EngineDead):  # later batches fail at once, with the same cause
        replica.answer(questions(2, "later"))


def test_a_poison_batch_becomes_error_rows_with_its_cause():
    replica = _replica(FAST)
    report = replica.give_up(questions(3), ["q0", "q1", "q2"], 0, "this batch's replica process died 2 times")
    rows, ids = replica.writer.parts[-1]
    assert report["rows"] == 3 and report["errors"] == 3 and ids == ["q0", "q1", "q2"]
    assert {r["error"] for r in rows} == {"this batch's replica process died 2 times"}
    assert {r["error_kind"] for r in rows} == {"system"}  # a rerun tries them again
    replica.close()


def test_the_lockstep_engine_answers_the_batches_in_the_order_they_came():
    replica = _replica(FAST, engine="lockstep", batch_questions=4)
    first, second = replica.answer(questions(4, "a")), replica.answer(questions(4, "b"))
    assert first["rows"] == second["rows"] == 4
    assert [r["question_id"] for rows, _ in replica.writer.parts for r in rows] == [
        *(f"a{i}" for i in range(4)),
        *(f"b{i}" for i in range(4)),
    ]
    replica.close()


def test_a_replica_holds_enough_batches_for_twice_the_questions_in_flight():
    from pipeline.runtime.replica import batches_held

    cfg = DynragConfig()
    cfg.answer.max_in_flight = 512
    assert batches_held(cfg, 128) == 8 and batches_held(cfg, 100) == 11 and batches_held(cfg, 4096) == 2
    cfg.ray.actor_batches = 3  # set: taken as given
    assert batches_held(cfg, 128) == 3
    cfg.answer.engine = "lockstep"
    assert batches_held(cfg, 128) == 1
