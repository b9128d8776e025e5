"""Starting (or joining) Ray for the build, once per process."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def ensure_ray(cfg) -> None:
    """Join `runtime.ray_address`, or start a local instance; no-op when Ray is already up."""
    import ray

    if ray.is_initialized():
        return
    log.info("starting Ray (%s)", cfg.runtime.ray_address or "local instance")
    local_cpus = getattr(getattr(cfg, "ray", None), "num_cpus", None)  # the engine's `ray` section, if present
    from indexing.java import jvm_signals_kept

    with jvm_signals_kept():  # Ray replaces the signal handlers a running JVM relies on
        ray.init(
            address=cfg.runtime.ray_address,
            num_cpus=local_cpus if cfg.runtime.ray_address is None else None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            ignore_reinit_error=True,
        )
