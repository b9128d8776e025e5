"""A GPU cluster's shape without GPUs: `ray.cluster_utils.Cluster` nodes that declare 4 GPUs each get GPU
ids and CUDA_VISIBLE_DEVICES from Ray exactly as real ones. Each engine replica owns only what Ray gave it
(indexing/device.py): a whole-GPU replica its id, two half-GPU replicas one id between them, and the engine
actor of a tensor-parallel replica (no GPU of its own: its placement group's GPUs are its vLLM workers')
none, although it sees every GPU of its node; its own models then stay on the CPU."""

from __future__ import annotations

import pytest
from ray_jobs import assert_each_question_once, fake_gpu_cluster, live_groups, run_job

from indexing.device import owns_gpu
from pipeline.config import load_config, replica_share, vllm_utilization
from pipeline.runtime.gpu_plan import plan_gpu

pytestmark = pytest.mark.own_process  # starts Ray in-process (scripts/run_tests.sh)

ray = pytest.importorskip("ray")
GiB = 2**30


def test_owning_a_gpu_is_what_ray_assigned_where_ray_assigns():
    assert owns_gpu(True, None)  # no Ray (in-process run, the driver): what CUDA shows
    assert owns_gpu(True, ["3"]) and not owns_gpu(True, []) and not owns_gpu(False, ["3"])


def test_a_replica_sharing_a_gpu_plans_its_share_and_gives_vllm_its_part():
    half = load_config(overrides=["runtime.mode=ray", "ray.actor_num_gpus=0.5"])
    assert replica_share(half, True) == 0.5 and vllm_utilization(half, True) == 0.45
    assert replica_share(half, False) == 1.0 and vllm_utilization(half, False) == 0.9  # in-process: the whole GPU
    whole = load_config(overrides=["runtime.mode=ray"])
    assert replica_share(whole, True) == 1.0 and vllm_utilization(whole, True) == 0.9
    given = load_config(
        overrides=["runtime.mode=ray", "ray.actor_num_gpus=0.5", "generation.engine_kwargs.gpu_memory_utilization=0.3"]
    )
    assert vllm_utilization(given, True) == 0.3
    plan = plan_gpu(80 * GiB, 0.45, share=0.5)
    assert plan.budget == 40 * GiB and "0.5 of 80.0 GiB" in plan.describe()
    with pytest.raises(ValueError, match=r"its share 0.5 of the GPU.*at most 0.49 here"):
        plan_gpu(80 * GiB, 0.9, share=0.5)  # vLLM's default 0.9 of the whole GPU: the other replica's half too


def test_llm_kwargs_take_the_replicas_utilization_unless_configured():
    from pipeline.backends.vllm_gen import llm_kwargs

    g = load_config().generation
    assert llm_kwargs(g, "m", gpu=True, utilization=0.45)["gpu_memory_utilization"] == 0.45
    assert "gpu_memory_utilization" not in llm_kwargs(g, "m", gpu=False, utilization=0.45)
    set_ = load_config(overrides=["generation.engine_kwargs.gpu_memory_utilization=0.3"]).generation
    assert llm_kwargs(set_, "m", gpu=True, utilization=0.45)["gpu_memory_utilization"] == 0.3


@pytest.fixture(scope="module")
def gpu_cluster():
    with fake_gpu_cluster(workers=2, num_cpus=2, num_gpus=4) as c:
        yield c


@ray.remote(num_cpus=0)
class Replica:
    def what_i_own(self) -> dict:
        import os

        from indexing.device import owns_gpu, ray_assigned_gpus

        assigned = ray_assigned_gpus()
        node = ray.get_runtime_context().get_node_id()
        # CUDA "seen" as on a real GPU node: the decision is what Ray assigned
        return {
            "node": node,
            "ids": assigned,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "owns": owns_gpu(True, assigned),
        }


def test_replicas_own_only_the_gpus_ray_gave_them(gpu_cluster):
    from ray.util import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    whole = [Replica.options(num_gpus=1).remote() for _ in range(6)]
    got = ray.get([r.what_i_own.remote() for r in whole])
    assert all(g["owns"] and len(g["ids"]) == 1 and g["visible"] == g["ids"][0] for g in got)
    assert len({(g["node"], g["ids"][0]) for g in got}) == 6  # six replicas, six GPUs of their own

    halves = [Replica.options(num_gpus=0.5).remote() for _ in range(4)]  # two GPUs left: two replicas on each
    got = ray.get([r.what_i_own.remote() for r in halves])
    assert all(g["owns"] and len(g["ids"]) == 1 for g in got)
    shared = {}
    for g in got:
        shared.setdefault((g["node"], g["ids"][0]), []).append(g)
    assert sorted(len(v) for v in shared.values()) == [2, 2]
    for r in whole + halves:
        ray.kill(r)

    # a tensor-parallel replica of 2: its engine actor in bundle 0 of a STRICT_PACK group asks for no GPU
    pg = placement_group([{"CPU": 1, "GPU": 1}, {"GPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready())
    strategy = PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
    )
    engine = Replica.options(num_gpus=0, num_cpus=1, scheduling_strategy=strategy).remote()
    tp = ray.get(engine.what_i_own.remote())
    assert tp["ids"] == [] and not tp["owns"]  # sees the node's GPUs, owns none: its models stay on the CPU
    ray.kill(engine)
    remove_placement_group(pg)


# -- whole answer jobs on the fake-GPU cluster (latency-model backends: the placement is what is tested) -----


def test_tensor_parallel_replicas_each_sit_in_their_own_group_on_its_node_and_the_groups_go(gpu_cluster, tmp_path):
    """Two TP-2 replicas: exactly two STRICT_PACK groups (the actor's CPU and one GPU, then one GPU) exist during
    the run, none made again when Ray Data only reads the actors' options; each engine actor is scheduled
    inside its own group, on the group's node (the actor checks it at its start: ray_runner.check_placement,
    so a misplaced actor fails the job), with the group's first GPU as its bundle; none is left."""
    from ray.util import placement_group_table

    seen_during: list[int] = []
    nodes: dict[str, set] = {}

    def on_report(r):
        seen_during.append(len(live_groups()))
        g = r["replica"]["group"]
        nodes[g] = {b for b in placement_group_table().get(g, {}).get("bundles_to_node_id", {}).values()}

    tp = ["generation.engine_kwargs.tensor_parallel_size=2", "ray.actor_num_gpus=2", "ray.actors=2"]
    reports = run_job(gpu_cluster, tmp_path, 60, [*tp, "ray.actor_num_cpus=1"], on_report)
    assert set(seen_during) == {2}
    held = {r["replica"]["pid"]: r["replica"]["group"] for r in reports}  # the replicas that answered
    assert None not in held.values() and len(set(held.values())) == len(held)  # each its own group
    for r in reports:  # on the one node of its own group
        assert nodes[r["replica"]["group"]] == {r["replica"]["node"]}
    assert sum(r["rows"] for r in reports) == 60
    assert live_groups() == []
    assert_each_question_once(tmp_path / "out", 60)
