"""The driver's RunControl as its engine actors use it, without Ray (ray_control.py): failure budgets per
replica that count restarts but not a drained node's, poison batches, drains (the driver's and a node's) and
the drained replicas counted by live replica; and the pure decisions of the Ray runner (a misplaced
tensor-parallel actor, a job with no replica running)."""

from __future__ import annotations

import math
import time

from pipeline.runtime.ray_control import DRAIN_MARGIN_S, RunControl
from pipeline.runtime.ray_runner import misplaced, stalled


def test_a_replicas_restarts_count_against_its_budget_unless_it_drained_before():
    control = RunControl(budget=2)
    assert control.register("a1", "A", 10) == 0
    assert control.register("a1", "B", 11) == 1  # its process died: a restart is a failure
    control.drained("a1")
    assert control.register("a1", "B", 12) == 1  # drained (its node was pre-empted): not its fault
    assert control.register("a2", "A", 20) == 0  # another replica's budget is its own
    assert control.fatal() is None
    assert control.register("a1", "C", 13) == 2
    assert control.register("a1", "C", 14) == 3 and "a1" in control.fatal() and "budget 2" in control.fatal()


def test_an_engine_failure_counts_once_and_its_restart_is_not_counted_again():
    control = RunControl(budget=1)
    control.register("a1", "A", 10)
    assert control.engine_failed("a1", "EngineDead('core died')") is True  # restart it
    assert control.register("a1", "A", 11) == 1  # the same failure, not a second one
    assert control.engine_failed("a1", "EngineDead('core died')") is False  # over budget: the job ends
    assert "EngineDead" in control.fatal()


def test_a_batch_whose_attempts_died_is_known_to_the_next_attempt():
    control = RunControl()
    control.register("a1", "node-A", 10)
    assert control.begin("k1", "a1", 10) == []
    assert [d["pid"] for d in control.begin("k1", "a1", 11)] == [10]  # the first attempt never ended
    dead = control.begin("k1", "a1", 12)
    assert [d["pid"] for d in dead] == [10, 11] and dead[0]["node"] == "node-A"
    control.end("k1")
    assert control.begin("k1", "a1", 13) == []  # an ended batch starts afresh
    control.begin("k2", "a1", 13)
    control.end("k2")
    assert control.begin("k2", "a1", 13) == []


def test_the_drain_reaches_each_replica_from_the_driver_or_from_its_node():
    control = RunControl()
    control.register("a1", "A", 10), control.register("a2", "B", 20)
    assert control.instructions("a1") is None
    control.set_draining({"B": time.time() + 60})  # Ray's drain notice for node B, 60 s deadline
    assert control.instructions("a1") is None
    seconds, why = control.instructions("a2")
    assert 60 - DRAIN_MARGIN_S - 1 < seconds <= 60 - DRAIN_MARGIN_S and "node" in why
    control.set_draining({"B": math.inf})  # no deadline given: finish what is in flight
    assert control.instructions("a2")[0] == math.inf
    control.request(30.0)
    control.request(1000.0)  # the first deadline holds
    seconds, why = control.instructions("a1")
    assert 29.0 < seconds <= 30.0 and why == "the job is stopping"


def test_drained_replicas_are_counted_by_live_replica():
    control = RunControl()
    control.register("a1", "A", 10), control.register("a2", "B", 20)
    control.drained("a1"), control.drained("a1")
    assert control.drained_count() == 1
    control.register("a1", "C", 11)  # restarted elsewhere after its node drained: serving again
    control.drained("a2")
    assert control.drained_count() == 1  # not 2: the driver must not stop while a1 still answers
    control.drained("a1")
    assert control.drained_count() == 2


def test_heartbeats_and_a_job_whose_replicas_never_come_back():
    control = RunControl()
    assert control.last_seen() is None
    control.register("a1", "A", 10)
    before = control.last_seen()
    time.sleep(0.01)
    control.instructions("a1")
    assert control.last_seen() > before
    assert stalled(None, started=0.0, now=100.0, wait_s=300) is None
    line = stalled(None, started=0.0, now=301.0, wait_s=300)
    assert "no engine replica has started for 301 s" in line and "ray.replica_wait_s=300" in line
    assert "has been running" in stalled(10.0, started=0.0, now=400.0, wait_s=300)
    assert stalled(390.0, started=0.0, now=400.0, wait_s=300) is None


def test_a_tensor_parallel_actor_must_sit_in_its_group_on_the_groups_node():
    assert misplaced("n1", {"n1"}, in_group=True) is None
    assert "in no placement group" in misplaced("n1", set(), in_group=False)
    assert "not on its group's" in misplaced("n2", {"n1"}, in_group=True)
