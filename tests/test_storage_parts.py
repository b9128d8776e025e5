"""Parts a cluster can trust (issue 47, item 5): the driver's ledger of committed parts, part writes retried on
transient storage errors, and a late (zombie) writer that cannot overwrite a complete part. On a real S3 API
(the session's moto server, `s3_server`) where a store is involved."""

from __future__ import annotations

import errno

import fsspec
import pyarrow.parquet as pq
import pytest
from engine_fixtures import HOTPOT
from fsspec.implementations.memory import MemoryFileSystem

from pipeline.config import DynragConfig
from pipeline.io import output, part_store
from pipeline.io.output import PartLedger, PartWriter, answered_ids, batch_report, read_rows
from pipeline.runtime.answer import run_answer


def _cfg() -> DynragConfig:
    cfg = DynragConfig()
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.batch_questions = 2
    return cfg


def _row(qid: str, finished_at: float, error: str | None = None) -> dict:
    return {"question_id": qid, "finished_at": finished_at, "error": error, "prediction": f"p-{qid}-{finished_at}"}


def test_resumed_run_on_s3_counts_every_row(s3, s3_server, data_dir, monkeypatch):
    """A resumed run's summary counts the rows of the parts listed at its start and those its runner reported,
    even where the driver's (cached) listing of parts/ never shows the new parts: here they are written through
    another S3 client, as Ray's engine actors write them from their own processes."""
    fs, bucket = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:8]
    fs.pipe(f"{bucket}/q.jsonl", ("\n".join(lines) + "\n").encode())
    dataset, out = f"s3://{bucket}/q.jsonl", f"s3://{bucket}/run"
    first = run_answer(dataset, out, method="no-retrieval", limit=4, cfg=_cfg())
    assert first["rows"] == 4

    import threading

    writer = s3_server.filesystem()  # a client of its own, with its own listing cache
    write_part, real_fs, writing = output.write_part, output._fs, threading.local()

    def routed_fs(o):  # the parts' writes through `writer`; everything else through the driver's client
        return (writer, o.split("://", 1)[1].rstrip("/")) if getattr(writing, "on", False) else real_fs(o)

    def write_elsewhere(out, rows, key=None):  # batches are written from several threads at once
        writing.on = True
        try:
            return write_part(out, rows, key)
        finally:
            writing.on = False

    monkeypatch.setattr(output, "_fs", routed_fs)
    monkeypatch.setattr(output, "write_part", write_elsewhere)
    second = run_answer(dataset, out, method="no-retrieval", limit=8, cfg=_cfg())
    assert (second["skipped_already_answered"], second["new_rows"]) == (4, 4)
    assert (second["rows"], second["duplicate_ids"]) == (8, 0)


def test_ledger_counts_the_start_and_the_reports():
    ledger = PartLedger(["a", "b", "a"])
    ledger.add(batch_report([_row("q1", 1.0)], 0, {}, "c"))
    ledger.add(batch_report([], 3, {}))  # skipped questions only: no part, still complete
    ledger.add(batch_report([_row("q2", 1.0)], 0, {}, "c"))  # a batch reported twice counts once
    assert ledger.parts == ["a", "b", "c"]
    ledger.add(batch_report([_row("q3", 1.0)], 0, {}))  # rows without their part: the ledger cannot say
    assert ledger.parts is None


class FlakyFS(MemoryFileSystem):
    """An in-memory store whose uploads of parts fail `failures` times (a dropped connection) before one passes."""

    protocol = "flaky"
    failures = 0
    tries = 0
    match = "/parts/"

    def pipe_file(self, path, value, *args, **kwargs):
        if self.match in path:
            type(self).tries += 1
            if type(self).tries <= type(self).failures:
                raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")
        return super().pipe_file(path, value, *args, **kwargs)


@pytest.fixture
def flaky(monkeypatch):
    """A FlakyFS of its own (a fresh class and protocol, so no state or cached instance is shared with another
    test); `flaky.url` is its output folder."""
    import uuid

    proto = f"flaky{uuid.uuid4().hex[:8]}"
    cls = type("FlakyFS", (FlakyFS,), {"protocol": proto, "tries": 0, "failures": 0, "store": {}, "match": "/parts/"})
    cls.pseudo_dirs = [""]
    cls.url = f"{proto}://run"
    fsspec.register_implementation(proto, cls, clobber=True)
    monkeypatch.setattr(part_store, "PART_WRITE_BACKOFF_S", 0.001)
    return cls


