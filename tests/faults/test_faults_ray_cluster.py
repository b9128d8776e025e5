"""Fault injection, Ray cluster: a worker node lost mid-job, or an engine that dies, costs nothing but time.

The cluster has a head with no CPUs and two worker nodes, each holding one engine replica (one fake GPU) and
one retrieval pool actor. Mid-job one worker goes: removed at once (its raylet and workers killed, as when a
machine dies) or pre-empted (Ray's drain notice with a deadline; removed once its replica has gone, or at the
deadline); a replacement node joins then. Ray restarts the lost actors (on it, or beside the survivor) (Ray Data's engine actors; the pool's through its
max_restarts), Ray Data re-runs the batches the lost replica held, the surviving replica's searches that were
with the lost pool actor are sent again, and every question ends with exactly one row and no error.
Latency-model backends (jobs/bench/rig/simulated.py): the faults are in the cluster, not the model."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from on_disk import rows_on_disk
from ray_jobs import assert_each_question_once, dying_backends, fake_gpu_cluster, run_job

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from rayjob_local import drain_node  # noqa: E402  (the RayJob script's: `ray drain-node`, the command)

pytestmark = [pytest.mark.faults, pytest.mark.own_process, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray")

N = 240
NODE = dict(num_cpus=3, num_gpus=1)
JOB = [
    "ray.actors=2",
    "ray.actor_num_gpus=1",
    "ray.actor_num_cpus=1",
    "ray.retrieval_actors=2",
    "ray.retrieval_actor_num_cpus=1",
]


@pytest.fixture(scope="module")
def cluster():
    """The file's cluster, two worker nodes (NODE): it outlives each test's job (a cluster's start and shutdown
    cost ~10 s each). A test that loses a node leaves two workers again (the lost one replaced); the tests that
    lose one come last, drained before removed (a drained node is never chosen again while it goes)."""
    with fake_gpu_cluster(workers=2, **NODE) as c:
        yield c


def worker_with_a_replica(cluster, reports: list[dict]):
    """The worker node whose engine replica has answered a batch (a node of the cluster, not the head)."""
    nodes = {r["replica"]["node"] for r in reports}
    return next(n for n in cluster.worker_nodes if n.node_id in nodes)


def lose_a_node(cluster, reports: list[dict], how: str, after: int, deadline_s: float = 60.0):
    """An `on_report` that, once `after` batches are in, takes a replica's worker node away and adds a
    replacement. `how`: "remove" (at once, as when a machine dies) or "drain" (Ray's pre-emption notice,
    `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds`, as autoscaler v2
    gives a spot node; the node is removed once the replica processes on it have gone, or at the deadline).
    Drained, a thread watches the node's replica processes (their exit need not come before another
    report: the job may be ending); the node is removed and replaced on the driver's thread, as Ray's Cluster
    wants it, at the next report; the other replica's reports keep coming."""
    import threading

    import psutil

    state: dict = {}

    def replace(node) -> None:
        cluster.remove_node(node, allow_graceful=False)
        state["removed_s"] = time.monotonic() - state["at"]
        state["replaced"] = cluster.add_node(**NODE).node_id

    def watch(pids: set[int]) -> None:
        while time.monotonic() - state["at"] < deadline_s:
            if not any(psutil.pid_exists(p) for p in pids):
                state["exited_s"] = time.monotonic() - state["at"]
                return
            time.sleep(0.1)

    def on_report(report: dict) -> None:
        reports.append(report)
        if len(reports) == after:
            node = worker_with_a_replica(cluster, reports)
            state.update(node=node, at=time.monotonic(), lost_after=len(reports))
            state["pids"] = {r["replica"]["pid"] for r in reports if r["replica"]["node"] == node.node_id}
            if how == "remove":
                replace(node)
            else:
                drain_node(cluster.address, node.node_id, int(deadline_s))
                threading.Thread(target=watch, args=(state["pids"],), daemon=True).start()
        elif "at" in state and "replaced" not in state:
            if "exited_s" in state or time.monotonic() - state["at"] > deadline_s:
                replace(state["node"])

    return on_report, state


@pytest.mark.slow  # see the note below: `make test-slow`
@pytest.mark.parametrize("tp", [1, 2])
def test_a_job_whose_replicas_can_never_start_ends_with_one_line(tmp_path, tp):
    """The engine actors ask for a resource no node has (as when a GPU group never comes back; with tensor
    parallelism, a placement group that cannot be placed, which the actor started in it waits for): after
    ray.replica_wait_s the job ends with one line saying so and what each replica asks for, instead of waiting
    for ever.
    Known weakness: the stream's reader thread is left waiting on the actors that never started; when Ray then
    shuts down, Ray ends that thread with SystemExit, and under pytest's output capture in a shared process
    this has ended the whole test process (passes alone, and with -s). Kept out of the faults suite."""
    from pipeline.errors import DynragError

    job = ["ray.actors=1", "ray.actor_num_cpus=1", "ray.actor_resources={tpu_slice: 1}", "ray.replica_wait_s=8"]
    asks = r"asks for 1 CPU"
    if tp == 2:
        job += ["generation.engine_kwargs.tensor_parallel_size=2", "ray.actor_num_gpus=2"]
        # the actor in its group's first bundle (GroupDealer), which the line names with the actor's CPU in it
        asks = r"placement group of \[\{'CPU': 2.0, 'GPU': 1.0, 'tpu_slice': 1.0\}, \{'GPU': 1.0\}\] on one node"
    with fake_gpu_cluster(workers=1, num_cpus=3, num_gpus=2) as cluster:
        t0 = time.monotonic()
        started = r"no engine replica has started for \d+ s .*"
        with pytest.raises(DynragError, match=rf"{started}.*{asks}"):
            run_job(cluster, tmp_path, 20, job, scale=0.02)
        assert time.monotonic() - t0 < 60


