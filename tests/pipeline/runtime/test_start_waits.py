"""Starts are watched (issue 78, item 3), without Ray: Ray's calls are replaced by in-process stand-ins whose
results may never come. A retrieval pool whose actor is never ready, or restarts past its failure budget, and a
tensor-parallel replica's generator host that never loads its model end the start with one line naming what
was awaited, where, and what it asks for, instead of waiting for ever."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from ray.exceptions import GetTimeoutError

from pipeline.config import DynragConfig
from pipeline.errors import DynragError
from pipeline.runtime import pools
from pipeline.runtime.ray_control import RunControl

NO_LIMIT_S = 3.0  # a wait without a limit is taken for a hang past this (the test fails instead of hanging)


class Ref:
    """An ObjectRef stand-in: `value`, ready once `ready` is set (never, unless the test sets it)."""

    def __init__(self, value=True, ready: bool = True):
        self.value, self.ready = value, threading.Event()
        if ready:
            self.ready.set()


def fake_get(value, timeout=None):
    refs = value if isinstance(value, list) else [value]
    for ref in refs:
        if isinstance(ref, Ref) and not ref.ready.wait(NO_LIMIT_S if timeout is None else timeout):
            if timeout is None:
                raise AssertionError("ray.get waited without a limit for a result that never came")
            raise GetTimeoutError(f"Get timed out: some object(s) not ready after {timeout} s")
    got = [r.value if isinstance(r, Ref) else r for r in refs]
    return got if isinstance(value, list) else got[0]


def fake_wait(refs, num_returns=1, timeout=None):
    deadline = time.monotonic() + (NO_LIMIT_S if timeout is None else timeout)
    while True:
        ready = [r for r in refs if r.ready.is_set()][:num_returns]
        if len(ready) == num_returns or time.monotonic() >= deadline:
            return ready, [r for r in refs if r not in ready]
        time.sleep(0.005)


class InProcessHandle:
    """An actor handle over an object in this process: `.method.remote(...)` calls it at once."""

    def __init__(self, target, actor_id: str = ""):
        self.target, self.actor_id = target, actor_id

    @property
    def _actor_id(self):  # what compat.actor_id reads
        return SimpleNamespace(hex=lambda: self.actor_id)

    def __getattr__(self, name: str):
        return SimpleNamespace(remote=getattr(self.target, name))


class FakeActorClass:
    """`ray.remote(cls)` stand-in: `.options(...).remote(...)` makes the next of `actors`, each an InProcessHandle."""

    def __init__(self, actors: list):
        self.actors, self.options_given = iter(actors), {}

    def options(self, **opts):
        self.options_given = opts
        return self

    def remote(self, *args):
        return next(self.actors)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", fake_get)
    monkeypatch.setattr(ray, "wait", fake_wait)
    monkeypatch.setattr(ray, "kill", lambda actor, no_restart=True: killed.append(actor))
    monkeypatch.setattr(pools, "POOL_LOOK_S", 0.05, raising=False)
    killed.clear()


killed: list = []


def _pool_actor(actor_id: str, ready: bool) -> InProcessHandle:
    return InProcessHandle(SimpleNamespace(ready=lambda part: Ref(True, ready)), actor_id)


def _cfg(wait_s: float) -> DynragConfig:
    cfg = DynragConfig()
    cfg.ray.retrieval_actors, cfg.ray.retrieval_actor_num_cpus = 2, 2.0
    cfg.ray.retrieval_actor_resources = {"index_node": 1.0}
    cfg.ray.replica_wait_s = wait_s
    return cfg


def test_a_pool_whose_actor_is_never_ready_ends_the_start_with_one_line_naming_it(monkeypatch):
    import ray

    control = RunControl()
    control.register_pool("bbbb2222ffff", "retrieval", "nodeB1234567", 42)  # started: loading its index on node B
    actors = [_pool_actor("aaaa1111ffff", True), _pool_actor("bbbb2222ffff", False), _pool_actor("cccc3333ffff", False)]
    monkeypatch.setattr(ray, "remote", lambda cls: FakeActorClass(actors))
    cfg = _cfg(0.3)
    cfg.ray.retrieval_actors = 3
    t0 = time.monotonic()
    with pytest.raises(DynragError) as err:
        pools.start_pool(cfg, "retrieval", "/index", None, InProcessHandle(control))
    assert time.monotonic() - t0 < 2
    assert str(err.value) == (
        "the retrieval pool is not ready after 0.3 s (ray.replica_wait_s): 2 of its 3 actors are not: "
        "bbbb2222 on node nodeB123 (started 1 times); cccc3333 has not started on any node; "
        "each asks for 2 CPU, 1 index_node: stopping"
    )


def test_a_pool_actor_restarting_past_its_budget_ends_the_start_at_once(monkeypatch):
    """Pool actors restart without end (one that runs out of memory loading a large index restarts for ever):
    RunControl's line ends the wait long before ray.replica_wait_s."""
    import ray

    control = RunControl(budget=1)
    monkeypatch.setattr(
        ray, "remote", lambda cls: FakeActorClass([_pool_actor("aaaa1111", True), _pool_actor("bbbb1111", False)])
    )

    def restarts() -> None:
        for pid in (41, 42, 43):  # started, died loading the index, again
            control.register_pool("bbbb1111", "retrieval", "nodeB1234567", pid)

    threading.Timer(0.1, restarts).start()
    t0 = time.monotonic()
    with pytest.raises(DynragError, match="retrieval pool actor bbbb1111 failed 2 times"):
        pools.start_pool(_cfg(60), "retrieval", "/index", None, InProcessHandle(control))
    assert time.monotonic() - t0 < 2


