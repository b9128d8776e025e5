"""Streaming generators: each prompt is submitted on its own and delivered when its sequence finishes.

A streaming generator has `submit(prompt, sampling, chat, done)`, where `done(result, cost_s)` is called
once from the generator's thread with a `Completion` (or the exception for that prompt) and the prompt's
share of the generator's time. It has no call boundaries, so a short answer never waits for a long
pseudo-context in the same batch (vLLM's continuous batching, driven as its async engine is). Its
`generate` (for the lockstep engine and plain callers) is `generate_all` over `submit`, which subclasses
of `StreamingGenerator` inherit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class InFlight:
    """Sequences in flight and each one's cost share: every moment of time is split equally among the
    sequences in flight then, so the shares add up to `busy_s`, the time with any sequence in flight."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.busy_s = clock, 0.0
        self._start: dict[Any, float] = {}  # key -> the per-sequence time integral when it started
        self._per_seq, self._since = 0.0, 0.0  # integral of dt / (sequences in flight)
        self._lock = threading.Lock()

    def _tick(self) -> None:
        now = self.clock()
        if self._start:
            self.busy_s += now - self._since
            self._per_seq += (now - self._since) / len(self._start)
        self._since = now

    def start(self, key: Any) -> None:
        with self._lock:
            self._tick()
            self._start[key] = self._per_seq

    def finish(self, key: Any) -> float:
        """The finished sequence's cost share, in seconds."""
        with self._lock:
            self._tick()
            return self._per_seq - self._start.pop(key)


def collect(n: int, finish: Callable[[list, list[float]], None]) -> Callable[[int], Callable]:
    """`done` callbacks for n submitted prompts (`done_at(i)` for the i-th): `finish(results, costs)` runs
    once, in the thread that delivers the last of them."""
    results, costs, left, lock = [None] * n, [0.0] * n, [n], threading.Lock()

    def done_at(i: int):
        def done(result, cost_s: float) -> None:
            results[i], costs[i] = result, cost_s
            with lock:
                left[0] -= 1
                last = not left[0]
            if last:
                finish(results, costs)

        return done

    return done_at


def generate_all(submit: Callable, prompts, samplings, chats) -> list:
    """A batch `generate` on a streaming generator: submit every prompt, return when all are done."""
    out: list = []
    all_done = threading.Event()

    def finish(results: list, _costs: list[float]) -> None:
        out.extend(results)
        all_done.set()

    done_at = collect(len(prompts), finish)
    for i, (p, s, c) in enumerate(zip(prompts, samplings, chats)):
        submit(p, s, c, done_at(i))
    if prompts:
        all_done.wait()
    return out


class StreamingGenerator:
    """A streaming generator's batch `generate`, over the `submit(prompt, sampling, chat, done)` a subclass
    defines (not declared here: `Backends.streams` asks whether the generator has one)."""

    def generate(self, prompts, samplings, chats) -> list:
        # `submit` is a subclass's: not declared here, as Backends.streams tests for it with hasattr
        return generate_all(self.submit, prompts, samplings, chats)  # type: ignore[attr-defined]