def test_an_engine_actor_whose_engine_died_exits_and_its_restart_answers_its_questions(cluster, tmp_path):
    """The engine dies (EngineDead) in the first replica process: the actor closes and exits, Ray starts it
    again, Ray Data sends its batches to the new process, and every question has one row, none an error."""
    markers = tmp_path / "markers"
    job = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1"]
    reports = run_job(cluster, tmp_path, 60, job, scale=0.02, make_backends=dying_backends(0.02, markers, 1))
    assert len(list(markers.glob("death-*"))) == 1
    (died,) = [int(m.name.split("-")[1]) for m in markers.glob("death-*")]
    assert died not in {r["replica"]["pid"] for r in reports}  # the dead process answered nothing
    assert_each_question_once(tmp_path / "out", 60)


def test_an_engine_that_dies_again_and_again_stops_the_job_with_its_error(cluster, tmp_path):
    """After ray.replica_failures failures of one replica the fault is taken to come back: the job fails with
    it (not an endless loop of restarts), and what was written stays for a rerun."""
    markers = tmp_path / "markers"
    job = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1", "ray.replica_failures=2"]
    with pytest.raises(Exception, match="engine core died"):
        run_job(cluster, tmp_path, 60, job, scale=0.02, make_backends=dying_backends(0.02, markers, 99))
    assert len(list(markers.glob("death-*"))) == 2 + 1


def poison_backends(scale: float, markers: Path):
    """SimBackends whose generator kills its process (os._exit, as a host OOM or a native crash would) on any
    prompt that holds "poison"; each death leaves a marker file. Defined here so Ray pickles it by value."""
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends

    @dataclass(frozen=True)
    class PoisonBackends(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            backends = super().__call__(cfg, index_dir, **kw)
            generator = backends._generator

            def submit(prompt, sampling, chat):
                if "poison" in str(prompt):
                    (markers / f"death-{os.getpid()}").write_text("")
                    os._exit(1)
                return type(generator).submit(generator, prompt, sampling, chat)

            generator.submit = submit
            return backends

    markers.mkdir(parents=True, exist_ok=True)
    return PoisonBackends(scale)


def test_a_batch_that_kills_its_replica_becomes_error_rows_after_ray_batch_deaths(cluster, tmp_path):
    """One question kills its replica's process whenever it is answered, while the replica holds every batch
    (the default ray.actor_batches). Ray restarts the actor and Ray Data sends the batches again; each batch
    that died runs alone in the new process, so the innocent ones are answered and only the poison batch dies
    again; after ray.batch_deaths (2) deaths, one alone, its next attempt writes its questions as error rows with
    the cause instead of dying once more. On disk: each question once, the poison batch's 10 as error rows."""
    import json

    import polars as pl

    markers = tmp_path / "markers"
    n = 30
    questions = [{"id": f"q{i}", "question": f"Who wrote book {i}?"} for i in range(n)]
    questions[7]["question"] = "Who wrote the poison book?"
    job = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1"]
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text("".join(json.dumps(q) + "\n" for q in questions))
    run_job(cluster, tmp_path, n, job, scale=0.02, make_backends=poison_backends(0.02, markers), dataset=dataset)
    assert len(list(markers.glob("death-*"))) == 2  # then given up, not a third death
    assert_each_question_once(tmp_path / "out", n, errors=10)
    rows = pl.from_arrow(rows_on_disk(tmp_path / "out", ("question_id", "error", "error_kind")))
    failed = rows.filter(pl.col("error").is_not_null())
    assert "q7" in failed["question_id"].to_list() and failed.height == 10  # its batch (answer.batch_questions)
    assert set(failed["error_kind"]) == {"system"}
    assert "died 2 times while answering it" in failed["error"][0]


# last: they take a node away (and put another in its place)
@pytest.mark.parametrize("how", ["drain", "remove"])
def test_a_lost_worker_node_costs_nothing_but_time(cluster, tmp_path, how):
    """Either way every question ends with one row and no error. Drained, the node's replica finishes what it
    holds, writes it and exits on its own well before the deadline (without the drain it would run on until
    the node is removed at the deadline, and this test fails)."""
    reports: list[dict] = []
    on_report, state = lose_a_node(cluster, reports, how, after=4)
    # slow enough that the job outlasts the drain's notice (the supervisor's and the replica's polls); drained,
    # each replica holds 2 batches at a time, so that the job's reports come through it and not all at its end
    # (a batch is one block now: every batch reaches the replicas at once, and held whole they all end together)
    job, n = (JOB, N) if how == "remove" else ([*JOB, "ray.actor_batches=2"], 3 * N)
    run_job(cluster, tmp_path, n, job, on_report=on_report, scale=0.05 if how == "remove" else 0.4)
    state["job_ended_s"] = time.monotonic() - state["at"]
    assert len(reports) > state["lost_after"]  # the job went on after the loss
    if how == "remove":
        assert state.get("replaced"), "the job ended before the node was replaced"
    else:  # exited on its own while the job went on (at the job's end the driver removes every replica)
        assert state.get("exited_s") is not None and state["exited_s"] < min(50, state["job_ended_s"]), state
    assert_each_question_once(tmp_path / "out", n)
    if "replaced" not in state:  # the job ended before the drained node was replaced: two workers for the next
        cluster.remove_node(state["node"], allow_graceful=False)
        cluster.add_node(**NODE)
