"""The driver's RunControl as its engine actors use it, without Ray: which replica placement group an actor
claims, a restarted actor taking over its dead predecessor's, the drain and its end, the engine failures
counted; and the placement group vLLM looks up while it builds a replica's engine."""

from __future__ import annotations

import pytest

from pipeline.runtime import ray_control
from pipeline.runtime.ray_control import RunControl, placed_in


@pytest.fixture
def cluster(monkeypatch):
    """Groups g0 on node A, g1 on node B, g2 pending; the actors named in `dead` have died."""
    nodes = {"g0": {"A"}, "g1": {"B"}, "g2": set()}
    dead: set[str] = set()
    monkeypatch.setattr(ray_control, "group_nodes", lambda g: nodes[g])
    monkeypatch.setattr(ray_control, "actor_alive", lambda a: a not in dead)
    return dead


def test_each_actor_claims_its_own_group_preferring_its_node(cluster):
    control = RunControl(["g0", "g1", "g2"])
    assert control.claim("a1", "B") == "g1"  # the group on its node
    assert control.claim("a2", "B") == "g0"  # B's is taken: the first free one
    assert control.claim("a1", "B") == "g1"  # asking again keeps its own
    assert control.claim("a3", "A") == "g2"
    assert control.held() == {1: "a1", 0: "a2", 2: "a3"}
    with pytest.raises(RuntimeError, match="all 3 replica placement groups are held by live engine actors"):
        control.claim("a4", "A")


def test_a_restarted_actor_takes_over_its_dead_predecessors_group(cluster):
    control = RunControl(["g0", "g1"])
    control.claim("a1", "A"), control.claim("a2", "B")
    cluster.add("a2")  # its node went
    assert control.claim("a2-restarted", "A") == "g1"
    control.release("a1")
    assert control.claim("a5", "B") == "g0" and control.held() == {0: "a5", 1: "a2-restarted"}


def test_no_groups_without_tensor_parallel_replicas():
    assert RunControl().claim("a1", "A") is None


def test_drain_and_failures_are_counted():
    control = RunControl()
    assert control.remaining() is None
    control.request(30.0)
    control.request(1000.0)  # the first deadline holds
    assert 29.0 < control.remaining() <= 30.0
    control.drained("a1"), control.drained("a1"), control.drained("a2")
    assert control.drained_count() == 2
    assert [control.engine_failed() for _ in range(3)] == [1, 2, 3]


def test_vllm_looks_up_the_replicas_group_while_its_engine_is_built():
    import inspect

    import ray.util
    from vllm.engine import arg_utils

    # what vLLM 0.32 reads (EngineArgs.create_engine_config), so the lookup below is the one that counts
    assert "ray.util.get_current_placement_group()" in inspect.getsource(arg_utils.EngineArgs.create_engine_config)
    before = ray.util.get_current_placement_group
    with placed_in("group-1"):
        assert ray.util.get_current_placement_group() == "group-1"
    assert ray.util.get_current_placement_group is before
    with placed_in(None):
        assert ray.util.get_current_placement_group is before
    with pytest.raises(KeyError), placed_in("group-2"):
        raise KeyError
    assert ray.util.get_current_placement_group is before
