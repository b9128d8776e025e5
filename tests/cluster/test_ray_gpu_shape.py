"""A GPU cluster's shape without GPUs: `ray.cluster_utils.Cluster` nodes that declare 4 GPUs each get GPU
ids and CUDA_VISIBLE_DEVICES from Ray exactly as real ones. Each engine replica owns only what Ray gave it
(platform_shims/device.py): a whole-GPU replica its id, two half-GPU replicas one id between them, and the engine
actor of a tensor-parallel replica (no GPU of its own: its placement group's GPUs are its vLLM workers')
none, although it sees every GPU of its node; its own models then stay on the CPU."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from ray_jobs import assert_each_question_once, fake_gpu_cluster, live_groups, run_job

from jobs.bench.rig.simulated import SimBackends

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def gpu_cluster():
    with fake_gpu_cluster(workers=2, num_cpus=2, num_gpus=4) as c:
        yield c


@ray.remote(num_cpus=0)
class Replica:
    def what_i_own(self) -> dict:
        import os

        from platform_shims.device import owns_gpu, ray_assigned_gpus

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


@dataclasses.dataclass(frozen=True)
class ProbingBackends(SimBackends):
    """Latency-model backends whose generator, built in a tensor-parallel replica's generator host, first starts
    what vLLM's Ray executor would start there: one worker actor of one GPU (no CPU) per bundle, captured into
    the host's group; each worker's node and GPU ids go to `probes` (a folder), one file per host. Built in an
    engine actor, it writes the placement group the actor runs in to `engines` beside `probes`."""

    probes: str = ""

    def __call__(self, cfg, index_dir=None, **kw):
        import json
        import os
        import time
        from pathlib import Path

        group = ray.util.get_current_placement_group()
        if kw.get("generator") is None and group is not None:  # in the host: the generator is built here
            tp = cfg.generation.engine_kwargs.tensor_parallel_size
            workers = [Replica.options(num_cpus=0, num_gpus=1).remote() for _ in range(tp)]
            owned = ray.get([w.what_i_own.remote() for w in workers], timeout=60)
            probe = {"group": group.id.hex(), "host_node": ray.get_runtime_context().get_node_id(), "workers": owned}
            Path(self.probes, f"{os.getpid()}.json").write_text(json.dumps(probe))
            deadline = time.monotonic() + 60  # every replica's workers hold their GPUs at once: none shared
            while len(list(Path(self.probes).iterdir())) < cfg.ray.actors and time.monotonic() < deadline:
                time.sleep(0.2)
            for w in workers:
                ray.kill(w)
        elif kw.get("generator") is not None:  # in the engine actor: the group Ray started it in, if any
            engine = {"pid": os.getpid(), "group": group.id.hex() if group is not None else None}
            Path(self.probes).with_name("engines").joinpath(f"{os.getpid()}.json").write_text(json.dumps(engine))
        return super().__call__(cfg, index_dir, **kw)


@pytest.mark.parametrize("ray_data", ["with_ray_remote_args_fn", "like_ray_2_64"])
def test_tensor_parallel_replicas_each_host_their_generator_in_a_group_they_claim(
    gpu_cluster, tmp_path, monkeypatch, ray_data
):
    """Two TP-2 replicas: exactly two STRICT_PACK groups exist during the run; each engine actor claims one (by
    its id) and starts its generator host in it; the host's vLLM-like workers get the group's two GPUs, on the
    group's one node, and no two replicas share a GPU; every question is answered once; no group is left. Where
    Ray Data has `ray_remote_args_fn` (GroupDealer), each engine actor runs on its GPUs' node too; without it
    (refused here, as Ray 2.64 has none) the actor runs where Ray Data puts it."""
    import json

    from ray.util import placement_group_table

    if ray_data == "like_ray_2_64":
        map_batches = ray.data.Dataset.map_batches

        def like_ray_2_64(self, fn, *args, **kwargs):
            if "ray_remote_args_fn" in kwargs:
                raise TypeError("map_batches() got an unexpected keyword argument 'ray_remote_args_fn'")
            return map_batches(self, fn, *args, **kwargs)

        monkeypatch.setattr(ray.data.Dataset, "map_batches", like_ray_2_64)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    seen_during: list[int] = []
    nodes: dict[str, set] = {}

    def on_report(r):
        seen_during.append(len(live_groups()))
        g = r["replica"]["group"]
        nodes[g] = {b for b in placement_group_table().get(g, {}).get("bundles_to_node_id", {}).values()}

    probes = tmp_path / "probes"
    probes.mkdir()
    (tmp_path / "engines").mkdir()
    tp = ["generation.engine_kwargs.tensor_parallel_size=2", "ray.actor_num_gpus=2", "ray.actors=2"]
    backends = ProbingBackends(scale=0.02, probes=str(probes))
    reports = run_job(gpu_cluster, tmp_path, 60, [*tp, "ray.actor_num_cpus=1"], on_report, make_backends=backends)
    assert set(seen_during) == {2}
    held = {r["replica"]["pid"]: r["replica"]["group"] for r in reports}  # the replicas that answered
    assert None not in held.values() and len(set(held.values())) == len(held)  # each its own group
    for r in reports:  # its host on the one node of its group
        assert nodes[r["replica"]["group"]] == {r["replica"]["group_node"]}
        if ray_data == "with_ray_remote_args_fn":  # and the engine actor itself: its calls stay on the node
            assert r["replica"]["node"] == r["replica"]["group_node"]
    engines = {e["pid"]: e["group"] for e in map(json.loads, map(Path.read_text, (tmp_path / "engines").iterdir()))}
    placed = ray_data == "with_ray_remote_args_fn"  # each engine actor in the group it claimed, or in none
    assert all(engines[pid] == (group if placed else None) for pid, group in held.items())
    got = [json.loads(p.read_text()) for p in probes.iterdir()]
    assert len({g["group"] for g in got}) == len(got) == 2 and set(held.values()) <= {g["group"] for g in got}
    gpus = [(w["node"], w["ids"][0]) for g in got for w in g["workers"]]
    assert all(len(w["ids"]) == 1 and w["node"] == g["host_node"] for g in got for w in g["workers"])
    assert len(set(gpus)) == 4  # two replicas, two GPUs each, none shared
    assert sum(r["rows"] for r in reports) == 60
    assert live_groups() == []
    assert_each_question_once(tmp_path / "out", 60)


@dataclasses.dataclass(frozen=True)
class FailingOnceBackends(SimBackends):
    """Latency-model backends built in an engine actor (beside its generator host): the first build raises, as an
    index pull cut by a pre-emption does (that actor's start fails); each build writes the placement group its
    actor runs in to `engines` (a folder; `failed` for the one that raised), and a build that succeeds waits for
    `ray.actors` of them, so that every replica has started before any answers."""

    engines: str = ""

    def __call__(self, cfg, index_dir=None, **kw):
        import json
        import os
        import time

        if kw.get("generator") is None:
            return super().__call__(cfg, index_dir, **kw)
        group = ray.util.get_current_placement_group()
        mine = json.dumps({"pid": os.getpid(), "group": group.id.hex() if group is not None else None})
        try:
            fd = os.open(Path(self.engines, "failed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            Path(self.engines, f"{os.getpid()}.json").write_text(mine)
            deadline = time.monotonic() + 60
            while len(list(Path(self.engines).glob("*.json"))) < cfg.ray.actors and time.monotonic() < deadline:
                time.sleep(0.2)
            return super().__call__(cfg, index_dir, **kw)
        os.write(fd, mine.encode())
        os.close(fd)
        raise RuntimeError("the index pull was cut")


def test_a_tensor_parallel_actor_whose_start_fails_frees_its_group_for_its_replacement(gpu_cluster, tmp_path):
    """Two TP-2 replicas, the first engine actor's start fails (ray.replica_failures=1): Ray Data starts a new
    actor (a new id), which is started in the failed one's group (GroupDealer) and claims it; two replicas in
    two groups start, and each question is answered once."""
    import json

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    engines = tmp_path / "engines"
    engines.mkdir()
    tp = ["generation.engine_kwargs.tensor_parallel_size=2", "ray.actor_num_gpus=2", "ray.actors=2"]
    job = [*tp, "ray.actor_num_cpus=1", "ray.replica_failures=1"]
    reports = run_job(
        gpu_cluster, tmp_path, 60, job, make_backends=FailingOnceBackends(scale=0.02, engines=str(engines))
    )
    failed = json.loads((engines / "failed").read_text())
    started = [json.loads(p.read_text()) for p in engines.glob("*.json")]
    assert len({e["group"] for e in started}) == 2 and failed["group"] in {e["group"] for e in started}
    assert failed["pid"] not in {e["pid"] for e in started}  # a new actor, not a restart
    assert {r["replica"]["group"] for r in reports} <= {e["group"] for e in started}
    assert sum(r["rows"] for r in reports) == 60
    assert_each_question_once(tmp_path / "out", 60)
