"""Fault injection, Ray: what would hang a job or kill it for nothing ends it with one line, or not at all.

One cluster for the file (a head with no CPUs, one worker with a fake GPU), the default batches per replica
(`ray.actor_batches` unset) and latency-model backends (jobs/bench/rig/simulated.py) with one fault each:
- a part write the store keeps refusing ends the job with one line naming the store and the error;
- a replica that takes longer to start than `ray.replica_wait_s` is not taken for one that never started:
  its heartbeat runs from its constructor's start;
- a constructor that fails counts in the replica's failure budget: the job ends with the budget's line;
- an engine call that never returns ends the job after `ray.stall_s` with one line naming the replica;
- a retrieval pool actor that dies on every call ends the job with one line once its restarts pass the budget.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ray_jobs import assert_each_question_once, fake_gpu_cluster, run_job

from pipeline.errors import DynragError

pytestmark = [pytest.mark.faults, pytest.mark.own_process, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray")

JOB = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1"]


@pytest.fixture(scope="module")
def cluster():
    with fake_gpu_cluster(workers=1, num_cpus=3, num_gpus=1) as c:
        yield c


def slow_start_backends(scale: float, seconds: float, markers: Path):
    """SimBackends that take `seconds` to build (a large index pulled, a model loaded), in the engine actor."""
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class SlowStart(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            (markers / f"start-{os.getpid()}").write_text("")
            time.sleep(seconds)
            return super().__call__(cfg, index_dir, **kw)

    markers.mkdir(parents=True, exist_ok=True)
    return SlowStart(scale)


def failing_start_backends(scale: float, markers: Path, times: int | None = None):
    """SimBackends whose construction fails (a model that cannot load on this node) always, or its first `times`
    times (an index pull cut short), counted by markers."""
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class FailingStart(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            (markers / f"start-{os.getpid()}-{time.monotonic_ns()}").write_text("")
            if times is None or len(list(markers.glob("start-*"))) <= times:
                raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
            return super().__call__(cfg, index_dir, **kw)

    markers.mkdir(parents=True, exist_ok=True)
    return FailingStart(scale)


def hanging_backends(scale: float, after: int):
    """SimBackends whose generator never answers from its `after`-th prompt on (a hung vLLM call)."""
    from concurrent.futures import Future
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class Hanging(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            backends = super().__call__(cfg, index_dir, **kw)
            generator, seen = backends._generator, []

            def submit(prompt, sampling, chat) -> Future:
                seen.append(prompt)
                if len(seen) >= after:
                    return Future()  # never resolved
                return type(generator).submit(generator, prompt, sampling, chat)

            generator.submit = submit
            return backends

    return Hanging(scale)


def dying_pool_backends(scale: float, markers: Path):
    """SimBackends whose retriever kills its process (a JVM crash) on every search: in a retrieval pool actor."""
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class DyingPool(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            backends = super().__call__(cfg, index_dir, **kw)
            if kw.get("retriever") is None:  # the pool actor's own retriever (an engine actor's is the pool)

                def search(queries, k, retriever):
                    (markers / f"death-{os.getpid()}").write_text("")
                    os._exit(1)

                backends.search = search
            return backends

    markers.mkdir(parents=True, exist_ok=True)
    return DyingPool(scale)


def refusing_store(scale: float):
    """SimBackends that first register the fsspec protocol `refusing://` in their process: a store that lists and
    reads, but refuses every write of rows (PermissionError: no retry helps), as a bucket without write access does
    (the driver's lease of the output passes: the parts' writes are the point here)."""
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    def register() -> None:  # the class made here, in the process that registers it (no lock to pickle)
        import fsspec
        from fsspec.implementations.memory import MemoryFileSystem

        class RefusingFS(MemoryFileSystem):
            protocol = "refusing"
            store: dict = {}
            pseudo_dirs = [""]

            def pipe_file(self, path, value, *args, **kwargs):
                if path.endswith("/_lease.json"):  # the driver's lease of the output (output_lock.py) is let through
                    return super().pipe_file(path, value, *args, **kwargs)
                raise PermissionError(13, "Access Denied", path)

            def put_file(self, lpath, rpath, *args, **kwargs):  # a part: written locally, then uploaded
                raise PermissionError(13, "Access Denied", rpath)

        fsspec.register_implementation("refusing", RefusingFS, clobber=True)

    @dataclass(frozen=True)
    class Refusing(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            register()
            return super().__call__(cfg, index_dir, **kw)

    register()
    return Refusing(scale)


def test_a_part_write_the_store_keeps_refusing_ends_the_job_with_one_line(cluster, tmp_path):
    """The store refuses every write (a permanent error: no retry helps): the job ends at its first part with the
    store and the error in one line, instead of parking the batch forever."""
    t0 = time.monotonic()
    with pytest.raises(DynragError, match=r"cannot write refusing://out/\S+: PermissionError: \[Errno 13\] Access"):
        run_job(cluster, tmp_path, 20, JOB, scale=0.02, make_backends=refusing_store(0.02), out="refusing://out")
    assert time.monotonic() - t0 < 120


def test_a_slow_first_start_is_not_taken_for_a_replica_that_never_started(cluster, tmp_path):
    markers = tmp_path / "markers"
    # the wait counts from the job's start: the actor's process start comes out of it (5 s and more while the
    # machine runs other tests, over 10 s at a load of 4), then its early heartbeat. The start outlasts the wait
    # by 5 s counted from the constructor's own start (a heartbeat sent once at that start, never again, would
    # end the job), and by more from the job's start (no heartbeat before the constructor's end would)
    job = [*JOB, "ray.replica_wait_s=15"]
    run_job(cluster, tmp_path, 20, job, scale=0.02, make_backends=slow_start_backends(0.02, 20.0, markers))
    assert len(list(markers.glob("start-*"))) == 1  # one start, not ended and restarted
    assert_each_question_once(tmp_path / "out", 20)


def test_a_constructor_that_always_fails_counts_in_the_replica_budget(cluster, tmp_path):
    markers = tmp_path / "markers"
    job = [*JOB, "ray.replica_failures=1"]
    with pytest.raises(
        DynragError, match=r"engine replica \w+ (could not start on node \w+|failed 2 times).*CUDA error"
    ):
        run_job(cluster, tmp_path, 20, job, scale=0.02, make_backends=failing_start_backends(0.02, markers))
    assert 1 <= len(list(markers.glob("start-*"))) <= 3  # bounded by the budget, not restarted forever


def test_a_constructor_that_fails_once_is_replaced_within_the_budget(cluster, tmp_path):
    """An engine actor whose first start fails (issue 78, item 7): Ray Data starts another in its place, as
    ray.replica_failures allows, and the job answers every question once."""
    markers = tmp_path / "markers"
    job = [*JOB, "ray.replica_failures=2"]
    run_job(cluster, tmp_path, 20, job, scale=0.02, make_backends=failing_start_backends(0.02, markers, times=1))
    assert len(list(markers.glob("start-*"))) >= 2
    assert_each_question_once(tmp_path / "out", 20)


def test_an_engine_call_that_never_returns_ends_the_job_naming_the_replica(cluster, tmp_path):
    job = [*JOB, "ray.stall_s=5"]
    t0 = time.monotonic()
    with pytest.raises(DynragError, match=r"engine replica \w+ \(pid \d+, node \w+\) holds batches but has made no"):
        run_job(cluster, tmp_path, 40, job, scale=0.02, make_backends=hanging_backends(0.02, after=15))
    assert time.monotonic() - t0 < 120


def test_a_pool_actor_that_dies_on_every_call_ends_the_job_with_one_line(cluster, tmp_path):
    markers = tmp_path / "markers"
    job = [*JOB, "ray.retrieval_actors=1", "ray.retrieval_actor_num_cpus=1", "ray.replica_failures=2"]
    with pytest.raises(DynragError, match=r"retrieval pool actor \w+ failed 3 times \(its process died"):
        run_job(cluster, tmp_path, 20, job, scale=0.02, make_backends=dying_pool_backends(0.02, markers))
    assert len(list(markers.glob("death-*"))) >= 3
