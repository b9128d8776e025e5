"""Parts a cluster can trust (issues 47 and 60): part writes retried on transient storage errors, and the
driver's commit of one staged attempt per batch, so that parts/ holds each question once as pyarrow counts it. On a real S3 API
(the session's moto server, `s3_server`) where a store is involved."""

from __future__ import annotations

import errno

import fsspec
import pytest
from engine_fixtures import HOTPOT
from eval_fixtures import no_model_cfg, part_row
from fsspec.implementations.memory import MemoryFileSystem
from on_disk import assert_each_question_once, rows_on_disk

from pipeline.io import output, part_store
from pipeline.io.commit import Committer
from pipeline.io.output import PartWriter, batch_report, read_rows, summarize, write_part
from pipeline.io.part_store import ATTEMPTS, PartWriteError, batch_key
from pipeline.runtime.answer import run_answer


def test_resumed_run_on_s3_counts_every_row(s3, s3_server, data_dir, monkeypatch):
    """A resumed run's summary counts the rows of the parts listed at its start and those its runner reported,
    even where the driver's (cached) listing of parts/ never shows the new parts: here they are written through
    another S3 client, as Ray's engine actors write them from their own processes."""
    fs, bucket = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:8]
    fs.pipe(f"{bucket}/q.jsonl", ("\n".join(lines) + "\n").encode())
    dataset, out = f"s3://{bucket}/q.jsonl", f"s3://{bucket}/run"
    first = run_answer(dataset, out, method="no-retrieval", limit=4, cfg=no_model_cfg())
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
    second = run_answer(dataset, out, method="no-retrieval", limit=8, cfg=no_model_cfg())
    assert (second["skipped_already_answered"], second["new_rows"]) == (4, 4)
    assert second["rows"] == 8
    assert_each_question_once(out, 8)  # as pyarrow counts parts/


class FlakyFS(MemoryFileSystem):
    """An in-memory store whose uploads of parts fail `failures` times (a dropped connection) before one passes."""

    protocol = "flaky"
    failures = 0
    tries = 0
    match = ".parquet"

    def _upload(self, path):
        if self.match in path:
            type(self).tries += 1
            if type(self).tries <= type(self).failures:
                raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")

    def pipe_file(self, path, value, *args, **kwargs):  # a small file's one PUT
        self._upload(path)
        return super().pipe_file(path, value, *args, **kwargs)

    def put_file(self, lpath, rpath, *args, **kwargs):  # a part, written locally first
        self._upload(rpath)
        return super().put_file(lpath, rpath, *args, **kwargs)


@pytest.fixture
def flaky(monkeypatch):
    """A FlakyFS of its own (a fresh class and protocol, so no state or cached instance is shared with another
    test); `flaky.url` is its output folder."""
    import uuid

    proto = f"flaky{uuid.uuid4().hex[:8]}"
    cls = type("FlakyFS", (FlakyFS,), {"protocol": proto, "tries": 0, "failures": 0, "store": {}, "match": ".parquet"})
    cls.pseudo_dirs = [""]
    cls.url = f"{proto}://run"
    fsspec.register_implementation(proto, cls, clobber=True)
    monkeypatch.setattr(part_store, "PART_WRITE_BACKOFF_S", 0.001)
    return cls


def test_part_write_retried_on_transient_errors(flaky):
    flaky.failures = part_store.PART_WRITE_ATTEMPTS - 1
    part = PartWriter(flaky.url, "r1").write([part_row("q1", 1.0)])
    assert flaky.tries == part_store.PART_WRITE_ATTEMPTS
    assert read_rows(flaky.url, ["question_id"], parts=[part]).to_pylist() == [{"question_id": "q1"}]


def test_part_write_gives_up_after_bounded_attempts(flaky):
    flaky.failures = 100
    with pytest.raises(PartWriteError, match=rf"cannot write {flaky.protocol}://run/_attempts/r1-.*ConnectionReset"):
        PartWriter(flaky.url, "r1").write([part_row("q1", 1.0)])
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


def _attempt(out: str, rows: list[dict], batch: list[str], run_id: str = "r1") -> dict:
    """A batch's report as a runner gives it: its rows staged as one attempt."""
    full = [{**r, "question_id": r["question_id"]} for r in rows]
    return batch_report(full, 0, {}, PartWriter(out, run_id).write(full, batch))


def test_a_batch_staged_twice_is_committed_once_and_the_other_attempt_removed(s3):
    """A batch answered twice (its actor drained after writing, before its result came back): both attempts are
    staged where no reader looks; the driver commits the first it hears of and removes the second. pyarrow over
    parts/ counts each question once, and nothing stays staged."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    committer = Committer(out, "r1")
    assert committer.open() == set()
    batch = ["q1", "q2", "q3"]
    first = _attempt(out, [part_row(q, 10.0) for q in batch], batch)
    second = _attempt(out, [part_row(q, 11.0) for q in batch], batch)
    assert rows_on_disk(out).num_rows == 0  # staged: no reader of parts/ sees an attempt
    committed = committer.commit(first)
    assert committed["part"].endswith("/_committed/part-r1-" + batch_key(batch) + ".parquet")  # merged at the close
    assert committer.commit(second) is None
    assert committer.commit(_attempt(out, [part_row("q9", 1.0)], ["q9"]))["rows"] == 1
    committer.close()
    assert_each_question_once(out, 4)
    assert summarize(out, parts=committer.parts)["duplicate_ids"] == 0


def test_the_close_removes_an_attempt_whose_writer_died_mid_write(tmp_path):
    """A node removed while its writer was writing leaves the writer's temporary file (`.<attempt>.<hex>.tmp`) in
    `_attempts/`: the run's close removes it with the run's other attempts; another run's stays for its own."""
    out = str(tmp_path / "out")
    committer = Committer(out, "r1")
    committer.open()
    batch = ["q1"]
    committer.commit(_attempt(out, [part_row("q1", 1.0)], batch))
    staged = tmp_path / "out" / ATTEMPTS
    (staged / f".r1-{batch_key(batch)}-0123abcd.parquet.89ab4567.tmp").write_bytes(b"PAR1 cut short")
    (staged / ".r2-other-0123abcd.parquet.89ab4567.tmp").write_bytes(b"PAR1 cut short")
    committer.close()
    assert sorted(p.name for p in staged.iterdir()) == [".r2-other-0123abcd.parquet.89ab4567.tmp"]
    assert Committer(out, "r3").open() == {"q1"}
    assert_each_question_once(out, 1)


