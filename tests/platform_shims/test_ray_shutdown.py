"""A job's own local Ray goes down in the background while the job's last merge runs (platform_shims/raytools.py):
`shutdown_ray(wait=False)` returns at once, the guard's `then` runs only once Ray is down, and whoever comes next
(the job's end, the next `init_ray`) waits for it. Ray's shutdown is replaced by a slow stand-in: no Ray starts."""

from __future__ import annotations

import threading
import time

import ray

from platform_shims import raytools


def test_a_shutdown_in_the_background_is_awaited_before_ray_starts_again(monkeypatch):
    down, events = threading.Event(), []

    def slow_shutdown():
        time.sleep(0.3)  # Ray waiting for its processes to exit
        events.append("ray down")
        down.set()

    monkeypatch.setattr(ray, "shutdown", slow_shutdown)
    monkeypatch.setattr(ray, "is_initialized", lambda: not down.is_set())  # "up" until the shutdown ends
    monkeypatch.setattr(ray, "init", lambda **kw: events.append("ray started"))
    raytools.shutdown_ray(wait=False, then=lambda: events.append("guard closed"))
    events.append("merging")  # the caller's own end, meanwhile
    assert raytools.init_ray(None) is True  # the next job: it waits for the shutdown, then starts its own Ray
    assert events == ["merging", "ray down", "guard closed", "ray started"] and raytools._shutting is None
    raytools.shutdown_ray(wait=False)
    raytools.await_ray_shutdown()  # the job's end (answer.py)
    assert raytools._shutting is None and down.is_set()


def test_the_guard_is_closed_even_when_the_shutdown_fails(monkeypatch):
    closed = []

    def failing():
        raise RuntimeError("raylet already gone")

    monkeypatch.setattr(ray, "shutdown", failing)
    raytools.shutdown_ray(wait=False, then=lambda: closed.append(True))
    raytools.await_ray_shutdown()
    assert closed == [True]
