"""One job per output, on object stores too (issue 78, item 6): a job holds an s3:// output through a lease object
(`<out>/_lease.json`, created only if absent, renewed while the job runs) as it holds a local folder through its
flock (pipeline/io/output_lock.py). A second job on an output in use is refused with one line naming the first and
leaves the first's staged attempts alone; a dead job's lease, no longer renewed, expires and the next job takes the
output over; a part is rewritten by question id, so a rewrite never drops a question's only row. Through
`run_answer` on the session's S3 server (moto) and on a local folder."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_fixtures import HOTPOT
from eval_fixtures import no_model_cfg, part_row
from on_disk import assert_each_question_once

from pipeline.errors import DynragError
from pipeline.io import output_lock as lock_mod
from pipeline.io.commit import Committer
from pipeline.io.output import PartWriter, batch_report, read_rows, write_part
from pipeline.io.output_lock import LEASE_NAME, output_lock
from pipeline.io.part_store import ATTEMPTS
from pipeline.runtime.answer import run_answer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["local", "s3"])
def output(request, tmp_path, data_dir):
    """(dataset, out, fs): four questions and an output folder, on local disk or on the session's S3 server."""
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:4]
    dataset = tmp_path / "q.jsonl"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if request.param == "local":
        import fsspec

        return str(dataset), str(tmp_path / "run"), fsspec.filesystem("file")
    fs, bucket = request.getfixturevalue("s3")
    return str(dataset), f"s3://{bucket}/run", fs


def _staged(fs, out: str) -> list[str]:
    folder = f"{out.split('://', 1)[-1]}/{ATTEMPTS}"
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)) if fs.exists(folder) else []


def test_a_second_job_on_an_output_in_use_is_refused_naming_the_first_and_leaves_its_attempts(output):
    """The first job holds the output and has a batch staged (written, not yet committed); the second job is
    refused before it opens the output, with one line naming the first (pid, host, since when), and the first's
    attempt is still there. Without the lock or lease the second job would run and its open would remove the
    first's attempt (the first would then die committing a missing file)."""
    dataset, out, fs = output
    with output_lock(out):
        attempt = PartWriter(out, "first-run").write([part_row("q1", 1.0)], ["q1"])
        assert attempt and _staged(fs, out)
        with pytest.raises(DynragError) as refused:
            run_answer(dataset, out, method="no-retrieval", limit=4, cfg=no_model_cfg())
        msg = str(refused.value)
        assert msg.startswith(
            f"{out} is in use by another answer job (pid {os.getpid()} on host {socket.gethostname()}"
        )
        assert ", started 20" in msg and "\n" not in msg
        if out.startswith("s3://"):
            assert "its lease renewed" in msg
        assert _staged(fs, out) == [attempt.rsplit("/", 1)[-1]]  # the first job's attempt is left alone
    done = run_answer(dataset, out, method="no-retrieval", limit=4, cfg=no_model_cfg())  # once the first has ended
    assert done["rows"] == 4
    assert_each_question_once(out, 4)  # (its open removed the attempt the first left, uncommitted)


