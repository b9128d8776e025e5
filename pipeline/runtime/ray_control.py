"""The driver's side of a Ray answer job that its engine actors consult: one small actor (`RunControl`) on the
driver's node (it goes with the driver). No Ray here: the actor is this class made remote, and the tests use
it as it is.

- replicas: each engine actor registers at its start (`register`); a restart of the same actor counts as a
  failure of that replica unless its previous process had drained (a pre-empted node is not the replica's
  fault). A replica whose failures (restarts and engine errors) pass `budget` makes the job fatal;
- batches: each attempt of a batch starts with `begin` and ends with `end`; an attempt that never ended was
  in a process that died, unless its node was lost or drained (`set_lost`: not the batch's fault). A batch
  with a death runs alone in its next process (`alone`); after `batch_deaths` deaths, one alone, it is poison
  (ray_runner.poison): the next attempt writes its rows as error rows with the cause. `committed`: the
  batches the driver has committed, which a drained replica waits for before it exits;
- progress: each heartbeat carries the replica's progress (outcomes and engine calls) and whether it holds
  batches; `stuck` names a busy replica that has not moved, or a pool call that has not ended, for `stall_s`;
- pools: each pool actor registers at its start; its restarts count against the same budget, and a pool
  actor that cannot come back (`pool_lost`) makes the job fatal;
- the drain: the driver's own (SIGTERM to the job, `request`) or a node's (Ray's drain notice with its
  deadline, `set_draining`, fed by the driver's supervisor); each actor polls `instructions`, which is also
  its heartbeat, and says when it has drained (`drained`), counted by live replica;
- `fatal`: the one line the job ends with (set by a replica over its budget, or by the supervisor).
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.engine.drain import JOB_STOPPING

DRAIN_MARGIN_S = 5.0  # a node's replicas finish this long before its drain deadline, to write their parts


class RunControl:
    def __init__(self, budget: int = 3, batch_deaths: int = 2) -> None:
        self.budget, self.batch_deaths = budget, batch_deaths
        self.deadline: float | None = None  # time.time() by which every engine stops (the driver's drain)
        self.draining_nodes: dict[str, float] = {}  # node id -> time.time() of its drain deadline
        self.replicas: dict[str, dict] = {}  # actor id -> node, pid, starts, failures, drained, seen
        self.attempts: dict[str, list[dict]] = {}  # batch key -> attempts that have not ended
        self.fatal_line: str | None = None
        self.start_line: str | None = None  # why the last replica that could not start did not
        self.actor_handles: dict[str, Any] = {}  # actor id -> handle, of every replica that registered
        self.lost_nodes: set[str] = set()  # nodes dead or drained: their processes' deaths are no batch's fault
        self.committed_keys: set[str] = set()  # batch keys the driver has committed
        self.pools: dict[str, dict] = {}  # pool actor id -> kind, node, pid, starts, failures
        self.group_of: dict[str, int] = {}  # engine actor id -> the placement group it claimed (its index)
        self.dealt: dict[int, int] = {}  # group -> the number of the deal that last gave it to a starting engine actor

    # -- replicas ---------------------------------------------------------------------------------
    def register(self, actor: str, node: str, pid: int, handle: Any = None) -> int:
        """A replica's process starts; returns its failures so far (its restarts after a death count).
        `handle`: its actor handle, for the driver to end it with the job (`handles`)."""
        r = self.replicas.setdefault(actor, {"starts": 0, "failures": 0, "drained": False})
        if handle is not None:
            self.actor_handles[actor] = handle
        if r["starts"] and not r["drained"]:
            r["failures"] += 1
        r.update(starts=r["starts"] + 1, drained=False, node=node, pid=pid, seen=time.time())
        if r["failures"] > self.budget:
            self.fatal_line = self.fatal_line or (
                f"engine replica {actor[:8]} failed {r['failures']} times (its process died or its engine "
                f"failed; budget {self.budget}), last on node {node[:8]}: stopping the job"
            )
        return r["failures"]

    def group_node(self, actor: str, node: str) -> None:
        """Tensor-parallel replica `actor`'s GPUs are on `node` (its placement group's, where its generator host
        runs), which may not be its own process's: a drain or loss of either node is the replica's."""
        self.replicas.setdefault(actor, {"starts": 1, "failures": 0, "drained": False})["group_node"] = node

    def deal_group(self, groups: int) -> int:
        """The placement group (of `groups`) a new engine actor is started in (`GroupDealer`): one that no actor
        holds where there is one, of those the one dealt longest ago. Not a reservation: Ray Data also asks for an
        actor's options without starting one (its memory detector); an actor holds its group once it claims it,
        which it does first thing."""
        held = [0] * groups
        for g in self.group_of.values():
            held[g] += 1
        pick = min(range(groups), key=lambda i: (held[i], self.dealt.get(i, -1)))
        self.dealt[pick] = max(self.dealt.values(), default=-1) + 1
        return pick

    def claim_group(self, actor: str, groups: int, placed: int | None = None) -> int | None:
        """The placement group (of `groups`) that tensor-parallel replica `actor` uses: the one it claimed before
        (a restarted actor keeps its id, and its group), else `placed` (the group Ray started it in), else one no
        other actor holds; None: that group, or every group, is held (the actor cannot start: a failure of its
        budget, never a wait in another's group)."""
        if actor in self.group_of:
            return self.group_of[actor]
        held = set(self.group_of.values())
        if placed is not None:  # the group Ray started it in: its own, unless another actor holds it
            free = [] if placed in held else [placed]
        else:
            free = [i for i in range(groups) if i not in held]
        if not free:
            return None
        self.group_of[actor] = free[0]
        return free[0]

    def engine_failed(self, actor: str, why: str) -> bool:
        """A replica's engine failed (an exception, its process still alive); True: restart it, False: over
        its budget (the job is fatal). The restart itself is not counted again."""
        r = self.replicas.setdefault(actor, {"starts": 1, "failures": 0, "drained": False})
        r["drained"] = True  # the coming restart is this failure, counted here (or none's: below)
        if _nodes(r) & self.lost_nodes:
            return True  # its node or its GPUs' node went: not the replica's fault
        r["failures"] += 1
        if r["failures"] > self.budget:
            self.fatal_line = self.fatal_line or (
                f"engine replica {actor[:8]} failed {r['failures']} times (budget {self.budget}): {why}"
            )
            return False
        return True

    def start_failed(self, actor: str, node: str, why: str) -> None:
        """A replica's constructor failed (its index or model would not load): a failure of its budget, and the
        line the job ends with when Ray Data gives up on the replica (`start_failure`)."""
        self.engine_failed(actor, why)
        self.group_of.pop(actor, None)  # Ray Data replaces the actor (a new id): its group is the new one's
        self.start_line = f"engine replica {actor[:8]} could not start on node {node[:8]}: {why}"

    def start_failure(self) -> str | None:
        return self.fatal_line or self.start_line

    def drained(self, actor: str) -> None:
        if actor in self.replicas:
            self.replicas[actor]["drained"] = True

    def drained_count(self) -> int:
        """Replicas whose current process has drained (a restarted one counts again only once it drains)."""
        return sum(r["drained"] for r in self.replicas.values())

    def handles(self) -> list:
        return list(self.actor_handles.values())

    def last_seen(self) -> float | None:
        """time.time() of the latest heartbeat of any replica (None: none has started)."""
        return max((r["seen"] for r in self.replicas.values() if "seen" in r), default=None)

    # -- batches ----------------------------------------------------------------------------------------
    def begin(self, key: str, actor: str, pid: int) -> list[dict]:
        """An attempt of batch `key` starts; returns the earlier attempts that died (never ended), less those
        whose node was lost or drained meanwhile (forgotten: the node's loss is not the batch's fault)."""
        dead = [a for a in self.attempts.get(key, []) if not set(a["nodes"]) & self.lost_nodes]
        node = self.pools[actor]["node"] if actor in self.pools else self._node(actor)
        nodes = sorted({node, *_nodes(self.replicas.get(actor, {}))})
        self.attempts[key] = [
            *dead,
            {"actor": actor, "pid": pid, "node": node, "nodes": nodes, "alone": False, "at": time.time()},
        ]
        return dead

    def alone(self, key: str, pid: int) -> None:
        """The attempt of batch `key` in process `pid` answers with no other batch beside it."""
        for a in self.attempts.get(key, []):
            if a["pid"] == pid:
                a["alone"] = True

    def end(self, key: str) -> None:
        self.attempts.pop(key, None)

    def committed(self, key: str) -> None:
        self.committed_keys.add(key)

    def all_committed(self, keys: list[str]) -> bool:
        return all(k in self.committed_keys for k in keys)

    def set_lost(self, nodes: list[str]) -> None:
        """The nodes Ray has lost or is draining now (fed by the driver's supervisor every turn): a node whose
        drain was cancelled is no longer one, so a death of its processes counts again."""
        self.lost_nodes = set(nodes)

    def _node(self, actor: str) -> str:
        return self.replicas.get(actor, {}).get("node", "?")

    # -- progress -------------------------------------------------------------------------------------
    def stuck(self, now: float, stall_s: float) -> str | None:
        """The job's line when a replica holding batches has made no progress (no row, no engine call) for
        `stall_s`, or a pool call has run that long (a hung JVM, vLLM or store call); else None."""
        for actor, r in self.replicas.items():
            if r.get("busy") and not _nodes(r) & self.lost_nodes and now - r.get("moved", now) > stall_s:
                return (
                    f"engine replica {actor[:8]} (pid {r['pid']}, node {str(r['node'])[:8]}) holds batches but has "
                    f"made no progress for {now - r['moved']:.0f} s (ray.stall_s={stall_s:g}): stopping the job"
                )
        for attempts in self.attempts.values():
            for a in attempts:
                if a["actor"] in self.pools and a["node"] not in self.lost_nodes and now - a["at"] > stall_s:
                    p = self.pools[a["actor"]]
                    return (
                        f"{p['kind']} pool actor {a['actor'][:8]} (pid {a['pid']}, node {str(a['node'])[:8]}) has "
                        f"been serving one call for {now - a['at']:.0f} s (ray.stall_s={stall_s:g}): stopping the job"
                    )
        return None

    # -- pools ----------------------------------------------------------------------------------------
    def register_pool(self, actor: str, kind: str, node: str, pid: int) -> None:
        """A pool actor's process starts: a restart is a failure (its process died) unless its node was lost."""
        p = self.pools.setdefault(actor, {"kind": kind, "starts": 0, "failures": 0})
        if p["starts"] and p.get("node") not in self.lost_nodes:
            p["failures"] += 1
        p.update(starts=p["starts"] + 1, node=node, pid=pid)
        if p["failures"] > self.budget:
            self.fatal_line = self.fatal_line or (
                f"{kind} pool actor {actor[:8]} failed {p['failures']} times (its process died; budget "
                f"{self.budget}), last on node {node[:8]}: stopping the job"
            )

    def pool_actor(self, actor: str) -> dict | None:
        """What is known of a pool actor's starts (kind, node, pid, starts, failures); None: it never started."""
        return self.pools.get(actor)

    def pool_lost(self, actor: str, why: str) -> None:
        kind = self.pools.get(actor, {}).get("kind", "a")
        self.fatal_line = (
            self.fatal_line or f"{kind} pool actor {actor[:8]} is gone and cannot come back ({why}): stopping the job"
        )

    # -- the drain ----------------------------------------------------------------------------------
    def request(self, seconds: float) -> None:
        if self.deadline is None:
            self.deadline = time.time() + seconds

    def set_draining(self, nodes: dict[str, float]) -> None:
        self.draining_nodes = dict(nodes)

    def instructions(self, actor: str, progress: int | None = None, busy: bool = False) -> tuple[float, str] | None:
        """What the replica should do now: (seconds left, why) to drain, or None to go on. Its heartbeat, with
        its progress (a count that grows with each outcome and engine call) and whether it holds batches."""
        r = self.replicas.get(actor)
        if r is not None:
            r["seen"] = time.time()
            if progress is not None and (progress != r.get("progress") or not r.get("busy")):
                r["moved"] = r["seen"]  # progress, or a replica that just took work
            r.update(progress=progress, busy=busy)
        now = time.time()
        if self.deadline is not None:
            return max(0.0, self.deadline - now), JOB_STOPPING
        draining = [self.draining_nodes[n] for n in _nodes(r or {}) if n in self.draining_nodes]
        if draining:  # its own node, or its GPUs' (a tensor-parallel replica's group)
            return max(0.0, min(draining) - now - DRAIN_MARGIN_S), "its node is being drained"
        return None

    # -- the end ----------------------------------------------------------------------------------------
    def fatal(self) -> str | None:
        return self.fatal_line


def _nodes(replica: dict) -> set[str]:
    """A replica's nodes: its process's, and its GPUs' where a placement group holds them elsewhere."""
    return {n for n in (replica.get("node"), replica.get("group_node")) if n}
