"""The driver's Supervisor (pipeline/runtime/ray_runner.py) without Ray, over an in-process RunControl whose calls
can be made to time out (issue 78, item 4): looks that keep failing end the job with one line, one or two in a
row do not, and the drain's deadline is checked every turn, whatever the look did."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.config import DynragConfig
from pipeline.engine.drain import Drain
from pipeline.errors import DynragError
from pipeline.runtime import ray_runner
from pipeline.runtime.ray_control import RunControl
from pipeline.runtime.ray_runner import Supervisor

TURN_S = 0.02


class TimedOut:
    """What a call to RunControl gives when it times out: ray.get raises GetTimeoutError for it."""


class FlakyHandle:
    """RunControl's actor handle, in this process: `.method.remote(...)` calls it at once; in the supervisor's
    looks for which `failing(look)` is true, every call it waits for (ray.get) times out."""

    def __init__(self, control: RunControl, failing=lambda look: True):
        self.control, self.failing, self.looks = control, failing, 0

    def __getattr__(self, name: str):
        def remote(*args):
            if name == "set_draining":  # each look's first call
                self.looks += 1
            return TimedOut() if self.failing(self.looks - 1) else getattr(self.control, name)(*args)

        return SimpleNamespace(remote=remote)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray
    from ray.exceptions import GetTimeoutError

    def get(value, timeout=None):
        if isinstance(value, TimedOut):
            raise GetTimeoutError(f"Get timed out: some object(s) not ready after {timeout} s")
        return value

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr(ray_runner, "SUPERVISE_S", TURN_S)


def _wait_for_line(supervisor: Supervisor, within: float) -> str | None:
    deadline = time.monotonic() + within
    while supervisor.line is None and time.monotonic() < deadline:
        time.sleep(TURN_S)
    return supervisor.line


def test_a_supervisor_whose_calls_to_run_control_keep_failing_ends_the_job_with_one_line():
    supervisor = Supervisor(DynragConfig(), FlakyHandle(RunControl()), None, [])
    never = threading.Event()

    def stream():  # the job's stream, blocked (as it is while no replica runs), for 3 s at most
        never.wait(3)
        yield from ()

    try:
        t0 = time.monotonic()
        with pytest.raises(DynragError) as err:
            list(supervisor.watching(stream()))
        assert time.monotonic() - t0 < 2  # three turns, not the stream's end
    finally:
        never.set()
        supervisor.stop()
    line = str(err.value)
    assert line.startswith("the driver's supervisor failed 3 times in a row to ask RunControl about the job")
    assert "GetTimeoutError" in line and line.endswith("stopping") and "\n" not in line


def test_one_or_two_failed_looks_in_a_row_are_let_go():
    handle = FlakyHandle(RunControl(), failing=lambda look: look % 3 != 2)  # two fail, one answers, and again
    supervisor = Supervisor(DynragConfig(), handle, None, [])
    try:
        deadline = time.monotonic() + 5
        while handle.looks < 12 and time.monotonic() < deadline:
            time.sleep(TURN_S)
        assert handle.looks >= 12
        assert supervisor.line is None and supervisor._thread.is_alive()
    finally:
        supervisor.stop()


def test_the_drain_deadline_is_checked_every_turn_even_while_run_control_does_not_answer(monkeypatch):
    monkeypatch.setattr(ray_runner, "DRAIN_GRACE_S", 0.2)
    monkeypatch.setattr(ray_runner, "CALL_FAILURES", 10**6, raising=False)  # the failures alone never end it here
    drain = Drain(0.1)
    drain.request()
    supervisor = Supervisor(DynragConfig(), FlakyHandle(RunControl()), drain, [])
    try:
        line = _wait_for_line(supervisor, 3)
        assert line is not None and line.startswith("drain: the engine actors did not finish within")
    finally:
        supervisor.stop()
