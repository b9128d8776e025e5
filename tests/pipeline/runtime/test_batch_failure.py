"""An error in one batch while its replica is sound (issue 78, item 2): a row that Arrow refuses, an error in
make_row. The batch fails, not the replica: its questions become error rows with the cause (error_kind "system",
a rerun's), written and reported as any batch's, and the next batch is answered, in-process (`LocalRunner`) and
in a Ray engine actor (`EngineActor`, built here without Ray over an in-process RunControl) alike. Error rows
that cannot be written either end the job with one line; an engine actor never parks for it."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from types import SimpleNamespace

import fsspec
import pyarrow.parquet as pq
import pytest

from jobs.bench.rig.simulated import Cost, SimGenerator
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.drain import Drain
from pipeline.engine.requests import Answer, Generate, Question, SamplingSpec
from pipeline.errors import DynragError
from pipeline.io.output import PartWriter
from pipeline.io.part_store import PartWriteError
from pipeline.methods.registry import get_method

ROW_ARGS = dict(run_id="r1", method="no-retrieval", params_json="{}", chash="h", model="m")
CALL_S = 10.0  # a batch's call returns within this (a parked one never does)


def questions(n: int, prefix: str) -> list[Question]:
    return [Question(f"{prefix}{i}", f"question {prefix} {i}") for i in range(n)]


def sim_backends(cfg, index_dir=None, **kw) -> Backends:
    return Backends(cfg, index_dir, generator=SimGenerator(Cost(0.02)), **kw)


def _cfg() -> DynragConfig:
    cfg = DynragConfig()
    cfg.method.name = "no-retrieval"
    cfg.answer.batch_questions = 3
    return cfg


def _memory_out() -> str:
    return f"memory://batch-failure-{uuid.uuid4().hex[:8]}"


def _rows(part: str) -> list[dict]:
    with fsspec.filesystem("memory").open(part, "rb") as fh:
        return pq.read_table(fh).to_pylist()


class RefusesErrorRows(PartWriter):
    """A PartWriter whose store refuses the error rows (as an object store that has gone read-only)."""

    def write(self, rows, batch_ids=None):
        if any(r["error"] for r in rows):
            raise PartWriteError(f"cannot write {self.out}/_attempts: PermissionError: access denied")
        return super().write(rows, batch_ids)


@pytest.fixture
def bad_rows(monkeypatch):
    """make_row fails for a question whose id starts with "bad" (its batch's other rows are made)."""
    import pipeline.runtime.replica as replica_module

    real = replica_module.make_row

    def make_row(o, **row_args):
        if o.question.id.startswith("bad") and o.error is None:
            raise ValueError(f"no row for {o.question.id}")
        return real(o, **row_args)

    monkeypatch.setattr(replica_module, "make_row", make_row)


# ---- the replica (shared by both runners) ------------------------------------------------------------------


def _refused_by_arrow(q: Question, params):
    """A program whose answer to a "bad" question has a raw output that is not text: Arrow refuses its row in
    Table.from_pylist (inside PartWriter.write, before any write: not a PartWriteError)."""
    text = (yield Generate([q.question], SamplingSpec(max_tokens=4)))[0].text
    return Answer(text, raw_output={"not": "text"} if q.id.startswith("bad") else text)


def _replica(writer):
    from pipeline.runtime.replica import Replica, ServedRun

    cfg = _cfg()
    spec = get_method("no-retrieval")
    replica = Replica(cfg, spec, spec.params({}, cfg), sim_backends(cfg), writer, ROW_ARGS).start()
    return replica, ServedRun(_refused_by_arrow, spec.params({}, cfg), writer, ROW_ARGS)


def test_a_row_that_arrow_refuses_fails_its_batch_into_error_rows_and_the_replica_goes_on():
    from pipeline.runtime.replica import State

    replica, run = _replica(PartWriter(_memory_out(), "r1"))
    try:
        batch = [*questions(2, "ok"), *questions(1, "bad")]
        report = replica.answer(batch, [q.id for q in batch], 0, run)
        assert report["rows"] == report["errors"] == 3 and report["complete"] and report["part"]
        rows = _rows(report["part"])
        assert sorted(r["question_id"] for r in rows) == ["bad0", "ok0", "ok1"]
        assert {r["error_kind"] for r in rows} == {"system"}  # a rerun answers them again
        (cause,) = {r["error"] for r in rows}
        assert cause.startswith("this batch failed before its rows were written: ArrowTypeError")
        assert replica.state is State.SERVING and not replica.failed
        after = replica.answer(questions(3, "next"), None, 0, run)  # the next batch is answered
        assert after["rows"] == 3 and after["errors"] == 0
    finally:
        replica.close()


def test_error_rows_that_cannot_be_written_either_end_the_job_with_one_line():
    replica, run = _replica(RefusesErrorRows(_memory_out(), "r1"))
    try:
        with pytest.raises(DynragError) as err:
            replica.answer(questions(2, "bad"), None, 0, run)
        line = str(err.value)
        assert "\n" not in line and len(line) < 1000
        assert "the error rows of 2 questions could not be written (PartWriteError: cannot write" in line
        assert "this batch failed before its rows were written: ArrowTypeError" in line
    finally:
        replica.close()


# ---- both runners: the same failure, the same rows ---------------------------------------------------------


class InProcessHandle:
    """RunControl's actor handle, in this process: `.method.remote(...)` calls it at once (ray.get is patched to
    give the value back)."""

    def __init__(self, control):
        self.control = control

    def __getattr__(self, name: str):
        return SimpleNamespace(remote=getattr(self.control, name))


@pytest.fixture
def engine_actor(monkeypatch):
    """An EngineActor over an in-process RunControl (no Ray), writing to memory://; closed after the test."""
    import ray

    from pipeline.runtime.ray_control import RunControl
    from pipeline.runtime.ray_runner import EngineActor

    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    made: list = []

    def make(writer_class=PartWriter) -> EngineActor:
        out = _memory_out()
        run = {"out": out, "method": "no-retrieval", "row_args": ROW_ARGS, "header": None, "params": None}
        control = RunControl()
        engine = EngineActor(
            _cfg().model_dump(mode="json"), None, [run], None, InProcessHandle(control), make_backends=sim_backends
        )
        engine.runs[0] = dataclasses.replace(engine.runs[0], writer=writer_class(out, "r1"))
        engine.run_control = control
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine._ended.set()  # its heartbeat thread stops
        engine.replica.close()


def _call(engine, batch: list[Question]) -> dict:
    """engine._answer in a thread of its own (as Ray runs a call): its report, or a failure if it parks."""
    got: dict = {}
    call = threading.Thread(target=lambda: got.update(engine._answer(0, batch, 0)), daemon=True)
    call.start()
    call.join(CALL_S)
    assert not call.is_alive(), "the engine actor's call parked instead of returning the batch's report"
    return got


def _local_reports(batches: list[list[Question]]) -> list[dict]:
    from pipeline.runtime.runners import Batches, LocalRunner

    cfg = _cfg()
    spec = get_method("no-retrieval")
    out = _memory_out()
    job = Batches(
        "dataset", out, None, [q for b in batches for q in b], {"skipped": 0}, cfg, spec, spec.params({}, cfg),
        ROW_ARGS, None, set(), None,
    )  # fmt: skip
    return list(LocalRunner().answer(job, backends=sim_backends(cfg), drain=Drain(30)))


@pytest.mark.usefixtures("bad_rows")
@pytest.mark.parametrize("runner", ["local", "ray"])
def test_a_batch_that_fails_is_written_as_error_rows_and_the_job_goes_on_in_both_runners(runner, engine_actor):
    batches = [questions(3, "a"), [*questions(2, "b"), *questions(1, "bad")], questions(3, "c")]
    if runner == "local":
        reports = _local_reports(batches)
    else:
        engine = engine_actor()
        reports = [_call(engine, b) for b in batches]
        assert not engine.turns.busy and not engine.begun  # every call left its turn and ended its batch
        assert not engine.run_control.attempts  # RunControl knows each batch ended: none is taken for a death
    assert not any("fatal" in r for r in reports)
    assert sorted((r["rows"], r["errors"]) for r in reports) == [(3, 0), (3, 0), (3, 3)]
    (failed,) = [r for r in reports if r["errors"]]
    rows = _rows(failed["part"])
    assert sorted(r["question_id"] for r in rows) == ["b0", "b1", "bad0"]
    assert {(r["error"], r["error_kind"]) for r in rows} == {
        ("this batch failed before its rows were written: ValueError: no row for bad0", "system")
    }


@pytest.mark.usefixtures("bad_rows")
def test_an_engine_actor_whose_error_rows_cannot_be_written_ends_the_job_with_one_line_instead_of_parking(
    engine_actor,
):
    engine = engine_actor(RefusesErrorRows)
    report = _call(engine, questions(2, "bad"))
    assert report["fatal"].startswith("engine replica ")
    assert "the error rows of 2 questions could not be written (PartWriteError" in report["fatal"]
    assert "ValueError: no row for bad0" in report["fatal"] and "\n" not in report["fatal"]
    assert not engine.turns.busy
