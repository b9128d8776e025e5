"""Resume: SIGKILL a real `dynrag answer` process part-way, rerun it, every question has exactly one row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
from engine_fixtures import HOTPOT, at_least, tiny_model_path
from on_disk import committed_files, committed_rows

N = 200


def _command(dataset: Path, model: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobs.cli",
        "--log-level",
        "WARNING",
        "answer",
        "--dataset",
        str(dataset),
        "--method",
        "no-retrieval",
        "--out",
        str(out),
        "--limit",
        str(N),
        "--no-progress",
        "--set",
        "generation.backend=transformers",
        "--set",
        f"generation.model={model}",
        "--set",
        "generation.max_new_tokens=16",
        "--set",
        "generation.max_model_len=4096",
        "--set",
        "answer.batch_questions=4",
    ]


def test_sigkill_then_resume(data_dir, tmp_path_factory, tmp_path):
    model = tiny_model_path(tmp_path_factory)
    dataset = at_least(data_dir, HOTPOT, N, tmp_path)  # the fixture kit's 15 questions repeat, ids suffixed
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        _command(dataset, model, out), cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 180
        while len(committed_files(out)) < 3:  # killed once a few batches are committed, long before the end
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline, "no part files appeared"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    first = pl.from_arrow(committed_rows(out, ("question_id", "run_id")))  # merged or not yet (merge.py)
    assert 0 < first.height < N, "the kill should land part-way"

    done = subprocess.run(_command(dataset, model, out), cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed past {first.height}" in done.stdout
    rows = pl.read_parquet(f"{out}/parts/*.parquet")
    assert rows.height == N and rows["question_id"].n_unique() == N
    assert rows["error"].null_count() == N
    # the rows written before the kill were kept as they were, not rewritten
    kept = rows.filter(pl.col("question_id").is_in(first["question_id"].to_list()))
    assert kept["run_id"].n_unique() == 1 and kept["run_id"][0] == first["run_id"][0]
