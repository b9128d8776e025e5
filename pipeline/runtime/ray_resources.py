"""What each Ray actor asks for, from the `ray` config section (resource mapping for clusters).

- engine replicas (generation + retrieval): `ray.actors` of them, each `ray.actor_num_cpus` CPUs,
  `ray.actor_num_gpus` GPUs (1 per vLLM replica on a GPU node) and any custom `ray.actor_resources`
  (placement on a node group that advertises them, see cluster/);
- embedding actors of an index build: `index.embed_actors` of them, `ray.embed_actor_num_gpus` GPUs each.

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

