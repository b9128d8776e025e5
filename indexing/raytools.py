"""Ray for a build: starting (or joining) it once per process, and GPU requests that fit the cluster."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

log = logging.getLogger(__name__)


def ensure_ray(cfg: IndexSettings) -> None:
    """Join `cfg.ray.address`, or start a local instance (never a `ray start` cluster found on the machine:
    "local"); no-op when Ray is already up."""
    import ray

    if ray.is_initialized():
        return
    log.info("starting Ray (%s)", cfg.ray.address or "local instance")
    from indexing.java import jvm_signals_kept

    with jvm_signals_kept():  # Ray replaces the signal handlers a running JVM relies on
        ray.init(
            address=cfg.ray.address or "local",
            num_cpus=cfg.ray.num_cpus if cfg.ray.address is None else None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            ignore_reinit_error=True,
        )


def gpus_or_fallback(gpus: float, fallback: bool, what: str) -> float:
    """`gpus`, or 0 when `fallback` is on and the Ray cluster has no GPU at all (a GPU config runs anywhere)."""
    import ray

    if gpus and fallback and not ray.cluster_resources().get("GPU", 0):
        log.warning("%s asks for %g GPU but the Ray cluster has none: running on CPU (ray.gpu_fallback)", what, gpus)
        return 0.0
    return gpus


def embed_actor_gpus(cfg: IndexSettings, driver_device: str) -> float:
    """GPUs per embedding actor: `cfg.ray.embed_actor_num_gpus`, else 1 when the driver itself sees CUDA."""
    want = cfg.ray.embed_actor_num_gpus
    if want is None:
        want = 1.0 if driver_device.startswith("cuda") else 0.0
    return gpus_or_fallback(want, cfg.ray.gpu_fallback, "each embedding actor")
