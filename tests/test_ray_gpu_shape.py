"""A GPU cluster's shape without GPUs: `ray.cluster_utils.Cluster` nodes that declare 4 GPUs each get GPU
ids and CUDA_VISIBLE_DEVICES from Ray exactly as real ones. Each engine replica owns only what Ray gave it
(indexing/device.py): a whole-GPU replica its id, two half-GPU replicas one id between them, and the engine
actor of a tensor-parallel replica (no GPU of its own: its placement group's GPUs are its vLLM workers')
none, although it sees every GPU of its node; its own models then stay on the CPU."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from indexing.device import owns_gpu
from pipeline.config import load_config
from pipeline.runtime.gpu_plan import plan_gpu, replica_share, vllm_utilization

pytestmark = pytest.mark.own_process  # starts Ray in-process (scripts/run_tests.sh)

ray = pytest.importorskip("ray")
GiB = 2**30


def test_owning_a_gpu_is_what_ray_assigned_where_ray_assigns():
    assert owns_gpu(True, None)  # no Ray (in-process run, the driver): what CUDA shows
    assert owns_gpu(True, ["3"]) and not owns_gpu(True, []) and not owns_gpu(False, ["3"])


def test_a_replica_sharing_a_gpu_plans_its_share_and_gives_vllm_its_part():
    half = load_config(overrides=["runtime.mode=ray", "ray.actor_num_gpus=0.5"])
    assert replica_share(half) == 0.5 and vllm_utilization(half) == 0.45
    whole = load_config(overrides=["runtime.mode=ray"])
    assert replica_share(whole) == 1.0 and vllm_utilization(whole) == 0.9
    given = load_config(
        overrides=["runtime.mode=ray", "ray.actor_num_gpus=0.5", "generation.engine_kwargs.gpu_memory_utilization=0.3"]
    )
    assert vllm_utilization(given) == 0.3
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
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="dynrag-gpu-", dir="/tmp")  # short: Ray's socket paths live below it
    Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray").mkdir(exist_ok=True)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0, "temp_dir": temp})
    for _ in range(2):
        c.add_node(num_cpus=2, num_gpus=4)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


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


def run_job(cluster, tmp_path, n: int, overrides: list[str], on_report=None, scale: float = 0.02) -> list[dict]:
    """`answer_with_ray` of n questions on `cluster`; each batch's report (also given to `on_report`)."""
    import json

    from jobs.bench.simulated import SimBackends
    from pipeline.io.output_lock import output_lock
    from pipeline.runtime.ray_runner import answer_with_ray

    cfg = load_config(
        overrides=[
            "runtime.mode=ray",
            f"runtime.ray_address={cluster.address}",
            "method.name=sr-rag",
            "dataset.format=generic",
            "answer.batch_questions=10",
            *overrides,
        ]
    )
    dataset, out = tmp_path / "questions.jsonl", str(tmp_path / "out")
    dataset.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"Who wrote book {i}?"}) + "\n" for i in range(n))
    )
    row_args = dict(run_id="t", method="sr-rag", params_json="{}", chash="t", model="simulated")
    reports = []
    with output_lock(out):
        for report in answer_with_ray(
            str(dataset),
            out,
            cfg,
            "simulated",
            row_args,
            header=None,
            done=set(),
            limit=n,
            make_backends=SimBackends(scale),
        ):
            reports.append(report)
            if on_report is not None:
                on_report(report)
    return reports


def live_groups() -> list[dict]:
    from ray.util import placement_group_table

    return [g for g in placement_group_table().values() if g["state"] != "REMOVED"]


def assert_each_question_once(out: Path, n: int) -> None:
    import polars as pl

    rows = pl.read_parquet(f"{out}/parts/*.parquet")
    assert rows.height == n and rows["question_id"].n_unique() == n
    assert rows["error"].null_count() == n, rows.filter(pl.col("error").is_not_null())["error"].to_list()[:3]


def test_tensor_parallel_replicas_each_claim_one_group_made_once_and_removed_at_the_end(gpu_cluster, tmp_path):
    """Two TP-2 replicas: exactly two STRICT_PACK groups of two one-GPU bundles exist during the run (none
    made again when Ray Data asks for actor options), each replica holds its own, on one node; none is left."""
    seen_during: list[int] = []
    tp = ["generation.engine_kwargs.tensor_parallel_size=2", "ray.actor_num_gpus=2", "ray.actors=2"]
    reports = run_job(
        gpu_cluster, tmp_path, 60, [*tp, "ray.actor_num_cpus=1"], lambda r: seen_during.append(len(live_groups()))
    )
    assert set(seen_during) == {2}
    held = {r["replica"]["pid"]: r["replica"]["group"] for r in reports}  # the replicas that answered
    assert None not in held.values() and len(set(held.values())) == len(held)  # each its own group
    assert sum(r["rows"] for r in reports) == 60
    assert live_groups() == []
    assert_each_question_once(tmp_path / "out", 60)