def test_an_s3_lease_is_renewed_while_its_job_runs_and_removed_at_its_end(s3, monkeypatch):
    """Held past several times its time to live, the lease is still live (renewed), so a second job is refused;
    once the job ends the lease is gone and the output is free."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    monkeypatch.setattr(lock_mod, "LEASE_S", 3.0)
    lease = f"{bucket}/run/{LEASE_NAME}"
    with output_lock(out):
        first = json.loads(fs.cat_file(lease))
        assert first["ttl_s"] == 3.0 and f"pid {os.getpid()} on host" in first["holder"]
        deadline = time.monotonic() + 120
        while json.loads(fs.cat_file(lease))["renewed_at"] < first["renewed_at"] + 2 * 3.0:  # two lives, renewed
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.2)
        with pytest.raises(lock_mod.OutputBusyError, match="its lease renewed"):
            with output_lock(out):
                pass
    assert not fs.exists(lease)
    with output_lock(out):  # free again
        pass


_DEAD_JOB = """
import os, signal, sys
from pipeline.io import output_lock as m
from pipeline.io.output import PartWriter
m.LEASE_S = float(sys.argv[2])
with m.output_lock(sys.argv[1]):
    PartWriter(sys.argv[1], "dead-run").write([{"question_id": "q0", "error": None}], ["q0"])
    print(os.getpid(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding the output: its lease is never renewed nor removed
"""


def test_a_dead_jobs_lease_expires_and_the_next_job_takes_the_output_over(s3, s3_server, data_dir, tmp_path, caplog):
    """A job killed while it holds an s3:// output leaves its lease; once the lease has gone unrenewed for its time
    to live, the next job takes it over (a line names the dead holder), removes the dead job's staged attempt and
    answers every question."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:4]
    dataset = tmp_path / "q.jsonl"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ttl = 2.0
    dead = subprocess.run(
        [sys.executable, "-c", _DEAD_JOB, out, str(ttl)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dead.returncode == -signal.SIGKILL, dead.stderr
    pid = int(dead.stdout.split()[0])
    assert fs.exists(f"{bucket}/run/{LEASE_NAME}") and _staged(fs, out)
    time.sleep(ttl + 2.5)  # past its time to live as the store's clock counts (whole seconds)
    with caplog.at_level(logging.WARNING, logger="pipeline.io.output_lock"):
        done = run_answer(str(dataset), out, method="no-retrieval", limit=4, cfg=no_model_cfg())
    assert done["rows"] == 4
    taken = [r.getMessage() for r in caplog.records if "taking over the expired lease" in r.getMessage()]
    assert len(taken) == 1 and f"{out}: pid {pid} on host {socket.gethostname()}" in taken[0], caplog.text
    assert_each_question_once(out, 4)  # the dead job's attempt removed, never committed
    assert not fs.exists(f"{bucket}/run/{LEASE_NAME}")


def test_a_rewrite_removes_rows_by_question_id_not_by_positions_read_before(tmp_path, monkeypatch):
    """The repair of a folder holding q1 twice reads the parts, then rewrites the one whose q1 row goes. If that
    part changed between the read and the rewrite (rows in another order, one more), the rewrite still removes q1's
    superseded row only: q2's and q3's only rows stay."""
    out = str(tmp_path / "run")
    a = write_part(out, [part_row("q1", 1.0, "EngineDead: died"), part_row("q2", 1.0)], "old-a")
    write_part(out, [part_row("q1", 2.0)], "old-b")
    assert a is not None
    committer = Committer(out, "r2")
    rewrite = committer._rewrite_without

    def changed_meanwhile(part, *args, **kwargs):
        if part == a:  # the part as another writer left it after the repair read it
            write_part(
                out, [part_row("q2", 1.0), part_row("q3", 1.0), part_row("q1", 1.0, "EngineDead: died")], "old-a"
            )
        return rewrite(part, *args, **kwargs)

    monkeypatch.setattr(committer, "_rewrite_without", changed_meanwhile)
    committer.open()
    kept = read_rows(out, ["question_id", "prediction"]).sort_by("question_id").to_pylist()
    assert [(r["question_id"], r["prediction"]) for r in kept] == [
        ("q1", "p-q1-2.0"),
        ("q2", "p-q2-1.0"),
        ("q3", "p-q3-1.0"),
    ]


def test_a_job_whose_lease_was_taken_over_stops_at_its_next_commit(s3, monkeypatch):
    """A job that could not renew its lease for its time to live may find it taken over by another job: its renewal
    notices (the lease is no longer its own last write), and its next commit stops the job with one line instead
    of writing into an output another job now holds; it leaves the other's lease in place."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    monkeypatch.setattr(lock_mod, "LEASE_S", 1.5)
    lease = f"{bucket}/run/{LEASE_NAME}"
    other = json.dumps({"holder": "pid 4242 on host elsewhere, started 2026-01-01 00:00:00 UTC", "token": "x"})
    with output_lock(out):
        committer = Committer(out, "r1")
        committer.open()
        first = PartWriter(out, "r1").write([part_row("q0", 1.0)], ["q0"])
        assert committer.commit(batch_report([part_row("q0", 1.0)], 0, {}, first)) is not None  # while it holds it
        fs.pipe_file(lease, other.encode())  # the other job's takeover (as after this job's long pause)
        held = lock_mod._leases[out]
        deadline = time.monotonic() + 60
        while not held.lost:
            assert time.monotonic() < deadline, "the renewal did not notice"
            time.sleep(0.1)
        attempt = PartWriter(out, "r1").write([part_row("q1", 1.0)], ["q1"])
        with pytest.raises(lock_mod.OutputBusyError) as stopped:
            committer.commit({"part": attempt, "rows": 1})
        msg = str(stopped.value)
        assert msg.startswith(f"{out} is no longer this job's: its lease was taken over by pid 4242 on host elsewhere")
        assert "\n" not in msg
        committer.close(failing=True)  # leaves the output to the other job: no tally of its parts written
        assert not fs.exists(f"{bucket}/run/_tally.json")
    assert json.loads(fs.cat_file(lease))["token"] == "x"  # the other job's lease stays


def test_a_job_submitted_through_rays_jobs_api_is_named_by_its_submission_id(tmp_path, monkeypatch):
    """Under Ray's Jobs API the driver's holder line carries the job's submission id (from the job config Ray's
    job supervisor hands its driver), so a refused job names the Ray job to look at or stop."""
    meta = {"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_AbC123"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(meta))
    out = str(tmp_path / "run")
    with output_lock(out):
        with pytest.raises(lock_mod.OutputBusyError) as refused:
            with output_lock(out):
                pass
    assert f"(pid {os.getpid()} on host {socket.gethostname()}, started " in str(refused.value)
    assert str(refused.value).split("started ", 1)[1].split(")")[0].endswith(", Ray job raysubmit_AbC123")


def test_a_store_that_refuses_the_lease_ends_the_job_with_one_line(monkeypatch):
    """An object store that refuses writes (no permission): the job ends at its lease, before any row, with one
    line naming the store's object and the error."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Refusing(MemoryFileSystem):
        protocol = "refusinglease"
        store: dict = {}
        pseudo_dirs = [""]

        def pipe_file(self, path, value, *args, **kwargs):
            raise PermissionError(13, "Access Denied", path)

    fsspec.register_implementation("refusinglease", Refusing, clobber=True)
    with pytest.raises(DynragError) as refused:
        with output_lock("refusinglease://bucket/run"):
            pass
    msg = str(refused.value)
    assert msg.startswith("cannot write refusinglease://bucket/run/_lease.json: PermissionError: [Errno 13] Access")
    assert "\n" not in msg


def test_a_close_on_s3_reads_no_other_part_while_its_lease_was_held_throughout(s3, monkeypatch):
    """The close deduplicates an object-store output again only where another job can have written there: when
    the lease went unrenewed for its time to live once. Held throughout, the end of the run reads no part it did
    not write (issue 77, item 4)."""
    fs, bucket = s3
    out = f"s3://{bucket}/run"
    write_part(out, [part_row("q0", 1.0)], "old-a")
    deduplicated: list[list[str]] = []
    real = Committer._deduplicate
    monkeypatch.setattr(Committer, "_deduplicate", lambda self, parts: deduplicated.append(parts) or real(self, parts))
    for lapsed in (False, True):
        with output_lock(out):
            committer = Committer(out, f"r{int(lapsed)}")
            committer.open()
            deduplicated.clear()
            if lapsed:  # its renewals failed for longer than its time to live, once
                lock_mod._leases[lock_mod._key(out)].lapsed = True
            qid = f"q{1 + lapsed}"
            rows = [part_row(qid, 2.0)]
            committer.commit(batch_report(rows, 0, {}, PartWriter(out, committer.run_id).write(rows, [qid])))
            committer.close()
        assert bool(deduplicated) == lapsed, lapsed
    assert_each_question_once(out, 3)
