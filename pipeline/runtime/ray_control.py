"""The driver's side of a Ray answer job that its engine actors consult: one small actor (`RunControl`) on the
driver's node (it goes with the driver). No Ray here: the actor is this class made remote, and the tests use
it as it is.

- replicas: each engine actor registers at its start (`register`); a restart of the same actor counts as a
  failure of that replica unless its previous process had drained (a pre-empted node is not the replica's
  fault). A replica whose failures (restarts and engine errors) pass `budget` makes the job fatal;
- batches: each attempt of a batch starts with `begin` and ends with `end`; an attempt that never ended was
  in a process that died. After `batch_deaths` such attempts the batch is poison: the next attempt writes
  its rows as error rows with the cause instead of killing one more process;
- the drain: the driver's own (SIGTERM to the job, `request`) or a node's (Ray's drain notice with its
  deadline, `set_draining`, fed by the driver's supervisor); each actor polls `instructions`, which is also
  its heartbeat, and says when it has drained (`drained`), counted by live replica;
- `fatal`: the one line the job ends with (set by a replica over its budget, or by the supervisor).
"""

from __future__ import annotations

import time
from typing import Any

DRAIN_MARGIN_S = 5.0  # a node's replicas finish this long before its drain deadline, to write their parts


class RunControl:
    def __init__(self, budget: int = 3, batch_deaths: int = 2) -> None:
        self.budget, self.batch_deaths = budget, batch_deaths
        self.deadline: float | None = None  # time.time() by which every engine stops (the driver's drain)
        self.draining_nodes: dict[str, float] = {}  # node id -> time.time() of its drain deadline
        self.replicas: dict[str, dict] = {}  # actor id -> node, pid, starts, failures, drained, seen
        self.attempts: dict[str, list[dict]] = {}  # batch key -> attempts that have not ended
        self.fatal_line: str | None = None
        self.actor_handles: dict[str, Any] = {}  # actor id -> handle, of every replica that registered

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
            self.fatal_line = (
                f"engine replica {actor[:8]} failed {r['failures']} times (its process died or its engine "
                f"failed; budget {self.budget}), last on node {node[:8]}: stopping the job"
            )
        return r["failures"]

    def engine_failed(self, actor: str, why: str) -> bool:
        """A replica's engine failed (an exception, its process still alive); True: restart it, False: over
        its budget (the job is fatal). The restart itself is not counted again."""
        r = self.replicas.setdefault(actor, {"starts": 1, "failures": 0, "drained": False})
        r["failures"] += 1
        r["drained"] = True  # the coming restart is this failure, counted here
        if r["failures"] > self.budget:
            self.fatal_line = f"engine replica {actor[:8]} failed {r['failures']} times (budget {self.budget}): {why}"
            return False
        return True

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
        """An attempt of batch `key` starts; returns the earlier attempts that died (never ended)."""
        dead = list(self.attempts.get(key, []))
        self.attempts.setdefault(key, []).append({"actor": actor, "pid": pid, "node": self._node(actor)})
        return dead

    def end(self, key: str) -> None:
        self.attempts.pop(key, None)

    def _node(self, actor: str) -> str:
        return self.replicas.get(actor, {}).get("node", "?")

    # -- the drain ----------------------------------------------------------------------------------
    def request(self, seconds: float) -> None:
        if self.deadline is None:
            self.deadline = time.time() + seconds

    def set_draining(self, nodes: dict[str, float]) -> None:
        self.draining_nodes = dict(nodes)

    def instructions(self, actor: str) -> tuple[float, str] | None:
        """What the replica should do now: (seconds left, why) to drain, or None to go on. Its heartbeat."""
        r = self.replicas.get(actor)
        if r is not None:
            r["seen"] = time.time()
        now = time.time()
        if self.deadline is not None:
            return max(0.0, self.deadline - now), "the job is stopping"
        node = r.get("node") if r else None
        if node in self.draining_nodes:
            left = self.draining_nodes[node] - now - DRAIN_MARGIN_S
            return max(0.0, left), "its node is being drained"
        return None

    # -- the end ----------------------------------------------------------------------------------------
    def fatal(self) -> str | None:
        return self.fatal_line