def test_part_write_retried_on_transient_errors(flaky):
    flaky.failures = part_store.PART_WRITE_ATTEMPTS - 1
    part = PartWriter(flaky.url, "r1").write([_row("q1", 1.0)])
    assert flaky.tries == part_store.PART_WRITE_ATTEMPTS
    assert read_rows(flaky.url, ["question_id"], parts=[part]).to_pylist() == [{"question_id": "q1"}]


def test_part_write_gives_up_after_bounded_attempts(flaky):
    flaky.failures = 100
    with pytest.raises(ConnectionResetError):
        PartWriter(flaky.url, "r1").write([_row("q1", 1.0)])
    assert flaky.tries == part_store.PART_WRITE_ATTEMPTS


def test_small_files_are_retried_too(flaky):
    flaky.failures, flaky.match = 2, "summary.json"
    output.write_json(flaky.url, "summary.json", {"rows": 1})
    assert flaky.tries == 3 and output.read_json(flaky.url, "summary.json") == {"rows": 1}


def test_permanent_errors_are_not_retried():
    assert not output.transient(PermissionError(errno.EACCES, "denied"))
    assert not output.transient(OSError(errno.ENOSPC, "disk full"))
    assert not output.transient(FileNotFoundError("no bucket"))
    assert output.transient(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert output.transient(OSError(errno.EIO, "slow down"))
    assert output.transient(type("EndpointConnectionError", (Exception,), {})())  # botocore's, not an OSError
    assert not output.transient(ValueError("a bug"))


def _on_store(fs, out: str) -> list[dict]:
    """Every row in the folder's part files, as stored (no dedup)."""
    bucket_path = out.split("://", 1)[1]
    return sorted(
        (
            r
            for p in fs.find(f"{bucket_path}/parts")
            for r in pq.read_table(fs.open(p, "rb"), columns=["question_id"]).to_pylist()
        ),
        key=lambda r: r["question_id"],
    )


def test_zombie_writer_cannot_overwrite_a_complete_part(s3):
    """A batch given to a new actor after its first was thought dead: the new actor writes the whole batch, then
    the zombie finishes late with part of the batch as error rows. The complete part stays, every question reads
    once with its answer; the zombie's part stays too (a part a writer wrote is never removed by itself: it may
    be the one its report names), read as nothing new."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    batch = ["q1", "q2", "q3"]
    complete = PartWriter(out, "r1").write([_row(q, 10.0) for q in batch], batch)
    zombie = PartWriter(out, "r1").write([_row("q1", 20.0, "EngineDead: engine died")], batch)
    assert zombie != complete and output.part_key(zombie) == output.part_key(complete)
    assert fs.exists(complete.split("://", 1)[-1])
    rows = read_rows(out, ["question_id", "prediction", "error"]).sort_by("question_id").to_pylist()
    assert rows == [{"question_id": q, "prediction": f"p-{q}-10.0", "error": None} for q in batch]
    assert answered_ids(out) == set(batch)
    assert read_rows(out, ["question_id"], parts=[complete, zombie]).num_rows == 3  # a ledger naming both
    assert fs.exists(zombie.split("://", 1)[-1])


def test_a_drained_attempt_goes_once_its_batch_is_written_whole(s3):
    """An actor drained part way writes the questions it finished; the batch, run again whole elsewhere, writes
    all of them: the folder then holds each row once, and another batch's part is untouched."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    batch = ["q1", "q2", "q3"]
    drained = PartWriter(out, "r1").write([_row("q1", 5.0)], batch)
    other = PartWriter(out, "r1").write([_row("q9", 5.0)], ["q9"])
    whole = PartWriter(out, "r1").write([_row(q, 10.0) for q in batch], batch)
    assert not fs.exists(drained.split("://", 1)[-1]) and fs.exists(other.split("://", 1)[-1])
    assert _on_store(fs, out) == [{"question_id": q} for q in [*batch, "q9"]]
    assert read_rows(out, ["question_id"], parts=[drained, other, whole]).num_rows == 4  # the ledger's gone part


def test_complete_attempts_all_stay_and_read_once(tmp_path):
    """A batch answered again whole (its actor exited after writing, before returning): every attempt's part
    stays, since each may be the one a report named (the driver's ledger reads it), and reads once."""
    out = str(tmp_path / "run")
    batch = ["q1", "q2"]
    written = [PartWriter(out, "r1").write([_row(q, 10.0) for q in batch], batch) for _ in range(3)]
    assert sorted(output.part_files(out)) == sorted(written) and read_rows(out, ["question_id"]).num_rows == 2
    for part in written:  # a ledger naming any one of them counts the batch
        assert read_rows(out, ["question_id"], parts=[part]).num_rows == 2
