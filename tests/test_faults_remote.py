"""Two real answer jobs at once on one s3:// output (a moto S3 server on loopback): remote outputs
cannot be flock'ed, so both run and both write parts; rows are read one per question id (the last
finished), so the summary and what `evaluate` reads hold each question once."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest
from fault_tools import cli, env_for, start

from pipeline.io.output import part_files, read_rows

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

N = 40


def test_two_jobs_on_one_s3_output_yield_each_question_once(s3, nq_dev, tmp_path):  # noqa: F811
    fs, bucket = s3
    out = f"s3://{bucket}/runs/both"
    cmd = cli(
        "answer",
        "--dataset",
        str(nq_dev),
        "--method",
        "no-retrieval",
        "--out",
        out,
        "--limit",
        str(N),
        "--no-progress",
        "--set",
        "generation.backend=none",
        "--set",
        "answer.batch_questions=5",
        "--set",
        "ray.actor_batches=1",  # one batch at a time: the paused driver holds its job while the second runs
    )
    # the first job waits 45 s after its first part, so the second one runs meanwhile
    first = start(cmd, {**env_for("answer.part_written", tmp_path / "pauses"), "DYNRAG_PAUSE_SECONDS": "45"})
    try:
        while not (tmp_path / "pauses" / "answer.part_written").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.05)
        second = start(cmd, env_for())
        out2, err2 = second.communicate(timeout=300)
        out1, err1 = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err1[-2000:], err2[-2000:])
    written = sum(pq.read_metadata(fs.open(p, "rb")).num_rows for p in part_files(out))
    assert written > N  # both jobs answered some of the same questions
    rows = read_rows(out)
    assert rows.num_rows == N and len(set(rows["question_id"].to_pylist())) == N
    assert f"rows {N} (answered {N}" in out1
    summary = json.loads(fs.cat(f"{bucket}/runs/both/summary.json"))
    assert (summary["rows"], summary["duplicate_ids"]) == (N, 0)
