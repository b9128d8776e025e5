"""Draining (SIGTERM): the engines admit no more questions, finish those in flight within the deadline and
drop the rest; a Feed's questions arrive while the continuous engine runs (a Ray engine actor's batches,
taken while the previous batch's last questions finish); the actor's calls drain too. No Ray here: the
engine actor is called from threads as Ray Data's concurrent calls would (tests/test_engine_ray.py runs
it through Ray)."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from jobs.bench.simulated import Cost, SimGenerator
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.continuous import ContinuousEngine, Feed
from pipeline.engine.core import Engine
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Answer, Generate, Question, SamplingSpec
from pipeline.io.output_lock import LOCK_NAME
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
    finally:
        engine.close()
    assert all(o.error is None and o.answer.prediction for o in got)
    assert sorted(o.question.id for o in got) == sorted(started)  # every question started was finished...
    assert 2 < len(got) <= 2 + 4  # ...those in flight at the request (at most max_in_flight), and no other


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
    engine = continuous(Drain(), max_in_flight=16, cost=Cost(0.2))
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


def test_the_first_sigterm_requests_the_drain_and_the_second_stops_at_once():
    drain = Drain(30)
    with stop_on_sigterm(drain), pytest.raises(Interrupted, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs in this (the main) thread
        assert drain.requested and 29 < drain.remaining() <= 30
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


# ---- the Ray engine actor's calls, made from threads -------------------------------------------------------


def _actor(tmp_path, cost: Cost, max_new_tokens: int = 16, **answer):
    from pipeline.runtime.ray_runner import EngineActor

    cfg = DynragConfig()
    cfg.method.name = "no-retrieval"
    for key, value in answer.items():
        setattr(cfg.answer, key, value)

    class Sim(SimGenerator):  # every answer max_new_tokens long at most (the simulation's default is 32)
        def _one(self, prompt, sampling):
            return SimGenerator._one(prompt, dataclasses.replace(sampling, max_tokens=max_new_tokens))

    def sim_backends(cfg, index_dir, **parts):
        return Backends(cfg, index_dir, generator=Sim(cost), **parts)

    (tmp_path / LOCK_NAME).touch()  # the job's lock, which the actor checks it can see
    row_args = dict(run_id="r1", method="no-retrieval", params_json="{}", chash="h", model="m")
    return EngineActor(cfg.model_dump(mode="json"), None, row_args, str(tmp_path), None, make_backends=sim_backends)


def _batch(qs: list[Question]) -> dict:
    import json

    import numpy as np

    return {"q": np.array([json.dumps(q.to_dict()) for q in qs]), "skipped": np.zeros(len(qs), dtype=int)}


def test_the_engine_actors_concurrent_calls_share_one_engine_and_each_returns_its_own_rows(tmp_path):
    import json

    actor = _actor(tmp_path, FAST)
    results: dict[str, dict] = {}
    calls = [threading.Thread(target=lambda n=n: results.__setitem__(n, actor(_batch(questions(6, n))))) for n in "ab"]
    for t in calls:
        t.start()
    for t in calls:
        t.join(60)
    reports = {n: json.loads(r["report"][0]) for n, r in results.items()}
    assert [reports[n]["rows"] for n in "ab"] == [6, 6]
    assert all(r["part"][0] for r in results.values()) and results["a"]["part"] != results["b"]["part"]
    assert [t.name for t in threading.enumerate()].count("dynrag-engine") == 1  # one coordinator for both
    assert reports["b"]["generator"]["busy_s"] > 0


def test_a_drained_engine_actor_writes_what_finished_and_takes_no_more(tmp_path):
    import json

    actor = _actor(tmp_path, Cost(1.0), max_new_tokens=2000, drain_s=0.5)  # an answer takes >= 7 s
    result: dict = {}
    call = threading.Thread(target=lambda: result.update(actor(_batch(questions(3)))))
    call.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    actor.drain.request()
    call.join(30)
    assert not call.is_alive() and time.monotonic() - t0 < 3
    assert json.loads(result["report"][0])["rows"] == 0  # in flight at the deadline: not written
    later = actor(_batch(questions(3, "later")))
    assert json.loads(later["report"][0])["rows"] == 0 and later["part"][0] == ""


def test_an_engine_actor_holds_enough_batches_for_twice_the_questions_in_flight():
    from pipeline.runtime.ray_runner import actor_batches

    cfg = DynragConfig()
    cfg.answer.max_in_flight = 512
    assert actor_batches(cfg, 128) == 8 and actor_batches(cfg, 100) == 11 and actor_batches(cfg, 4096) == 2
    cfg.ray.actor_batches = 3  # set: taken as given
    assert actor_batches(cfg, 128) == 3
