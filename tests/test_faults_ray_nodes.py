"""Fault injection, Ray cluster: a worker node lost mid-job costs nothing but time.

The cluster has a head with no CPUs and two worker nodes, each holding one engine replica (one fake GPU) and
one retrieval pool actor. Mid-job one worker goes: removed at once (its raylet and workers killed, as when a
machine dies) or pre-empted (SIGTERM to the node's processes, then removed); a replacement node joins a few
seconds later. Ray restarts the lost actors on it (Ray Data's engine actors; the pool's through its
max_restarts), Ray Data re-runs the batches the lost replica held, the surviving replica's searches that were
with the lost pool actor are sent again, and every question ends with exactly one row and no error.
Latency-model backends (jobs/bench/simulated.py): the faults are in the cluster, not the model."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from ray_jobs import assert_each_question_once, fake_gpu_cluster, run_job

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


def sigterm_node(node) -> None:
    """What a pre-empted machine's processes get: SIGTERM to the raylet and every process below it."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for p in [*raylet.children(recursive=True), raylet]:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


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
        on_report, state = lose_a_node(cluster, reports, how, after=4, replace_s=3.0)
        run_job(cluster, tmp_path, N, JOB, on_report=on_report, scale=0.05)
        assert state.get("replaced"), "the job ended before the replacement node joined"
        after = [r["replica"]["node"] for r in reports[state["lost_after"] :]]
        assert state["replaced"] in after  # the lost replica, restarted on the new node, answered again
        assert_each_question_once(tmp_path / "out", N)
