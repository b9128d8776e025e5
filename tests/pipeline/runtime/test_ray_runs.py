"""An experiment's runs through one Ray job (pipeline/runtime/runners.py RayRuns), without Ray: the job's stream
is a stand-in. Each run commits on its own thread; the job's actors and Ray go only once every run has committed
what it was handed (issue 78, item 5), and a commit told after the job's end reaches no actor."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from pipeline.config import DynragConfig
from pipeline.runtime import ray_runner
from pipeline.runtime.ray_runner import CommitTeller
from pipeline.runtime.runners import RayRuns


def _job(out: str):
    params = SimpleNamespace(model_dump=lambda mode=None: {})
    return SimpleNamespace(
        dataset="d",
        out=out,
        index=None,
        cfg=DynragConfig(),
        spec=SimpleNamespace(name="m"),
        params=params,
        row_args={},
        header={},
        done=set(),
        limit=None,
    )


def test_the_job_ends_only_after_every_run_committed_what_it_was_handed(monkeypatch):
    events: list[str] = []
    lock = threading.Lock()

    def record(what: str) -> None:
        with lock:
            events.append(what)

    def stream(dataset, cfg, index, runs, *, limit, drain, settle):
        try:
            for b in range(3):
                for i in range(len(runs)):
                    yield i, {"rows": 1, "batch": b}, lambda i=i, b=b: record(f"told {i}.{b}")
        finally:
            settle()
            record("actors gone, Ray down")

    monkeypatch.setattr(ray_runner, "answer_runs_with_ray", stream)
    runs = RayRuns(2, DynragConfig())

    def run(i: int) -> None:
        for report in runs.answer(_job(f"out{i}")):
            time.sleep(0.05 * (i + 1))  # committing: slower than the stream
            record(f"committed {i}.{report['batch']}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert events[-1] == "actors gone, Ray down"
    assert sorted(e for e in events if e.startswith("committed")) == [
        f"committed {i}.{b}" for i in (0, 1) for b in range(3)
    ]
    assert len([e for e in events if e.startswith("told")]) == 6


def test_a_run_that_stops_taking_reports_does_not_hold_the_job(monkeypatch):
    ended = threading.Event()

    def stream(dataset, cfg, index, runs, *, limit, drain, settle):
        try:
            for b in range(3):
                yield 0, {"rows": 1, "batch": b}, lambda: None
        finally:
            settle()
            ended.set()

    monkeypatch.setattr(ray_runner, "answer_runs_with_ray", stream)
    runs = RayRuns(1, DynragConfig())
    reports = runs.answer(_job("out"))
    next(reports)
    reports.close()  # the run's thread failed on its first batch
    assert ended.wait(5)


def test_a_commit_told_after_the_jobs_end_reaches_no_actor():
    told = []
    control = SimpleNamespace(committed=SimpleNamespace(remote=told.append))
    teller = CommitTeller(control)
    teller.tell("/out/_attempts/r1-abc-0123.parquet")
    teller.tell("")  # a batch of no rows: nothing to tell
    teller.close()
    teller.tell("/out/_attempts/r1-def-0123.parquet")
    assert len(told) == 1
