"""Two real `dynrag answer` jobs on one output (issue 78, item 6), on the session's S3 server (moto on loopback)
and on a local folder: the first is paused with a batch staged (`ray.part_written`: written as an attempt, not yet
committed); the second is refused with one `dynrag: error:` line naming the first (pid, host, since when), through
the output's lease (S3) or lock (local), and leaves the first's attempt alone; the first, resumed, commits that
attempt and ends with every question once. (Before issue 78 an s3:// output had no lease: both jobs ran, and the
second's start removed the first's staged attempts.)"""

from __future__ import annotations

import socket

import fsspec
import pytest
from fault_tools import kill_group, no_model_answer, one_error_line, run, run_until_paused
from on_disk import assert_each_question_once

from pipeline.io.part_store import ATTEMPTS, attempt_key

pytestmark = pytest.mark.faults


def staged(out: str) -> list[str]:
    """The attempts staged in full; a local write in progress is a dot-file, renamed once whole."""
    fs, path = fsspec.core.url_to_fs(out)
    fs.invalidate_cache()
    folder = f"{path.rstrip('/')}/{ATTEMPTS}"
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)] if fs.exists(folder) else []
    return sorted(n for n in names if not n.startswith("."))


def committed_keys(out: str) -> list[str]:
    """The batches the driver has committed and not yet merged (`_committed/part-<run id>-<batch key>.parquet`),
    and those merged into parts (their footers name them)."""
    from pipeline.io.merge import merged_keys

    fs, path = fsspec.core.url_to_fs(out)
    fs.invalidate_cache()
    keys = []
    for folder in ("_committed", "parts"):
        where = f"{path.rstrip('/')}/{folder}"
        for p in fs.ls(where, detail=False) if fs.exists(where) else []:
            if p.endswith(".parquet") and "/." not in p:
                keys += merged_keys(fs, p) if folder == "parts" else [p.rsplit("/", 1)[-1].removesuffix(".parquet")]
    return keys


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_second_job_is_refused_naming_the_first_and_never_removes_its_staged_batch(nq_dev, tmp_path, request, store):
    n, pauses = 100, tmp_path / "pauses"
    out = str(tmp_path / "run") if store == "local" else f"s3://{request.getfixturevalue('s3')[1]}/run"
    first = run_until_paused(no_model_answer(nq_dev, out, n), "ray.part_written", pauses)
    try:
        attempts = staged(out)
        assert attempts, "the first job has a batch staged"
        second = run(no_model_answer(nq_dev, out, n), timeout=600)
        assert second.returncode == 2, second.stderr[-2000:]
        line = one_error_line(second.stderr)
        assert (
            f"{out} is in use by another answer job (pid {first.pid} on host {socket.gethostname()}, started " in line
        )
        # the first job's staged batches are still there, or committed by the first job itself meanwhile (its other
        # engine actor goes on): none was removed by the refused job
        left = {attempt_key(a) for a in staged(out)} | {p.removeprefix("part-") for p in committed_keys(out)}
        assert {attempt_key(a) for a in attempts} <= left
        (pauses / "ray.part_written.resume").touch()
        stdout, stderr = first.communicate(timeout=600)
    finally:
        kill_group(first)
    assert first.returncode == 0, stderr[-3000:]
    assert f"rows {n} (answered {n}" in stdout
    assert_each_question_once(out, n)
