"""`dynrag bench questions` end to end at a tiny N: the demo index built, N synthesized questions answered in a
child process and resumed, the rows counted by pyarrow; in-process and (a cluster test) through a local Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.bench.questions import add_growth, write_questions
from jobs.bench.rig.questions_child import kind_of

ROOT = Path(__file__).resolve().parents[2]
N = 300


def bench(tmp_path: Path, runtime: str, *extra: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "--log-level", "WARNING", "bench", "questions", "--sizes", str(N)]
        + ["--runtimes", runtime, "--work", str(tmp_path), "--json", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def check_run(r: dict, runtime: str, work: Path) -> None:
    assert (r["n"], r["runtime"]) == (N, runtime)
    assert r["rows"] == r["distinct_ids"] == r["summary_rows"] == N and r["error_rows"] == r["summary_errors"] == 0
    assert r["resume_skipped"] == N and r["resume_rows_after"] == N  # the resume answered nothing again
    for key in (
        "wall_s",
        "questions_per_s",
        "driver_cpu_s",
        "driver_peak_rss_bytes",
        "resume_s",
        "parquet_bytes",
        "driver_peak_private_bytes",
    ):
        assert r[key] > 0, key
    assert r["parquet_files"] >= 1 and r["other_files"] >= 1 and r["driver_rss_growth_bytes"] == 0
    assert r["driver_peak_private_bytes"] <= r["driver_peak_rss_bytes"]
    assert 0 <= r["last_answer_to_return_s"] < r["wall_s"]
    # the figures are those of the output left in --work: pyarrow reads the same rows there
    import pyarrow.dataset as pads

    assert pads.dataset(str(work / f"out-{N}-{runtime}" / "parts"), format="parquet").count_rows() == N


def test_questions_are_cycled_with_unique_ids(tmp_path):
    pool = [{"id": "a", "question": "qa", "answer": ["x"]}, {"id": "b", "question": "qb", "answer": ["y"]}]
    write_questions(tmp_path / "q.jsonl", 5, pool)
    rows = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a-0", "b-1", "a-2", "b-3", "a-4"]
    assert [r["question"] for r in rows] == ["qa", "qb", "qa", "qb", "qa"] and rows[1]["answer"] == ["y"]


def test_ray_processes_are_classified_by_title_and_rss_growth_is_from_the_smallest_n():
    assert kind_of("ray::MapWorker(MapBatches(EngineActor))") == "engine"
    assert kind_of("ray::PoolActor.search") == "pool"
    assert kind_of("ray::IDLE") == kind_of("ray::ReadQuestionSource") == "ray_workers"
    assert kind_of("/usr/bin/gcs_server --port 1") == kind_of("ray::DashboardAgent") == "ray_services"
    runs = [
        {"runtime": "local", "n": 10, "driver_peak_rss_bytes": 5, "driver_peak_private_bytes": 4},
        {"runtime": "local", "n": 1, "driver_peak_rss_bytes": 3, "driver_peak_private_bytes": 1},
    ]
    add_growth(runs)
    assert [r["driver_rss_growth_bytes"] for r in runs] == [2, 0]
    assert [r["driver_private_growth_bytes"] for r in runs] == [3, 0]


def test_bench_questions_local(tmp_path):
    out = bench(tmp_path, "local")
    w = out["workload"]
    assert w["method"] == "sr-rag" and w["generation"] == "none" and w["passages"] > 10_000
    assert w["distinct_questions"] > 2000
    (r,) = out["runs"]
    check_run(r, "local", tmp_path)
    assert "engine_cpu_s" not in r  # in-process: the driver does everything


@pytest.mark.slow  # starts a local Ray in the bench's child (~30 s): `make test-slow`; CI runs the local one
def test_bench_questions_ray(tmp_path):
    """Through Ray with a retrieval pool: the engine actors and the pool actor each measured, and the same searches
    measured in one process alone, for the pool's CPU a query to be read against."""
    extra = ("--ray-actors", "2", "--set", "ray.retrieval_actors=1", "--set", "ray.num_cpus=4")
    out = bench(tmp_path, "ray", *extra)
    (r,) = out["runs"]
    check_run(r, "ray", tmp_path)
    assert r["engine_processes"] == 2 and r["engine_cpu_s"] > 0 and r["pool_processes"] == 1 and r["pool_cpu_s"] > 0
    assert len(r["engine_cpu_s_each"]) == 2 and min(r["engine_cpu_s_each"]) > 0
    assert r["ray_services_processes"] >= 2  # gcs_server and raylet at least
    alone = out["workload"]["search_alone"]
    assert alone["n"] == N and alone["search_cpu_s"] > 0


def test_bad_options_are_refused_in_one_line(tmp_path, capsys):
    from jobs.cli import main

    for args, says in (
        (["--sizes", "0"], "--sizes: each N must be at least 1"),
        (["--sizes", "ten"], "--sizes takes comma-separated counts"),
        (["--runtimes", "local,gpu"], "--runtimes takes local and ray"),
        (["--ray-actors", "0"], "--ray-actors must be at least 1"),
    ):
        assert main(["bench", "questions", "--work", str(tmp_path / "w"), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "w").exists()  # refused before anything is written
