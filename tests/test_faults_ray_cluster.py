"""Fault injection, Ray cluster: a worker node lost mid-job, or an engine that dies, costs nothing but time.

The cluster has a head with no CPUs and two worker nodes, each holding one engine replica (one fake GPU) and
one retrieval pool actor. Mid-job one worker goes: removed at once (its raylet and workers killed, as when a
machine dies) or pre-empted (SIGTERM to the node's processes, then removed); a replacement node joins at the
next report. Ray restarts the lost actors (on it, or beside the survivor) (Ray Data's engine actors; the pool's through its
max_restarts), Ray Data re-runs the batches the lost replica held, the surviving replica's searches that were
with the lost pool actor are sent again, and every question ends with exactly one row and no error.
Latency-model backends (jobs/bench/simulated.py): the faults are in the cluster, not the model."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from ray_jobs import assert_each_question_once, dying_backends, fake_gpu_cluster, run_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from ray_preemption import sigterm_node  # noqa: E402  (the 3-node script's: one way to pre-empt a node)

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


def worker_with_a_replica(cluster, reports: list[dict]):
    """The worker node whose engine replica has answered a batch (a node of the cluster, not the head)."""
    nodes = {r["replica"]["node"] for r in reports}
    return next(n for n in cluster.worker_nodes if n.node_id in nodes)


def lose_a_node(cluster, reports: list[dict], how: str, after: int, replace_s: float):
    """An `on_report` that, once `after` batches are in, takes a replica's worker node away (`how`: "remove"
    or "sigterm") and, at the first report `replace_s` later, adds a replacement. On the driver's thread, as
    Ray's Cluster wants it (add_node sets a signal handler); the other replica's reports keep coming."""
    state: dict = {}

    def on_report(report: dict) -> None:
        reports.append(report)
        if len(reports) == after:
            node = worker_with_a_replica(cluster, reports)
            state["node"], state["workers"] = node.node_id, {n.node_id for n in cluster.worker_nodes}
            if how == "sigterm":
                sigterm_node(node)
                time.sleep(1.0)
            cluster.remove_node(node, allow_graceful=False)
            state["lost_at"], state["lost_after"] = time.monotonic(), len(reports)
        elif "lost_at" in state and "replaced" not in state and time.monotonic() - state["lost_at"] > replace_s:
            state["replaced"] = cluster.add_node(**NODE).node_id

    return on_report, state


@pytest.mark.parametrize("how", ["remove", "sigterm"])
def test_a_lost_worker_node_costs_nothing_but_time(tmp_path, how):
    with fake_gpu_cluster(workers=2, **NODE) as cluster:
        reports: list[dict] = []
        # the replacement joins at the next report: the surviving replica may finish the job before a restarted
        # one answers (it did under load), so what is asserted is the job's outcome, not who answered
        on_report, state = lose_a_node(cluster, reports, how, after=4, replace_s=0.0)
        run_job(cluster, tmp_path, N, JOB, on_report=on_report, scale=0.05)
        assert state.get("replaced"), "the job ended before the replacement node joined"
        assert len(reports) > state["lost_after"]  # the job went on after the loss
        assert_each_question_once(tmp_path / "out", N)


def test_an_engine_actor_whose_engine_died_exits_and_its_restart_answers_its_questions(tmp_path):
    """The engine dies (EngineDead) in the first replica process: the actor closes and exits, Ray starts it
    again, Ray Data sends its batches to the new process, and every question has one row, none an error."""
    markers = tmp_path / "markers"
    with fake_gpu_cluster(workers=1, **NODE) as cluster:
        job = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1"]
        reports = run_job(cluster, tmp_path, 60, job, scale=0.02, make_backends=dying_backends(0.02, markers, 1))
    assert len(list(markers.glob("death-*"))) == 1
    (died,) = [int(m.name.split("-")[1]) for m in markers.glob("death-*")]
    assert died not in {r["replica"]["pid"] for r in reports}  # the dead process answered nothing
    assert_each_question_once(tmp_path / "out", 60)


def test_an_engine_that_dies_again_and_again_stops_the_job_with_its_error(tmp_path):
    """After ENGINE_RESTARTS engine failures in one run the fault is taken to come back: the job fails with it
    (not an endless loop of restarts), and what was written stays for a rerun."""
    from pipeline.runtime.ray_runner import ENGINE_RESTARTS

    markers = tmp_path / "markers"
    with fake_gpu_cluster(workers=1, **NODE) as cluster:
        job = ["ray.actors=1", "ray.actor_num_gpus=1", "ray.actor_num_cpus=1"]
        with pytest.raises(Exception, match="engine core died"):
            run_job(cluster, tmp_path, 60, job, scale=0.02, make_backends=dying_backends(0.02, markers, 99))
    assert len(list(markers.glob("death-*"))) == ENGINE_RESTARTS + 1
