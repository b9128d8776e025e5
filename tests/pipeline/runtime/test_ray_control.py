"""The driver's RunControl as its engine actors use it, without Ray (ray_control.py): failure budgets per
replica that count restarts but not a drained node's, poison batches, drains (the driver's and a node's) and
the drained replicas counted by live replica; and the pure decisions of the Ray runner (a misplaced
tensor-parallel actor, a job with no replica running)."""

from __future__ import annotations

import math
import time

from pipeline.runtime.ray_control import DRAIN_MARGIN_S, RunControl
from pipeline.runtime.ray_host import misplaced
from pipeline.runtime.ray_runner import Turns, poison, stalled


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


def test_a_tensor_parallel_host_must_sit_in_its_group_on_the_groups_node():
    assert misplaced("n1", {"n1"}, in_group=True) is None
    assert "in no placement group" in misplaced("n1", set(), in_group=False)
    assert "not on its group's" in misplaced("n2", {"n1"}, in_group=True)


def test_an_engine_actor_claims_a_free_group_keeps_it_across_restarts_and_never_gets_a_held_one():
    """Placement groups go to the actors that use them, by actor id (Ray restarts an actor under its id), not
    by how often Ray Data asked for options: a third actor while both groups are held is refused, not parked."""
    control = RunControl()
    assert control.claim_group("a", 2) == 0 and control.claim_group("b", 2) == 1
    assert control.claim_group("a", 2) == 0  # restarted: its own group again
    assert control.claim_group("c", 2) is None  # never the group another actor holds


def test_groups_are_dealt_to_starting_actors_claimed_where_placed_and_freed_by_a_failed_start():
    """Ray Data asks for a new engine actor's options (`GroupDealer`): starts before any claim get groups in
    turn; an actor claims the group Ray placed it in, never one another holds; a constructor that fails frees its
    group, which the actor Ray Data starts next (a new actor id) is dealt, whichever group an options query
    without a start (Ray Data's memory detector) was dealt last."""
    control = RunControl(budget=3)
    assert [control.deal_group(3), control.deal_group(3), control.deal_group(3)] == [0, 1, 2]
    assert control.claim_group("b", 3, placed=1) == 1 and control.claim_group("a", 3, placed=0) == 0
    assert control.claim_group("c", 3, placed=2) == 2 and control.claim_group("d", 3) is None  # every group held
    for _ in range(4):  # options asked for without an actor: no group is held for them
        control.deal_group(3)
    for failed, group in (("b", 1), ("a", 0), ("c", 2)):
        control.register(failed, "n1", 10)
        control.start_failed(failed, "n1", "the index pull was cut")
        assert control.claim_group("x", 3, placed=(group + 1) % 3) is None  # another's: never two in one group
        assert control.deal_group(3) == group  # the replacement goes where the failed actor was
        assert control.claim_group(f"{failed}2", 3, placed=group) == group


def test_only_a_batch_that_died_alone_is_poison_and_a_lost_nodes_deaths_are_forgotten():
    """Three batches held by one process that a poison batch kills: each is charged a death, none is poison yet;
    each runs alone next; the poison one dies alone and is given up at its next attempt, the others are not.
    Attempts on a node Ray lost are not deaths."""
    control = RunControl(budget=3, batch_deaths=2)
    control.register("a1", "n1", 10)
    for key in ("poison", "b", "c"):
        control.begin(key, "a1", 10)  # held together; the process dies
    control.register("a1", "n1", 11)
    again = {key: control.begin(key, "a1", 11) for key in ("poison", "b", "c")}
    assert all(len(d) == 1 and not poison(d, 2) for d in again.values())  # one death each, shared
    control.alone("poison", 11)  # run alone: dies
    control.register("a1", "n1", 12)
    assert poison(control.begin("poison", "a1", 12), 2)  # two deaths, one alone: given up
    for key in ("b", "c"):  # they waited for their turn when the process died: two deaths, none alone
        dead = control.begin(key, "a1", 12)
        assert len(dead) == 2 and not poison(dead, 2)
        control.end(key)
    control.begin("d", "a1", 12)
    control.set_lost(["n1"])  # the node went: not the batch's fault
    control.register("a1", "n2", 13)
    assert control.begin("d", "a1", 13) == []


def test_a_node_whose_drain_was_cancelled_is_no_longer_lost():
    control = RunControl()
    control.register("a1", "n1", 10)
    control.set_lost(["n1"])  # draining
    control.set_lost([])  # the drain was cancelled: n1 stays in the cluster
    control.begin("b", "a1", 10)  # its process dies with the batch: the batch's doing
    control.register("a1", "n1", 11)
    assert [d["pid"] for d in control.begin("b", "a1", 11)] == [10]