def test_a_generator_host_that_never_loads_its_model_ends_the_replicas_start_with_one_line(monkeypatch):
    import ray

    from pipeline.runtime.ray_host import HostedGenerator

    host = InProcessHandle(SimpleNamespace(where=lambda: Ref({"streams": False}, ready=False)), "host")
    monkeypatch.setattr(ray, "remote", lambda cls: FakeActorClass([host]))
    monkeypatch.setattr(ray.util, "placement_group_table", lambda g: {"bundles_to_node_id": {0: "nodeA7654321"}})
    group = SimpleNamespace(
        ready=lambda: Ref(True), id=SimpleNamespace(hex=lambda: "9f9f9f9f0000"), bundle_specs=[{"GPU": 1.0}] * 2
    )
    cfg = DynragConfig()
    cfg.ray.replica_wait_s = 0.3
    t0 = time.monotonic()
    with pytest.raises(DynragError) as err:
        HostedGenerator.start(group, cfg, one_call=False)
    assert time.monotonic() - t0 < 2
    assert str(err.value) == (
        "its tensor-parallel generator host did not load its model within ray.replica_wait_s=0.3 s "
        "(placement group 9f9f9f9f on node nodeA765, asking for [{'GPU': 1.0}, {'GPU': 1.0}])"
    )
    assert killed == [host]  # its GPUs go back at once


def test_a_generator_hosts_call_that_never_returns_ends_at_twice_ray_stall_s_and_a_dead_host_is_engine_dead():
    """The engine actor's call to its tensor-parallel generator host (HostedGenerator._call) waits at most
    2 x ray.stall_s (the driver's watchdog names a stuck replica first; this is the limit where it cannot), then
    ends with one line naming the call and its group; a host whose process died is the engine's death."""
    import ray

    from pipeline.errors import EngineDead
    from pipeline.runtime.ray_host import HostedGenerator
    from pipeline.runtime.waits import WaitExpired

    hung = InProcessHandle(SimpleNamespace(generate=lambda *a: Ref([], ready=False)), "host")
    hosted = HostedGenerator(hung, {"group": "9f9f9f9f0000", "streams": False}, stall_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(WaitExpired) as err:
        hosted.generate(["p"], [None], [False])
    assert 0.35 < time.monotonic() - t0 < 2
    assert "waited 0.4 s for the generator host's call (placement group 9f9f9f9f) with no answer" in str(err.value)
    assert str(err.value).endswith("(2 x ray.stall_s = 0.4); stopping")

    class DiedRef(Ref):  # what ray.get raises for a call to an actor whose process died
        @property
        def value(self):
            raise ray.exceptions.RayActorError()

        @value.setter
        def value(self, _):
            pass

    host = InProcessHandle(SimpleNamespace(generate=lambda *a: DiedRef()), "host")
    dead = HostedGenerator(host, {"group": "9f9f"}, stall_s=0.2)
    with pytest.raises(EngineDead, match="the generator host died"):
        dead.generate(["p"], [None], [False])


def test_a_pool_start_whose_run_control_does_not_answer_ends_with_one_line_naming_it(monkeypatch):
    """The pool's actors are ready, but the driver's RunControl never answers the start's look at the job's line:
    the start ends after POOL_CALL_S with one line naming the call, not with Ray's own timeout error."""
    import ray

    from pipeline.runtime.waits import WaitExpired

    class SilentControl(RunControl):
        def fatal(self):
            return Ref(None, ready=False)

    monkeypatch.setattr(ray, "remote", lambda cls: FakeActorClass([_pool_actor("aaaa1111", True)] * 2))
    monkeypatch.setattr(pools, "POOL_CALL", (0.2, "POOL_CALL_S = 0.2"))
    with pytest.raises(WaitExpired) as err:
        pools.start_pool(_cfg(60), "retrieval", "/index", None, InProcessHandle(SilentControl()))
    assert "waited 0.2 s for RunControl.fatal (the driver's run control) with no answer (POOL_CALL_S = 0.2)" in str(
        err.value
    )
