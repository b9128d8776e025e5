"""A tensor-parallel replica's generator, hosted by a child actor inside the replica's placement group.

Ray Data starts each engine actor in the first bundle of a group no other actor holds (`GroupDealer`, through
`ray_remote_args_fn`), so that the actor, its host and its GPUs share a node; a Ray Data without that argument
(Ray 2.64 removes it) starts the actor with plain options (its CPUs) wherever it fits. The actor claims its group
from the driver's `RunControl` (`claim_group`: the one it was started in, else a free one; by actor id, so a
restarted actor gets its group back and a new actor never an occupied one), then starts a `GeneratorHost` in the
group's first bundle with child tasks captured. The host builds the generator there: vLLM's Ray executor finds
the group (`ray.util.get_current_placement_group()`) and puts its tensor-parallel workers on the group's GPUs,
one a bundle, all on one node (STRICT_PACK). The engine actor calls it through `HostedGenerator`, which keeps
the generator's protocol (`generate`; `submit` -> Future where the hosted one streams), so the engine, retrieval
and the part writer stay in the engine actor.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

from pipeline.config import DynragConfig
from pipeline.engine.streaming import InFlight
from pipeline.errors import DynragError, EngineDead


class GeneratorHost:
    """The child actor (async: each prompt awaits its sequence, none holds a thread) holding the generator."""

    def __init__(self, cfg_json: dict, one_call: bool, make_backends: Any = None):
        import ray

        from pipeline.backends import make_generator

        cfg = DynragConfig.model_validate(cfg_json)
        ctx = ray.get_runtime_context()
        self.node = ctx.get_node_id()
        group = ray.util.get_current_placement_group()
        self.group = group.id.hex() if group is not None else None
        nodes = set(ray.util.placement_group_table(group).get("bundles_to_node_id", {}).values()) if group else set()
        why = misplaced(self.node, nodes, group is not None)
        if why:
            raise DynragError(why)
        # a test's latency-model backends (picklable) build the generator a test gives; else the configuration's
        self.gen = make_backends(cfg, None).generator if make_backends is not None else make_generator(cfg, one_call)

    def where(self) -> dict:
        capacity = getattr(self.gen, "kv_capacity", None)
        kv = capacity() if capacity is not None else None
        return {"node": self.node, "group": self.group, "streams": hasattr(self.gen, "submit"), "kv_capacity": kv}

    async def submit(self, prompt, sampling, chat) -> tuple:
        return await asyncio.wrap_future(self.gen.submit(prompt, sampling, chat))

    async def generate(self, prompts, samplings, chats) -> list:
        return await asyncio.to_thread(self.gen.generate, prompts, samplings, chats)

    async def program_ended(self, program: int) -> None:
        end = getattr(self.gen, "program_ended", None)
        if end is not None:
            end(program)

    async def close(self) -> None:
        close = getattr(self.gen, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


def misplaced(node: str, group_nodes: set[str], in_group: bool) -> str | None:
    """Why a tensor-parallel replica's generator host on `node` is misplaced (None: it is not)."""
    if not in_group:
        return "this tensor-parallel generator host is in no placement group: its vLLM workers would have no GPUs"
    if node not in group_nodes:
        return f"this tensor-parallel generator host is on node {node[:8]}, not on its group's ({sorted(group_nodes)})"
    return None


def group_nodes(group: Any) -> list[str]:
    """The nodes a placement group's bundles were placed on."""
    import ray

    return sorted(set(ray.util.placement_group_table(group).get("bundles_to_node_id", {}).values()))


def not_started(group: str, bundles: list[dict], nodes: list[str], wait_s: float) -> str:
    """The line for a tensor-parallel generator host whose model did not load within `wait_s`."""
    on = ", ".join(n[:8] for n in nodes) or "no node"
    return (
        f"its tensor-parallel generator host did not load its model within ray.replica_wait_s={wait_s:g} s "
        f"(placement group {group[:8]} on node {on}, asking for {bundles})"
    )