def test_a_busy_replica_or_a_pool_call_without_progress_is_named():
    control = RunControl()
    control.register("a1", "n1", 10)
    t0 = control.replicas["a1"]["seen"]
    control.instructions("a1", progress=5, busy=True)
    assert control.stuck(t0 + 10, 30) is None
    control.instructions("a1", progress=6, busy=True)  # it moved
    moved = control.replicas["a1"]["moved"]
    assert control.stuck(moved + 29, 30) is None
    assert "engine replica a1 (pid 10, node n1) holds batches but has made no progress" in control.stuck(moved + 31, 30)
    control.instructions("a1", progress=6, busy=False)  # idle: nothing to stall
    assert control.stuck(moved + 100, 30) is None
    control.register_pool("p1", "retrieval", "n2", 20)
    control.begin("call-1", "p1", 20)
    at = control.attempts["call-1"][0]["at"]
    assert "retrieval pool actor p1 (pid 20, node n2) has been serving one call" in control.stuck(at + 31, 30)
    control.end("call-1")
    assert control.stuck(at + 31, 30) is None


def test_pool_restarts_count_against_the_budget_and_a_lost_pool_actor_ends_the_job():
    control = RunControl(budget=1)
    control.register_pool("p1", "retrieval", "n1", 20)
    control.register_pool("p1", "retrieval", "n1", 21)  # died once
    assert control.fatal() is None
    control.register_pool("p1", "retrieval", "n1", 22)
    assert "retrieval pool actor p1 failed 2 times" in control.fatal()
    control.register_pool("p1", "retrieval", "n1", 23)  # restarted again before the driver stopped the job
    assert "retrieval pool actor p1 failed 2 times" in control.fatal()  # the line that stopped it stays (CI: 4)
    other = RunControl()
    other.register_pool("p2", "scorer", "n1", 30)
    other.set_lost(["n1"])
    other.register_pool("p2", "scorer", "n2", 31)  # its node went: no failure
    assert other.pools["p2"]["failures"] == 0
    other.pool_lost("p2", "ActorDiedError: gone")
    assert "scorer pool actor p2 is gone and cannot come back" in other.fatal()


def test_turns_run_a_suspect_batch_alone():
    """A batch that died before waits until no other batch answers, and batches that come meanwhile wait
    behind it."""
    import threading
    import time

    turns, log = Turns(), []

    def shared(name: str, hold: float) -> None:
        with turns.shared():
            log.append(f"+{name}")
            time.sleep(hold)
            log.append(f"-{name}")

    def alone() -> None:
        with turns.alone():
            log.append("+alone")
            time.sleep(0.1)
            log.append("-alone")

    first = threading.Thread(target=shared, args=("a", 0.3))
    first.start()
    time.sleep(0.05)
    suspect = threading.Thread(target=alone)
    suspect.start()
    time.sleep(0.05)
    late = threading.Thread(target=shared, args=("b", 0.0))
    late.start()
    for t in (first, suspect, late):
        t.join(5)
    assert log == ["+a", "-a", "+alone", "-alone", "+b", "-b"]


def test_a_tensor_parallel_replica_is_drained_and_forgiven_by_its_gpus_node_too():
    """Ray Data places a tensor-parallel engine actor itself (node A); its GPUs are its placement group's (node
    B, where its generator host runs). B's drain drains the replica, and a death or engine failure while B is lost
    is B's, not the batch's nor the replica's (issue 78, item 7)."""
    control = RunControl(budget=0)
    control.register("a1", "A", 10)
    control.group_node("a1", "B")
    control.register("a2", "C", 20)
    control.set_draining({"B": time.time() + 60})
    seconds, why = control.instructions("a1")
    assert seconds > 0 and "node" in why
    assert control.instructions("a2") is None
    control.begin("k1", "a1", 10)
    control.set_lost(["B"])
    assert control.begin("k1", "a1", 11) == []  # the attempt that died with B's GPUs: no batch death
    control.instructions("a1", progress=1, busy=True)
    assert control.stuck(time.time() + 10_000, stall_s=60) is None  # B lost: not a stall of the replica
    assert control.engine_failed("a1", "EngineDead('host gone')") is True and control.fatal() is None
    control.set_lost([])
    assert control.engine_failed("a1", "EngineDead('core died')") is False  # now its own: budget 0