def test_a_zombie_never_deletes_or_replaces_a_committed_part(s3):
    """A zombie (an actor thought dead) finishes late with part of the batch as error rows, before and after the
    run ends: its attempts stay staged, never read, and the next run's open removes them; the committed part is
    untouched."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    batch = ["q1", "q2", "q3"]
    committer = Committer(out, "r1")
    committer.open()
    committer.commit(_attempt(out, [part_row(q, 10.0) for q in batch], batch))
    assert committer.commit(_attempt(out, [part_row("q1", 20.0, "EngineDead: engine died")], batch)) is None
    committer.close()
    (part,) = output.part_files(out)  # the batch, merged
    before = fs.cat(part)
    _attempt(out, [part_row("q2", 30.0, "EngineDead: engine died")], batch)  # after the end: stays staged
    assert fs.cat(part) == before
    assert rows_on_disk(out)["error"].null_count == 3
    assert Committer(out, "r2").open() == set(batch)  # the rerun removes the zombie's attempt
    assert_each_question_once(out, 3)


def test_a_rerun_repairs_a_folder_holding_a_question_twice(tmp_path):
    """Parts written before the driver committed (an older dynrag, or a driver killed between a commit and the
    removal of the row it superseded): the rerun keeps one row a question (an answer over an error row, then the
    last finished) and rewrites the other parts without theirs; summarize counted the duplicates before."""
    out = str(tmp_path / "run")
    write_part(out, [part_row("q1", 1.0, "EngineDead: died"), part_row("q2", 1.0)], "old-a")
    write_part(out, [part_row("q1", 2.0), part_row("q2", 3.0)], "old-b")
    write_part(out, [part_row("q3", 1.0)], "old-c")
    assert summarize(out)["duplicate_ids"] == 2
    assert Committer(out, "r2").open() == {"q1", "q2", "q3"}
    rows = assert_each_question_once(out, 3)
    assert sorted(rows["question_id"].to_pylist()) == ["q1", "q2", "q3"]
    kept = read_rows(out, ["question_id", "prediction"]).sort_by("question_id").to_pylist()
    assert [r["prediction"] for r in kept] == ["p-q1-2.0", "p-q2-3.0", "p-q3-1.0"]
    assert summarize(out)["duplicate_ids"] == 0


def test_a_system_error_row_answered_again_is_replaced_on_disk(tmp_path):
    """A rerun answers a question whose row was a system error again: once its new row is committed, the old row
    is removed from its part (the part's other rows stay)."""
    out = str(tmp_path / "run")
    write_part(out, [part_row("q1", 1.0, "EngineDead: died") | {"error_kind": "system"}, part_row("q2", 1.0)], "r1-a")
    committer = Committer(out, "r2")
    assert committer.open() == {"q2"}
    committer.commit(_attempt(out, [part_row("q1", 5.0)], ["q1"], "r2"))
    committer.close()
    assert_each_question_once(out, 2)
    assert summarize(out, parts=committer.parts)["rows"] == 2


def test_the_close_commits_the_fullest_attempt_of_each_batch_the_driver_never_heard_of(tmp_path):
    """Engine actors drained after the driver stopped reading their reports (issue 78, item 7): their attempts
    are whole and hold finished answers, so the close commits one a batch (the one with the most rows: a batch
    drained part way, then answered whole elsewhere), not removes them; a batch committed already keeps its
    part, and another run's attempt is left alone. Each question once as pyarrow counts; the summary is a
    recount's."""
    out = str(tmp_path / "run")
    committer = Committer(out, "r1")
    committer.open()
    heard = ["q1", "q2"]
    committer.commit(_attempt(out, [part_row(q, 1.0) for q in heard], heard))
    _attempt(out, [part_row("q1", 2.0)], heard)  # a second attempt of a committed batch: removed
    unheard = ["q3", "q4", "q5"]
    _attempt(out, [part_row("q3", 3.0)], unheard)  # drained part way
    _attempt(out, [part_row(q, 4.0) for q in unheard], unheard)  # answered whole elsewhere
    _attempt(out, [part_row("q6", 5.0)], ["q6"])
    _attempt(out, [part_row("q7", 6.0)], ["q7"], run_id="r0")  # another run's: not this close's
    committer.close()
    (other,) = (tmp_path / "run" / ATTEMPTS).iterdir()
    assert other.name.startswith("r0-")
    other.unlink()  # (as r0's own close or the next open would)
    assert_each_question_once(out, 6)
    rows = rows_on_disk(out, ("question_id", "prediction"))
    kept = dict(zip(rows["question_id"].to_pylist(), rows["prediction"].to_pylist()))
    assert kept == {q: f"p-{q}-{at}" for q, at in [("q1", 1.0), ("q2", 1.0), *((q, 4.0) for q in unheard), ("q6", 5.0)]}
    folded = committer.summary()
    assert {**folded, "duplicate_ids": 0} == summarize(out) and folded["rows"] == 6  # summarize counts again