class HostedGenerator:
    """The engine actor's side of a `GeneratorHost`: the generator protocol over the host's calls. The host's
    process gone (its node lost, vLLM's core killing it) is the engine's death (EngineDead): the replica fails
    and its actor restarts within its budget, claiming its group again."""

    def __init__(self, host: Any, where: dict, stall_s: float = 900.0):
        """`stall_s` (ray.stall_s): a call to the host waits at most twice that (a generate call is an engine call:
        the driver's watchdog names a replica with none ending for ray.stall_s first; this is the limit where it
        cannot)."""
        self.host, self.where, self.stall_s = host, where, stall_s
        self.flight = InFlight()  # the replica's generator busy fraction, as a local generator keeps it
        self._keys = iter(range(1 << 62))
        self._lock = threading.Lock()

    @classmethod
    def start(cls, group: Any, cfg: DynragConfig, one_call: bool, make_backends: Any = None) -> HostedGenerator:
        """A host in `group`'s first bundle (its CPU; the GPUs are its workers'), its generator loaded."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        wait_s = cfg.ray.replica_wait_s
        try:  # a group that cannot be placed (no node has its GPUs) is a replica that never starts
            ray.get(group.ready(), timeout=wait_s)
        except ray.exceptions.GetTimeoutError:
            raise DynragError(
                f"its placement group {group.bundle_specs} was not placed on one node within "
                f"ray.replica_wait_s={wait_s:g} s"
            ) from None
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
        host = (
            ray.remote(GeneratorHost)
            .options(num_cpus=HOST_CPUS, num_gpus=0, scheduling_strategy=strategy, max_restarts=0, max_concurrency=1000)
            .remote(cfg.model_dump(mode="json"), one_call, make_backends)
        )
        try:  # its constructor's error, if it failed to load; a start that hangs (vLLM, NCCL) ends at the limit
            where = ray.get(host.where.remote(), timeout=wait_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(host, no_restart=True)
            raise DynragError(not_started(group.id.hex(), group.bundle_specs, group_nodes(group), wait_s)) from None
        return (HostedStreamingGenerator if where["streams"] else cls)(host, where, cfg.ray.stall_s)

    def _call(self, ref) -> Any:
        import ray

        from pipeline.runtime.waits import bounded_get

        try:
            what = f"the generator host's call (placement group {str(self.where.get('group'))[:8]})"
            return bounded_get(ref, what, 2 * self.stall_s, f"2 x ray.stall_s = {2 * self.stall_s:g}")
        except ray.exceptions.RayActorError as err:
            raise EngineDead(f"the generator host died: {err}") from err

    def generate(self, prompts, samplings, chats) -> list:
        return self._call(self.host.generate.remote(prompts, samplings, chats))

    def kv_capacity(self) -> int | None:
        return self.where.get("kv_capacity")

    def close(self) -> None:
        import ray

        try:
            ray.get(self.host.close.remote(), timeout=CLOSE_S)
        except Exception:  # the host is gone already, or stuck: it goes with the kill
            pass
        ray.kill(self.host, no_restart=True)


class HostedStreamingGenerator(HostedGenerator):
    """A hosted streaming generator: each prompt submitted on its own (pipeline/engine/streaming.py)."""

    def program_ended(self, program: int) -> None:
        """The host's generator gives back the program's pinned KV blocks (kv_pins.py); sent without waiting."""
        self.host.program_ended.remote(program)

    def submit(self, prompt, sampling, chat) -> Future:
        import ray

        with self._lock:
            key = next(self._keys)
        self.flight.start(key)
        out: Future = Future()

        def done(ref_future: Future) -> None:
            self.flight.finish(key)
            try:
                out.set_result(ref_future.result(timeout=0))  # (done: its callback)
            except ray.exceptions.RayActorError as err:  # a dead engine is a value, as vLLM's own (vllm_stream)
                out.set_result((EngineDead(f"the generator host died: {err}"), 0.0))
            except BaseException as err:  # noqa: BLE001 - the prompt's own error, as the protocol passes it
                out.set_exception(err)

        self.host.submit.remote(prompt, sampling, chat).future().add_done_callback(done)
        return out


HOST_CPUS = 1.0  # the host's share of its group's first bundle (the vLLM engine core's process)
CLOSE_S = 90.0  # for the hosted generator to shut its engine down
