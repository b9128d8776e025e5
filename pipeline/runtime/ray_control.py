"""The driver's side of a Ray answer job that its engine actors consult: one small actor (`RunControl`) on the
driver's node (it goes only with the driver) holding

- the count of engines that failed (an engine actor restarts a few times, then the job stops);
- the drain: raised by the driver on SIGTERM; each engine actor polls it and drains (`remaining`), and says
  when it has drained (`drained`), so the driver stops feeding once every replica has;
- the tensor-parallel replicas' placement groups: made once by the driver, one per replica
  (`make_replica_groups`), each claimed by one engine actor at its start (`claim`): the group on the actor's
  own node when there is one, else any unclaimed group, else one whose holder has died (a restarted actor
  takes over its predecessor's). vLLM's Ray executor then starts one worker on each of the group's GPUs
  (pipeline/backends/vllm_gen.py). The driver removes the groups at the end (`remove_replica_groups`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


class RunControl:
    def __init__(self, groups: list | None = None) -> None:
        self.deadline: float | None = None  # time.time() by which the engines stop
        self.groups = list(groups or [])
        self.holders: dict[int, str] = {}  # group index -> the engine actor's id (hex) holding it
        self.drained_actors: set[str] = set()
        self.engine_failures = 0

    # -- the drain --------------------------------------------------------------------------
    def request(self, seconds: float) -> None:
        if self.deadline is None:
            self.deadline = time.time() + seconds

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    def drained(self, actor: str) -> None:
        self.drained_actors.add(actor)

    def drained_count(self) -> int:
        return len(self.drained_actors)

    def engine_failed(self) -> int:
        """Count an engine actor's failed engine; how many this run has had."""
        self.engine_failures += 1
        return self.engine_failures

    # -- replica placement groups -------------------------------------------------------------
    def claim(self, actor: str, node: str) -> Any:
        """The placement group for the engine actor `actor` (hex id) on `node`; None when the run has none."""
        if not self.groups:
            return None
        for i, holder in self.holders.items():  # an actor asking again (a retried constructor) keeps its own
            if holder == actor:
                return self.groups[i]
        free = [i for i in range(len(self.groups)) if i not in self.holders]
        if not free:
            free = [i for i, holder in self.holders.items() if not actor_alive(holder)]
        if not free:
            raise RuntimeError(f"all {len(self.groups)} replica placement groups are held by live engine actors")
        here = [i for i in free if node in group_nodes(self.groups[i])]
        i = (here or free)[0]
        self.holders[i] = actor
        return self.groups[i]

    def release(self, actor: str) -> None:
        for i, holder in list(self.holders.items()):
            if holder == actor:
                del self.holders[i]

    def held(self) -> dict[int, str]:
        return dict(self.holders)


def group_nodes(group) -> set[str]:
    """The node ids a placement group's bundles are on (none while it is pending)."""
    from ray.util import placement_group_table

    return set(placement_group_table(group).get("bundles_to_node_id", {}).values())


def actor_alive(actor_id: str) -> bool:
    import ray._private.state

    try:
        state = ray._private.state.actors(actor_id=actor_id)
    except Exception:  # the table cannot say: keep the claim (a live replica's GPUs are never given away)
        return True
    return bool(state) and state.get("State") != "DEAD"


def make_replica_groups(bundles: list[dict[str, float]], replicas: int) -> list:
    """One STRICT_PACK placement group of `bundles` per tensor-parallel replica (its workers exchange
    activations every layer: one node). Not waited for: on an autoscaling cluster their nodes start on
    demand, and each engine actor waits for its own group (vLLM does)."""
    from ray.util import placement_group

    return [placement_group(bundles, strategy="STRICT_PACK", name=f"dynrag-replica-{i}") for i in range(replicas)]


def remove_replica_groups(groups: list) -> None:
    from ray.util import remove_placement_group

    for g in groups:
        try:
            remove_placement_group(g)
        except Exception as err:  # the cluster is going away: nothing to keep
            log.warning("removing placement group %s failed: %s", g.id.hex(), err)


@contextlib.contextmanager
def placed_in(group) -> Iterator[None]:
    """While vLLM builds its engine: `group` is this process's placement group as vLLM looks it up
    (`ray.util.get_current_placement_group()`, read by EngineArgs.create_engine_config and handed to the
    engine core process), as if the engine actor had been scheduled in it. Ray Data starts every engine
    actor with the same options, so no actor is; each claims its replica's group instead. No group: as is."""
    if group is None:
        yield
        return
    import ray.util

    looked_up = ray.util.get_current_placement_group
    ray.util.get_current_placement_group = lambda: group
    try:
        yield
    finally:
        ray.util.get_current_placement_group = looked_up
