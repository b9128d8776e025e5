"""The GPU decisions of a cluster run, as pure functions, shown without a GPU (DESIGN.md): the dtype
`auto` resolves to, whether engine replicas of `tensor_parallel_size` GPUs fit a cluster, and the Ray
options and placement groups of such replicas."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.config import load_config, replica_share, resolve_dtype, vllm_utilization
from pipeline.errors import DynragError
from pipeline.runtime import ray_resources
from pipeline.runtime.gpu_plan import plan_gpu
from pipeline.runtime.ray_resources import (
    GroupDealer,
    check_replicas,
    engine_actor_options,
    replica_bundles,
    replica_gpus,
    replica_groups,
)
from platform_shims.device import owns_gpu

CLUSTER = Path(__file__).resolve().parents[3] / "cluster"


def _no_cuda(monkeypatch, cuda: bool) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


def test_auto_dtype_is_bfloat16_on_cuda_and_float32_on_a_cpu_explicit_ones_kept():
    assert load_config().generation.dtype == "auto"
    assert resolve_dtype("auto", cuda=False) == "float32" and resolve_dtype("auto", cuda=True) == "bfloat16"
    for given in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(given, cuda=False) == resolve_dtype(given, cuda=True) == given


def test_vllm_gets_the_resolved_dtype_and_a_ray_executor_only_in_a_tensor_parallel_replica():
    from pipeline.backends.vllm_gen import llm_kwargs

    g = load_config().generation
    assert llm_kwargs(g, "m", gpu=False)["dtype"] == "float32"  # what the CPU runs used before "auto"
    assert llm_kwargs(g, "m", gpu=True)["dtype"] == "bfloat16"
    assert (
        llm_kwargs(load_config(overrides=["generation.dtype=float16"]).generation, "m", gpu=True)["dtype"] == "float16"
    )
    assert "distributed_executor_backend" not in llm_kwargs(g, "m", gpu=True, ray_replica=True)
    tp = load_config(overrides=["generation.engine_kwargs.tensor_parallel_size=2"]).generation
    assert llm_kwargs(tp, "m", gpu=True, ray_replica=True)["distributed_executor_backend"] == "ray"
    assert "distributed_executor_backend" not in llm_kwargs(tp, "m", gpu=True)  # in-process: vLLM's own choice


def test_transformers_loads_the_model_in_the_resolved_dtype(monkeypatch):
    import torch
    import transformers

    from pipeline.backends.hf_gen import HfGenerator

    loaded = []

    class FakeModel:
        def to(self, device):
            return self

        def eval(self):
            return self

    def model(path, dtype, **kw):
        loaded.append(dtype)
        return FakeModel()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: SimpleNamespace(pad_token_id=0))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    for cuda, want in ((False, torch.float32), (True, torch.bfloat16)):
        _no_cuda(monkeypatch, cuda)
        gen = HfGenerator(load_config(), model_path="/no/model")
        assert loaded[-1] == want and gen.device == ("cuda" if cuda else "cpu")
    HfGenerator(load_config(overrides=["generation.dtype=float16"]), model_path="/no/model")
    assert loaded[-1] == torch.float16


def test_the_run_records_the_dtype_of_where_it_generates(monkeypatch):
    from pipeline.methods.registry import config_hash, get_method
    from pipeline.runtime.answer import generation_dtype, run_settings

    def recorded(cfg):
        cfg.generation.dtype = generation_dtype(cfg)
        params = get_method(cfg.method.name).params(cfg.method.params, cfg)
        settings = run_settings(cfg, params)
        return settings["generation"]["dtype"], config_hash(*settings.values())

    _no_cuda(monkeypatch, False)
    dtype, auto_hash = recorded(load_config())
    # on a CPU the default records float32, so outputs written before "auto" keep their config hash
    assert dtype == "float32" and auto_hash == recorded(load_config(overrides=["generation.dtype=float32"]))[1]
    assert recorded(load_config(overrides=["generation.backend=none"]))[0] == "float32"
    _no_cuda(monkeypatch, True)
    assert recorded(load_config())[0] == "bfloat16"
    assert recorded(load_config(overrides=["generation.dtype=float32"])) == (dtype, auto_hash)
    # Ray mode: the replicas decide (their GPU request), not the driver's machine
    ray = ["runtime.mode=ray"]
    assert recorded(load_config(overrides=ray))[0] == "float32"
    _no_cuda(monkeypatch, False)
    assert recorded(load_config(overrides=[*ray, "ray.actor_num_gpus=1"]))[0] == "bfloat16"
    assert recorded(load_config(overrides=[*ray, "generation.engine_kwargs.tensor_parallel_size=2"]))[0] == "bfloat16"


def test_run_answer_writes_the_resolved_dtype_into_its_rows_configuration(tmp_path, monkeypatch):
    import json

    from fakes import RecordingGenerator

    from pipeline.backends import Backends
    from pipeline.runtime.answer import run_answer

    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"question {i}?", "answer": ["x"]}) + "\n" for i in range(2))
    )

    def run(out: str, cuda: bool, *overrides: str) -> tuple[str, str]:
        _no_cuda(monkeypatch, cuda)
        cfg = load_config(overrides=["answer.progress=false", *overrides])
        backends = Backends(cfg, generator=RecordingGenerator())
        summary = run_answer(str(data), str(tmp_path / out), method="no-retrieval", cfg=cfg, backends=backends)
        saved = json.loads((tmp_path / out / "run.json").read_text())
        resolved = yaml.safe_load((tmp_path / out / "config.resolved.yaml").read_text())
        assert saved["settings"]["generation"]["dtype"] == resolved["generation"]["dtype"]
        return resolved["generation"]["dtype"], summary["config_hash"]

    cpu = run("cpu", False)
    assert cpu == ("float32", run("explicit", False, "generation.dtype=float32")[1])
    assert run("gpu", True)[0] == "bfloat16"


def _fails(match: str, *args, **kw) -> str:
    with pytest.raises(DynragError, match=match) as err:
        check_replicas(*args, **kw)
    assert "\n" not in str(err.value)  # one line: `dynrag: error: ...`
    return str(err.value)


def test_replicas_that_cannot_fit_are_one_error_line():
    one_node_of_4 = [(4.0, 1.0)]
    # tensor_parallel_size and ray.actor_num_gpus must agree when both are set
    _fails(
        r"ray.actor_num_gpus=1 and generation.engine_kwargs.tensor_parallel_size=2 disagree", 2, 1.0, 1, one_node_of_4
    )
    assert check_replicas(2, 0.0, 2, one_node_of_4) == check_replicas(2, 2.0, 2, one_node_of_4) == 2.0
    _fails(r"ray.actor_num_gpus=2: one engine uses one GPU", 1, 2.0, 1, one_node_of_4)
    _fails(r"is vLLM's: generation.backend=transformers", 2, 2.0, 1, one_node_of_4, backend="transformers")
    # a replica lives on one node
    _fails(r"a replica of 4 GPUs .* fits on no node: the largest has 2", 4, 0.0, 1, [(2.0, 3.0)])
    # replicas pack per node: two 3-GPU nodes hold two 2-GPU replicas although they have 6 GPUs
    assert check_replicas(2, 0.0, 2, [(3.0, 2.0)]) == 2.0
    msg = _fails(r"ray.actors=3 replicas of 2 GPUs do not fit", 2, 0.0, 3, [(3.0, 2.0)])
    assert "2 replicas at most" in msg
    assert check_replicas(2, 0.0, 3, [(2.0, 1.0), (4.0, 1.0)]) == 2.0
    _fails(r"3 replicas at most", 2, 0.0, 4, [(2.0, 1.0), (4.0, 1.0)])
    # shares of a GPU, an autoscaler without bound, and nodes too small for a replica beside big ones
    assert check_replicas(1, 0.25, 4, [(1.0, 1.0)]) == 0.25
    _fails(r"ray.actors=5 replicas of 0.25 GPUs", 1, 0.25, 5, [(1.0, 1.0)])
    assert check_replicas(1, 1.0, 64, [(1.0, math.inf)]) == 1.0
    assert check_replicas(2, 0.0, 4, [(1.0, math.inf), (8.0, 1.0)]) == 2.0
    _fails(r"4 replicas at most", 2, 0.0, 5, [(1.0, math.inf), (8.0, 1.0)])
    # nothing known about the GPU nodes (a group scaling from zero): only the configuration is checked
    assert check_replicas(8, 0.0, 16, []) == 8.0
    assert check_replicas(1, 0.0, 99, [(1.0, 1.0)]) == 0.0  # CPU replicas


def test_gpu_fallback_runs_single_gpu_replicas_on_cpu_but_not_tensor_parallel_ones():
    cfg = load_config(overrides=["ray.actor_num_gpus=1", "ray.actors=4"])
    assert replica_gpus(cfg, [], 0.0) == 0.0  # no GPU in the cluster: CPU replicas
    assert replica_gpus(cfg, [(1.0, math.inf)], 0.0) == 1.0  # none up, but an autoscaler's GPU group: kept
    assert replica_gpus(cfg, [(1.0, 4.0)], 1.0) == 1.0
    tp = load_config(overrides=["generation.engine_kwargs.tensor_parallel_size=2"])
    with pytest.raises(DynragError, match="tensor_parallel_size=2 needs GPUs and the Ray cluster has none"):
        replica_gpus(tp, [], 0.0)
    tp.ray.gpu_fallback = False  # an autoscaler may still add GPU nodes: nothing to check against yet
    assert replica_gpus(tp, [], 0.0) == 2.0


def test_the_shipped_cluster_config_fits_its_gpu_group_and_a_tensor_parallel_variant_too():
    cfg = load_config(CLUSTER / "dynrag.yaml")
    group = yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())["available_node_types"]["gpu-workers"]
    nodes = [(float(group["resources"]["GPU"]), float(group["max_workers"]))]
    assert replica_gpus(cfg, nodes, 1.0) == 1.0
    tp = load_config(CLUSTER / "dynrag.yaml", ["generation.engine_kwargs.tensor_parallel_size=2"])
    with pytest.raises(DynragError, match="disagree"):  # actor_num_gpus: 1 must follow
        replica_gpus(tp, nodes, 1.0)
    tp.ray.actor_num_gpus, tp.ray.actors = 2, 4
    with pytest.raises(DynragError, match="fits on no node"):  # its 1-GPU g5.2xlarge nodes cannot hold one
        replica_gpus(tp, nodes, 1.0)
    assert replica_gpus(tp, [(4.0, 2.0)], 4.0) == 2.0  # e.g. g5.12xlarge: 4 GPUs a node


def test_engine_actor_options_of_single_gpu_and_tensor_parallel_replicas(monkeypatch):
    """A tensor-parallel replica's actor asks for its CPUs only (no GPU; a per-actor options function that
    places it in its group only where Ray Data has one: Ray 2.64 has none); its group, one per replica, made once by the driver, holds the generator host's
    CPU and custom resources and one GPU in its first bundle, then one GPU a bundle. No Ray starts here."""
    import ray.util

    cfg = load_config(CLUSTER / "dynrag.yaml", ["ray.actor_resources={generation: 1}"])
    assert engine_actor_options(cfg, 1.0) == {"num_cpus": 4, "num_gpus": 1.0, "resources": {"generation": 1}}
    assert engine_actor_options(cfg, 0.0) == {"num_cpus": 4, "resources": {"generation": 1}}  # fallback
    assert replica_groups(cfg, 1.0) == []  # one GPU a replica: no group
    cfg.generation.engine_kwargs.tensor_parallel_size, cfg.ray.actor_num_gpus, cfg.ray.actors = 4, 4, 2
    made: list = []
    monkeypatch.setattr(
        ray.util, "placement_group", lambda bundles, strategy, name: made.append((bundles, strategy)) or name
    )
    assert engine_actor_options(cfg, 4.0) == {"num_cpus": 4}
    assert made == []  # reading the options makes no group
    assert replica_groups(cfg, 4.0) == ["dynrag-replica-0", "dynrag-replica-1"]
    bundles = [{"CPU": 1.0, "GPU": 1.0, "generation": 1}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}]
    assert made == [(bundles, "STRICT_PACK")] * 2
    assert replica_groups(cfg, 0.0) == []  # no GPUs (the fallback): no group
    # where Ray Data starts each actor in its group's first bundle (GroupDealer), that bundle holds its CPUs too
    made.clear()
    assert replica_groups(cfg, 4.0, placed=True) == ["dynrag-replica-0", "dynrag-replica-1"]
    assert made == [([{**bundles[0], "CPU": 5.0}, *bundles[1:]], "STRICT_PACK")] * 2
    dealer = GroupDealer(None, ["g0", "g1"], "RunControl", 1.0, "limit")
    assert engine_actor_options(cfg, 4.0, dealer) == {"num_cpus": 4, "ray_remote_args_fn": dealer}
    assert "ray_remote_args_fn" not in engine_actor_options(cfg, 0.0, dealer)  # no GPUs (the fallback): none
    assert replica_bundles(2) == [{"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0}]
    assert not ray.is_initialized()  # a Ray beside the shared test process's JVM crashed it


def test_cluster_gpu_nodes_reads_the_autoscaler_bounds_else_the_live_nodes(monkeypatch):
    import ray
    import ray._private.state

    group = SimpleNamespace
    config = SimpleNamespace(
        node_group_configs=[
            group(resources={"CPU": 16}, max_count=8),  # CPU workers: not GPU nodes
            group(resources={"CPU": 8, "GPU": 1}, max_count=8),
            group(resources={"CPU": 48, "GPU": 4}, max_count=-1),  # no bound
            group(resources={"GPU": 8}, max_count=0),  # may not start
        ]
    )
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 24.0, "GPU": 1.0})
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: config)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"GPU": 1.0}}])
    assert ray_resources.cluster_gpu_nodes() == ([(1.0, 8.0), (4.0, math.inf)], 1.0)
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: None)  # no autoscaler
    monkeypatch.setattr(
        ray,
        "nodes",
        lambda: [
            {"Alive": True, "Resources": {"CPU": 8.0}},
            {"Alive": True, "Resources": {"GPU": 2.0}},
            {"Alive": False, "Resources": {"GPU": 8.0}},
        ],
    )
    assert ray_resources.cluster_gpu_nodes() == ([(2.0, 1.0)], 1.0)


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
