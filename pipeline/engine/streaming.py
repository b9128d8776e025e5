"""Streaming generators: each prompt is submitted on its own and delivered when its sequence finishes.

A streaming generator has `submit(prompt, sampling, chat) -> concurrent.futures.Future`, whose result is
`(Completion or the exception for that prompt, the prompt's share of the generator's time in seconds)`:
one prompt's failure is a value, so it stays its question's. A future that fails or is cancelled (the
generator shut down under it) resolves its waiters too, with that error as the prompt's result
(`outcome`). It has no call boundaries, so a short answer never waits for a long
pseudo-context in the same batch (vLLM's continuous batching, driven as its async engine is). Its
`generate` (for the lockstep engine and plain callers) is `generate_all` over `submit`, which subclasses
of `StreamingGenerator` inherit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

from pipeline.engine.requests import Completion, Prompt, SamplingSpec


class InFlight:
    """Sequences in flight and each one's cost share: every moment of time is split equally among the
    sequences in flight then, so the shares add up to `busy_s`, the time with any sequence in flight."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.busy_s = clock, 0.0
        self._start: dict[Any, float] = {}  # key -> the per-sequence time integral when it started
        self._per_seq, self._since = 0.0, 0.0  # integral of dt / (sequences in flight)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Sequences in flight now."""
        return len(self._start)

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


def resolved(result: Completion | BaseException, cost_s: float = 0.0) -> Future:
    """A future already done with `(result, cost_s)`: a prompt that failed before it reached the model."""
    fut: Future = Future()
    fut.set_result((result, cost_s))
    return fut


def outcome(fut: Future) -> tuple[Completion | BaseException, float]:
    """`fut`'s `(result, cost_s)` once it is done; a future that failed or was cancelled gives its prompt that
    error (a CancelledError is an Exception here, so it stays its question's)."""
    try:
        err = fut.exception()  # waits; raises if the future is, or becomes, cancelled
    except CancelledError:
        return CancelledError("the prompt's generation was cancelled"), 0.0
    return (err, 0.0) if err is not None else fut.result()


def collect(futures: list[Future], finish: Callable[[list, list[float]], None]) -> None:
    """Call `finish(results, costs)` once, in the thread that completes the last of `futures` (or at once if
    there are none)."""
    left, lock = [len(futures)], threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = not left[0]
        if last:
            outs = [outcome(f) for f in futures]
            finish([r for r, _ in outs], [c for _, c in outs])

    if not futures:
        finish([], [])
    for f in futures:
        f.add_done_callback(one_done)


def generate_all(
    submit: Callable[..., Future], prompts: Sequence[Prompt], samplings: Sequence[SamplingSpec], chats: Sequence[bool]
) -> list:
    """A batch `generate` on a streaming generator: submit every prompt, return when all are done. Waits on
    each future in turn, not with `concurrent.futures.wait`, which counts a future cancelled by its holder
    (not by its producer) as still pending until the producer notices."""
    futures = [submit(p, s, c) for p, s, c in zip(prompts, samplings, chats)]
    return [outcome(f)[0] for f in futures]


class StreamingGenerator:
    """A streaming generator's batch `generate`, over the `submit(prompt, sampling, chat) -> Future` a subclass
    defines (not declared here: `Backends.streams` asks whether the generator has one)."""

    def generate(self, prompts: Sequence[Prompt], samplings: Sequence[SamplingSpec], chats: Sequence[bool]) -> list:
        # `submit` is a subclass's: not declared here, as Backends.streams tests for it with hasattr
        return generate_all(self.submit, prompts, samplings, chats)  # type: ignore[attr-defined]
