"""Ray for a job (an index build, an answer run): starting or joining it once per process, and GPU requests
that fit the cluster."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

SHUTDOWN_WAIT_S = 60.0  # the longest `await_ray_shutdown` waits for a shutdown in the background
_shutting: threading.Thread | None = None


def ray_address(configured: str | None, env: Mapping[str, str]) -> str:
    """Where a job's Ray is, as Ray programs find it: the configured address when set; else the cluster this
    process runs in (a Ray job's entrypoint gets RAY_ADDRESS from Ray's job supervisor; `ray start` users set
    it too); else "local", a private instance (never a `ray start` cluster found on the machine by chance)."""
    return configured or env.get("RAY_ADDRESS") or "local"


def init_ray(address: str | None, num_cpus: int | None = None, log_to_driver: bool = False) -> bool:
    """Start or join Ray once per process (`ray_address`), for answer and build jobs alike; True if this call
    connected (False: Ray was already up). `num_cpus` sizes a local instance only."""
    import os

    import ray

    await_ray_shutdown()  # a job's own Ray, still going down in the background
    if ray.is_initialized():
        return False
    where = ray_address(address, os.environ)
    log.info("Ray: %s", "starting a local instance" if where == "local" else f"joining {where}")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only listeners on one machine
    from platform_shims.java import jvm_signals_kept

    with jvm_signals_kept():  # Ray replaces the signal handlers a running JVM (BM25 in this process) relies on
        ray.init(
            address=where,
            num_cpus=num_cpus if where == "local" else None,
            include_dashboard=False,
            log_to_driver=log_to_driver,
            configure_logging=False,
        )
    return True


def shutdown_ray(wait: bool = True, then: Callable[[], None] | None = None) -> None:
    """ray.shutdown(), keeping a running JVM's signal handlers: Ray sets SIGSEGV back to the default when it shuts
    down, and the JVM takes SIGSEGV internally, so the process would die at the JVM's next such fault.
    `wait=False`: in a thread, joined by `await_ray_shutdown` (and by the next `init_ray`): a local Ray's shutdown
    mostly waits for its processes to exit (1.2-1.5 s), time an answer job spends on its last merge instead.
    `then` runs once Ray is down, whatever the end."""
    global _shutting
    if wait:
        _shutdown(then)
        return
    await_ray_shutdown()
    _shutting = threading.Thread(target=_shutdown, args=(then,), name="dynrag-ray-shutdown")
    _shutting.start()


def await_ray_shutdown(timeout_s: float = SHUTDOWN_WAIT_S) -> None:
    """Wait for a shutdown started with `shutdown_ray(wait=False)`, if any, at most `timeout_s`."""
    global _shutting
    going, _shutting = _shutting, None
    if going is None:
        return
    going.join(timeout_s)
    if going.is_alive():
        log.warning("Ray's shutdown has not ended after %.0f s; going on without it", timeout_s)


def _shutdown(then: Callable[[], None] | None) -> None:
    import ray

    from platform_shims.java import jvm_signals_kept

    try:
        with jvm_signals_kept():
            ray.shutdown()
    finally:
        if then is not None:
            then()


def gpus_or_fallback(gpus: float, fallback: bool, what: str) -> float:
    """`gpus`, or 0 when `fallback` is on and the Ray cluster has no GPU at all (a GPU config runs anywhere)."""
    import ray

    if gpus and fallback and not ray.cluster_resources().get("GPU", 0):
        log.warning("%s asks for %g GPU but the Ray cluster has none: running on CPU (ray.gpu_fallback)", what, gpus)
        return 0.0
    return gpus
