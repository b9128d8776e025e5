"""`dynrag bench scale` end to end at a tiny size (plumbing and the figures' arithmetic, no timings asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dynrag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", "--log-level", "WARNING", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_scale_json(tmp_path):
    r = dynrag(
        "bench",
        "scale",
        "--passages",
        "400",
        "--encoder",
        "hash",
        "--json",
        "--workdir",
        str(tmp_path),
        "--set",
        "index.shard_size=150",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["passages"] == 400 and out["encoder"] == "hash" and out["shards"] >= 2
    assert out["faiss_bytes_per_passage"] >= 384 * 4  # Flat, 384-d float32
    assert out["resident_bytes_per_passage"] == round((out["rss_delta_bytes"] - out["faiss_bytes"]) / 400, 1)
    assert (
        out["open_s"] > 0 and out["build_s_per_1k"] > 0 and set(out["build_s_per_1k_by_stage"]) >= {"lucene", "embed"}
    )
    assert abs(out["disk_bytes_per_passage"] - sum(out["disk_bytes_per_passage_by_file"].values())) < 1
    assert len((tmp_path / "corpus.jsonl").read_text().splitlines()) == 400


def test_bench_scale_bad_size_is_one_line():
    r = dynrag("bench", "scale", "--passages", "0")
    assert r.returncode == 2 and r.stderr.strip() == "dynrag: error: --passages must be at least 1, got 0"
