"""What each Ray actor asks for, from the `ray` config section (resource mapping for clusters).

- engine replicas (generation + retrieval): `ray.actors` of them, each `ray.actor_num_cpus` CPUs and
  any custom `ray.actor_resources` (placement on a node group that advertises them, see cluster/). GPUs:
  `ray.actor_num_gpus` (1, or a share, per vLLM replica that fits one GPU), or with
  `generation.engine_kwargs.tensor_parallel_size` = N > 1 a placement group of N one-GPU bundles on one
  node per replica, made once by the driver: the actor itself holds no GPU, is started in its replica's
  group where Ray Data allows (`GroupDealer`), claims it, and vLLM's Ray executor starts one worker on each
  bundle's GPU (vllm_gen.py);
- an index build's tasks that embed (indexing/builder/cluster.py): `ray.embed_actor_num_gpus` GPUs each;
- the retrieval and scorer pools (pipeline/runtime/pools.py): `ray.retrieval_actor_*`, `ray.scorer_actor_*`.

Whether the replicas fit the cluster is decided before any actor starts (`replica_gpus`). With
`ray.gpu_fallback` (default) GPU requests are dropped when the Ray cluster has no GPU at all, so a
cluster config also runs on a laptop. An autoscaling cluster whose GPU group starts at zero nodes keeps
them: the autoscaler publishes the group (`cluster_gpu_nodes`), and Ray starts its nodes for the actors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from pipeline.errors import DynragError
from platform_shims.raytools import gpus_or_fallback

log = logging.getLogger(__name__)

TP_KEY = "generation.engine_kwargs.tensor_parallel_size"


def tensor_parallel_size(cfg) -> int:
    return cfg.generation.engine_kwargs.tensor_parallel_size or 1


def replica_gpu_request(cfg) -> float:
    """GPUs one engine replica asks for by its configuration: tensor_parallel_size when above 1, else
    ray.actor_num_gpus (whether the cluster grants them is `replica_gpus`)."""
    tp = tensor_parallel_size(cfg)
    return float(tp) if tp > 1 else cfg.ray.actor_num_gpus


def check_replicas(
    tp: int, actor_num_gpus: float, actors: int, nodes: Sequence[tuple[float, float]], backend: str = "vllm"
) -> float:
    """GPUs of each engine replica, or a DynragError naming the combination that cannot run.

    `nodes`: (GPUs of a node, how many such nodes; math.inf where an autoscaler may add them without
    bound) for the nodes that have GPUs; empty when none is known (nothing to check against). A replica of
    tensor_parallel_size GPUs must fit on one node (its placement group is STRICT_PACK: tensor-parallel
    workers exchange activations every layer), and `actors` replicas must fit the nodes together."""
    if tp > 1 and backend != "vllm":
        raise DynragError(
            f"{TP_KEY}={tp} is vLLM's: generation.backend={backend} runs each replica on one GPU; "
            "use generation.backend=vllm or tensor_parallel_size 1"
        )
    if tp > 1 and actor_num_gpus not in (0, tp):
        raise DynragError(
            f"ray.actor_num_gpus={actor_num_gpus:g} and {TP_KEY}={tp} disagree: a tensor-parallel replica "
            f"spans {tp} GPUs; set ray.actor_num_gpus={tp} (or 0)"
        )
    if tp == 1 and actor_num_gpus > 1:
        raise DynragError(
            f"ray.actor_num_gpus={actor_num_gpus:g}: one engine uses one GPU unless {TP_KEY} spans more; "
            f"set {TP_KEY}={math.ceil(actor_num_gpus)} for a model that needs them, or ray.actor_num_gpus=1"
        )
    want = float(tp) if tp > 1 else actor_num_gpus
    if not want or not nodes:
        return want
    largest = max(g for g, _ in nodes)
    if want > largest:
        raise DynragError(
            f"a replica of {want:g} GPUs ({TP_KEY}={tp}) fits on no node: the largest has {largest:g}; "
            "lower it or add nodes with more GPUs"
        )
    per_node = [(n, math.floor(g / want + 1e-9)) for g, n in nodes]
    fit = sum(n * k for n, k in per_node if k)  # replicas the nodes hold, each on one node
    if actors > fit:
        have = ", ".join(f"{n:g} x {g:g} GPUs" for g, n in nodes)
        raise DynragError(
            f"ray.actors={actors} replicas of {want:g} GPUs do not fit the cluster's GPU nodes ({have}: "
            f"{fit:g} replicas at most); lower ray.actors or add GPU nodes"
        )
    return want


def replica_gpus(cfg, nodes: Sequence[tuple[float, float]], gpus_now: float) -> float:
    """GPUs of each engine replica on a cluster of GPU `nodes` (check_replicas) with `gpus_now` GPUs up; 0
    (CPU replicas, with a warning) when ray.gpu_fallback applies to a cluster without any GPU: none up and
    none the autoscaler may start (a GPU group scaling from zero nodes keeps the replicas' GPUs)."""
    tp = tensor_parallel_size(cfg)
    fallback = cfg.ray.gpu_fallback and not gpus_now and not nodes
    want = check_replicas(tp, cfg.ray.actor_num_gpus, cfg.ray.actors, () if fallback else nodes, cfg.generation.backend)
    if want and fallback:
        if tp > 1:
            raise DynragError(f"{TP_KEY}={tp} needs GPUs and the Ray cluster has none; set it to 1 to run on CPU")
        log.warning(
            "each engine actor asks for %g GPU but the Ray cluster has none: running on CPU (ray.gpu_fallback)", want
        )
        return 0.0
    return want


def cluster_gpu_nodes() -> tuple[list[tuple[float, float]], float]:
    """(GPU nodes as check_replicas takes them, GPUs up now) of the connected Ray cluster. The nodes are the
    autoscaler's node groups with their maximum counts where it publishes them (as Ray Train checks its
    worker group), else the nodes alive now."""
    import ray

    from platform_shims.compat import autoscaler_node_groups

    now = float(ray.cluster_resources().get("GPU", 0))
    groups = [
        (float(res["GPU"]), math.inf if count == -1 else float(count))
        for res, count in autoscaler_node_groups() or []
        if res.get("GPU", 0) and count != 0
    ]
    if groups:
        return groups, now
    alive = [float(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
    return [(g, 1.0) for g in alive if g], now


def replica_bundles(tp: int, resources: dict | None = None, actor_cpus: float = 0.0) -> list[dict[str, float]]:
    """The placement group of a tensor-parallel replica: one bundle per GPU, each taken by one of vLLM's
    workers; the first also holds the generator host's CPU, the replica's custom resources (ray_host.py) and,
    where Ray places the engine actor in it (`places_actors_in_groups`), the actor's `actor_cpus`."""
    from pipeline.runtime.ray_host import HOST_CPUS

    first = {"CPU": HOST_CPUS + actor_cpus, "GPU": 1.0, **(resources or {})}
    return [first] + [{"GPU": 1.0} for _ in range(tp - 1)]


def places_actors_in_groups() -> bool:
    """Whether this Ray Data can start each engine actor in a placement group of its own: its `map_batches`
    takes `ray_remote_args_fn` (options asked for at each actor's start; deprecated, gone in Ray 2.64). Without
    it an actor runs where Ray Data puts it and only its generator host is in its group (ray_host.py)."""
    import inspect

    import ray.data

    return "ray_remote_args_fn" in inspect.signature(ray.data.Dataset.map_batches).parameters


def replica_groups(cfg, gpus: float, placed: bool = False) -> list:
    """The tensor-parallel replicas' placement groups, one per replica (STRICT_PACK: tensor-parallel workers
    exchange activations every layer, one node), made by the driver and claimed by the engine actors
    (`RunControl.claim_group`); `placed`: each actor is started in its group's first bundle (`GroupDealer`), which
    holds its CPUs too; [] for replicas of one GPU or none."""
    if not (gpus and tensor_parallel_size(cfg) > 1):
        return []
    from ray.util import placement_group

    r = cfg.ray
    bundles = replica_bundles(tensor_parallel_size(cfg), dict(r.actor_resources or {}), r.actor_num_cpus * placed)
    return [placement_group(bundles, strategy="STRICT_PACK", name=f"dynrag-replica-{i}") for i in range(r.actors)]


class GroupDealer:
    """Ray Data's `ray_remote_args_fn` for tensor-parallel engine actors: called on the driver as each actor
    starts, it places the actor in the first bundle of the group fewest other actors hold
    (`RunControl.deal_group`), so that its node is its GPUs' node and its calls to its generator host stay on that
    node; the actor claims that group (`RunControl.claim_group`)."""

    def __init__(self, control, groups: list, what: str, timeout_s: float, limit: str):
        self.control, self.groups, self.wait = control, groups, (what, timeout_s, limit)

    def __call__(self) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from pipeline.runtime.waits import bounded_get

        dealt = bounded_get(self.control.deal_group.remote(len(self.groups)), *self.wait)
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(self.groups[dealt], 0)}


def engine_actor_options(cfg, gpus: float, dealer: GroupDealer | None = None) -> dict:
    """Keyword arguments for `map_batches` of the engine actors whose replicas have `gpus` GPUs
    (replica_gpus). A tensor-parallel replica's actor asks for its CPUs only: its GPUs and custom resources are
    in the placement group it claims, where its generator host runs (ray_host.py), and where `dealer` starts
    the actor itself."""
    r = cfg.ray
    opts: dict = {"num_cpus": r.actor_num_cpus}
    if gpus and tensor_parallel_size(cfg) > 1:
        return {**opts, "ray_remote_args_fn": dealer} if dealer is not None else opts
    if gpus:
        opts["num_gpus"] = gpus
    if r.actor_resources:
        opts["resources"] = dict(r.actor_resources)
    return opts


def pool_actor_options(cfg, kind: str) -> tuple[int, dict]:
    """(actors, `.options(...)` of each) of the `kind` pool: "retrieval" (CPU only) or "scorer"."""
    r = cfg.ray
    n, cpus, gpus, resources = {
        "retrieval": (r.retrieval_actors, r.retrieval_actor_num_cpus, 0.0, r.retrieval_actor_resources),
        "scorer": (r.scorer_actors, r.scorer_actor_num_cpus, r.scorer_actor_num_gpus, r.scorer_actor_resources),
    }[kind]
    # a pool actor lost with its node is started again elsewhere and the calls it held are sent again (its
    # calls are searches and scores: any retry returns what the first would have); a call that kills its
    # process each time (a JVM or FAISS crash, host OOM) is given up by the actor itself (PoolActor.run)
    # spread over the nodes: a lost node takes one pool actor with it, and a node's CPUs are not all taken by
    # the pool before the engine replicas are placed (Ray's default packs them)
    opts: dict = {
        "num_cpus": cpus,
        "max_restarts": -1,
        "max_task_retries": -1,
        "scheduling_strategy": "SPREAD",
    }
    gpus = gpus_or_fallback(gpus, r.gpu_fallback, f"each {kind} actor")
    if gpus:
        opts["num_gpus"] = gpus
    if resources:
        opts["resources"] = dict(resources)
    return n, opts
