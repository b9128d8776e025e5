"""Fault injection, answer jobs: real `dynrag answer` processes get real signals.

SIGKILL of the driver at several points (after a part, mid-batch by timing) while other jobs load
the machine, SIGTERM and SIGINT (clean stop after the finished rows), two jobs on one output folder
(refused; a dead job's lock is taken over), and with Ray a killed engine actor (retried, the job
completes) and a killed driver (resumes). After the rerun every question has exactly one row.
generation.backend=none keeps the model out of it: the faults are in the job, not the model.
"""

from __future__ import annotations

import os
import signal
import time

import fsspec
import polars as pl
import psutil
import pytest
from fault_tools import env_for, kill_at, kill_group, no_model_answer, run, run_until_paused, start
from on_disk import assert_each_question_once, committed_files, committed_rows, rows_on_disk

pytestmark = [pytest.mark.faults, pytest.mark.timeout(1800)]


RAY = ["--set", "runtime.mode=ray", "--set", "ray.num_cpus=2", "--set", "ray.actors=1"]


def rows_of(out):
    """The rows the driver committed: parts/ and the batches not merged yet (on_disk.committed_rows)."""
    return pl.from_arrow(committed_rows(out))


def assert_exactly_once(out, n):
    """Every question answered, on disk once as pyarrow counts parts/ (a batch answered twice, as after a drained
    actor, is committed once), no attempt left staged and no partial part left behind."""
    assert_each_question_once(out, n)
    assert not list((out / "parts").glob(".*.tmp")), "a partial part file was left behind"


# one batch held at a time: the next is submitted only once the driver has taken the previous one's report, so
# a driver paused at its first report holds the run there, and parts land one by one (with more held, the
# batches go on answering meanwhile and land together)
ONE_BATCH = ["--set", "ray.actor_batches=1"]


def test_sigkill_at_several_points_under_load_then_resume(nq_dev, tmp_path):
    n, out, pauses = 600, tmp_path / "run", tmp_path / "pauses"
    load = [start(no_model_answer(nq_dev, tmp_path / f"load{i}", 3610), env_for()) for i in range(2)]
    try:
        killed = kill_at(no_model_answer(nq_dev, out, n, *ONE_BATCH), "answer.part_written", pauses)  # after a part
        assert killed.returncode == -signal.SIGKILL
        after_first = rows_of(out).height
        assert 0 < after_first < n
        for _ in range(2):  # by timing: as soon as one more batch is committed, mid-way through the next batch
            proc = start(no_model_answer(nq_dev, out, n, *ONE_BATCH), env_for())
            before = len(committed_files(out))
            while len(committed_files(out)) == before and proc.poll() is None:
                time.sleep(0.005)
            time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        seen = rows_on_disk(out)["question_id"]  # as a reader of parts/ counts them
        assert len(set(seen.to_pylist())) == len(seen)  # never a duplicate, even mid-run
    finally:
        for p in load:
            kill_group(p)
    done = run(no_model_answer(nq_dev, out, n))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed past" in done.stdout
    assert_exactly_once(out, n)


def assert_stopped_cleanly(stopped, out):
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert "interrupted" in stopped.stderr and "rerun the same command" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert not (out / ".dynrag.lock").exists()  # released and removed on the way out


def test_ctrl_c_stops_at_once_after_the_finished_rows(nq_dev, tmp_path):
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    stopped = kill_at(no_model_answer(nq_dev, out, n, *ONE_BATCH), "answer.part_written", pauses, signal.SIGINT)
    assert_stopped_cleanly(stopped, out)
    assert rows_of(out).height == 25  # the finished batch was flushed, nothing more
    done = run(no_model_answer(nq_dev, out, n))
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(out, n)


@pytest.mark.parametrize("mode", ["in-process", "ray"])
def test_sigterm_drains_writes_every_finished_answer_and_the_rerun_answers_the_rest(nq_dev, tmp_path, mode):
    """One batch larger than the dataset, so no part is written before the signal: the answers finished by
    then (at least 10) and those in flight (answer.max_in_flight bounds them) are written by the drain."""
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    big = ["--set", "answer.batch_questions=1000", "--set", "answer.max_in_flight=16"]
    cmd = no_model_answer(nq_dev, out, n, *big, *(RAY if mode == "ray" else []))
    stopped = kill_at(cmd, "engine.question_done@10", pauses, signal.SIGTERM)  # in the engine actor with Ray
    assert_stopped_cleanly(stopped, out)
    assert 10 <= rows_of(out).height < n, rows_of(out).height
    done = run(no_model_answer(nq_dev, out, n, *big))
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(out, n)


def test_two_jobs_on_one_output_are_refused_and_a_dead_jobs_lock_is_taken_over(nq_dev, tmp_path):
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    first = run_until_paused(no_model_answer(nq_dev, out, n, *ONE_BATCH), "answer.part_written", pauses)
    try:
        second = run(no_model_answer(nq_dev, out, n))
        assert second.returncode == 2
        assert f"in use by another answer job (pid {first.pid} on host" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        kill_group(first)
    assert rows_of(out).height == 25  # the refused job wrote nothing
    third = run(no_model_answer(nq_dev, out, n), timeout=600)
    assert third.returncode == 0, third.stderr[-2000:]
    assert_exactly_once(out, n)


