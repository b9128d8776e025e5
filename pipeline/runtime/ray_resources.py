"""What each Ray actor asks for, from the `ray` config section (resource mapping for clusters).

- engine replicas (generation + retrieval): `ray.actors` of them, each `ray.actor_num_cpus` CPUs,
  `ray.actor_num_gpus` GPUs (1 per vLLM replica on a GPU node) and any custom `ray.actor_resources`
  (placement on a node group that advertises them, see cluster/);
- embedding actors of an index build: `index.embed_actors` of them, `ray.embed_actor_num_gpus` GPUs each;
- the retrieval and scorer pools (pipeline/runtime/pools.py): `ray.retrieval_actor_*`, `ray.scorer_actor_*`.

With `ray.gpu_fallback` (default) GPU requests are dropped when the Ray cluster has no GPU at all, so a
cluster config also runs on a laptop. An autoscaling cluster whose GPU group starts at zero nodes shows
no GPU yet: set `ray.gpu_fallback=false` there (cluster/README.md).
"""

from __future__ import annotations

from indexing.raytools import gpus_or_fallback


def engine_actor_options(cfg) -> dict:
    """Keyword arguments for `map_batches` of the engine actors (Ray must be initialised)."""
    opts: dict = {"num_cpus": cfg.ray.actor_num_cpus}
    gpus = gpus_or_fallback(cfg.ray.actor_num_gpus, cfg.ray.gpu_fallback, "each engine actor")
    if gpus:
        opts["num_gpus"] = gpus
    if cfg.ray.actor_resources:
        opts["resources"] = dict(cfg.ray.actor_resources)
    return opts


def pool_actor_options(cfg, kind: str) -> tuple[int, dict]:
    """(actors, `.options(...)` of each) of the `kind` pool: "retrieval" (CPU only) or "scorer"."""
    r = cfg.ray
    n, cpus, gpus, resources = {
        "retrieval": (r.retrieval_actors, r.retrieval_actor_num_cpus, 0.0, r.retrieval_actor_resources),
        "scorer": (r.scorer_actors, r.scorer_actor_num_cpus, r.scorer_actor_num_gpus, r.scorer_actor_resources),
    }[kind]
    opts: dict = {"num_cpus": cpus}
    gpus = gpus_or_fallback(gpus, r.gpu_fallback, f"each {kind} actor")
    if gpus:
        opts["num_gpus"] = gpus
    if resources:
        opts["resources"] = dict(resources)
    return n, opts
