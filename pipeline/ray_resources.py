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

import logging

log = logging.getLogger(__name__)


def gpus_or_fallback(cfg, gpus: float, what: str) -> float:
    import ray

    if gpus and cfg.ray.gpu_fallback and not ray.cluster_resources().get("GPU", 0):
        log.warning("%s asks for %g GPU but the Ray cluster has none: running on CPU (ray.gpu_fallback)", what, gpus)
        return 0.0
    return gpus


def engine_actor_options(cfg) -> dict:
    """Keyword arguments for `map_batches` of the engine actors (Ray must be initialised)."""
    opts: dict = {"num_cpus": cfg.ray.actor_num_cpus}
    gpus = gpus_or_fallback(cfg, cfg.ray.actor_num_gpus, "each engine actor")
    if gpus:
        opts["num_gpus"] = gpus
    if cfg.ray.actor_resources:
        opts["resources"] = dict(cfg.ray.actor_resources)
    return opts


def embed_actor_gpus(cfg, driver_device: str) -> float:
    """GPUs per embedding actor: `ray.embed_actor_num_gpus`, else 1 when the driver itself sees CUDA."""
    want = cfg.ray.embed_actor_num_gpus
    if want is None:
        want = 1.0 if driver_device.startswith("cuda") else 0.0
    return gpus_or_fallback(cfg, want, "each embedding actor")