def test_ray_engine_actor_killed_is_retried_and_the_job_completes(nq_dev, tmp_path):
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    proc = run_until_paused(no_model_answer(nq_dev, out, n, *RAY), "ray.engine_batch", pauses)
    try:
        actor = int((pauses / "ray.engine_batch").read_text())
        assert actor != proc.pid  # the pause is inside the Ray actor's process
        os.kill(actor, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"rows {n} (answered {n}" in stdout
    assert_exactly_once(out, n)


def test_ray_engine_actor_sigterm_drains_then_its_batches_run_again_and_the_job_completes(nq_dev, tmp_path):
    """A pre-empted node's processes get SIGTERM: the engine actor, paused after its tenth question, finishes
    and stages what it holds (its first attempt comes after the signal, from its own process), then exits;
    Ray restarts it and Ray Data re-runs the batches it left, and the driver commits one attempt per batch.
    The job ends with every question once on disk, no error row."""
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    cmd = no_model_answer(nq_dev, out, n, *RAY, "--set", "answer.max_in_flight=16")
    proc = start(cmd, env_for("engine.question_done@10,ray.part_written", pauses))
    try:
        marker, deadline = pauses / "engine.question_done@10", time.time() + 600
        while not (marker.exists() and marker.read_text()):
            assert proc.poll() is None and time.time() < deadline, "never paused after ten questions"
            time.sleep(0.05)
        actor = int(marker.read_text())
        assert actor != proc.pid and not (pauses / "ray.part_written").exists()  # nothing written yet
        os.kill(actor, signal.SIGTERM)
        psutil.Process(actor).wait(timeout=120)  # it drained, wrote and went
        assert int((pauses / "ray.part_written").read_text()) == actor  # the drain's part, by the actor itself
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"rows {n} (answered {n}" in stdout
    assert_exactly_once(out, n)


def test_ray_driver_sigkilled_leaves_no_ray_process_and_resumes_on_rerun(nq_dev, tmp_path):
    n, out, pauses = 200, tmp_path / "run", tmp_path / "pauses"
    # paused in the driver right after it committed its first part (the actors go on staging attempts, which
    # the driver never commits: the rerun removes them and answers their questions again)
    proc = run_until_paused(
        no_model_answer(nq_dev, out, n, *RAY, "--set", "ray.batch_questions=25"), "answer.part_written", pauses
    )
    try:
        ray_processes = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(ray_processes, timeout=60)
        assert not alive, f"outlived the SIGKILLed driver: {[p.name() for p in alive]}"
    finally:
        kill_group(proc)
    assert 0 < rows_of(out).height < n
    done = run(no_model_answer(nq_dev, out, n, *RAY))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once(out, n)


@pytest.mark.parametrize("step", ["commit.merging", "commit.merged"])
@pytest.mark.parametrize("shape", ["default", "small parts"])
def test_sigkill_during_a_merge_leaves_each_question_once_and_the_rerun_finishes(nq_dev, tmp_path, shape, step):
    """Killed before a merge writes its part, or between writing it and removing the batches it took
    (pipeline/io/merge.py): at the close's merge (default part_mb), or at the third merge of a run of small
    parts. A reader of parts/ counts each question at most once meanwhile; the rerun removes the merged batches,
    merges the rest and answers what is left: each question once."""
    n, out, pauses = 300, tmp_path / "run", tmp_path / "pauses"
    small = ["--set", "answer.part_mb=0.01"] if shape == "small parts" else []
    killed = kill_at(no_model_answer(nq_dev, out, n, *small), f"{step}@3" if small else step, pauses)
    assert killed.returncode == -signal.SIGKILL
    seen = rows_on_disk(out)["question_id"].to_pylist()
    assert len(seen) == len(set(seen)) <= n  # each at most once; the batches merging hidden in _committed/
    assert (len(seen) > 0) == (step == "commit.merged" or bool(small))
    assert (out / "_committed").is_dir() and list((out / "_committed").glob("*.parquet"))
    done = run(no_model_answer(nq_dev, out, n, *small))
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(out, n)
    assert not list((out / "_committed").glob("*.parquet"))
    assert "repaired" not in (out / "dynrag.log").read_text()  # the part's footer named them: no row read twice


def test_parts_are_sized_for_their_readers(nq_dev, tmp_path):
    """answer.part_mb: every part of a run but its last is at least that size, its footer names the batches it
    holds, and nothing stays committed unmerged."""
    from pipeline.io.merge import merged_keys

    n, out = 600, tmp_path / "run"
    done = run(no_model_answer(nq_dev, out, n, "--set", "answer.part_mb=0.02"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert_exactly_once(out, n)
    parts = sorted((out / "parts").glob("*.parquet"))
    sizes = [p.stat().st_size for p in parts]
    assert len(parts) >= 3 and min(sizes[:-1]) >= 0.02 * 2**20, sizes
    keys = [k for p in parts for k in merged_keys(fsspec.filesystem("file"), str(p))]
    assert len(keys) == len(set(keys)) == n // 25  # every batch of 25, in one part
    assert not list((out / "_committed").glob("*.parquet"))
