"""Two real answer jobs at once on one s3:// output (a moto S3 server on loopback): remote outputs
cannot be flock'ed, so both run and both commit parts, some of the same questions; the last job to end
deduplicates the parts (commit.py), so that any Parquet reader then counts each question once."""

from __future__ import annotations

import json
import re
import time

import pytest
from fault_tools import cli, env_for, start
from on_disk import assert_each_question_once

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
    # the first job pauses after its first part until the second one has ended (at most 120 s)
    pauses = tmp_path / "pauses"
    first = start(cmd, {**env_for("answer.part_written", pauses), "DYNRAG_PAUSE_SECONDS": "120"})
    try:
        while not (pauses / "answer.part_written").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.05)
        second = start(cmd, env_for())
        out2, err2 = second.communicate(timeout=300)
        (pauses / "answer.part_written.resume").touch()
        out1, err1 = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err1[-2000:], err2[-2000:])
    answered = [int(re.search(r"new (\d+)", o).group(1)) for o in (out1, out2)]
    assert sum(answered) > N, (out1, out2)  # both jobs answered some of the same questions
    assert_each_question_once(out, N)  # as pyarrow counts parts/
    assert f"rows {N} (answered {N}" in out1
    summary = json.loads(fs.cat(f"{bucket}/runs/both/summary.json"))
    assert summary["rows"] == N
