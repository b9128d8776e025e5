"""A drain request: stop admitting questions, finish those in flight within a deadline (signals.py sets it
on SIGTERM; a Ray engine actor, from its driver's request)."""

from __future__ import annotations

import threading
import time

JOB_STOPPING = "the job is stopping"  # the driver's own drain: the job ends, the replicas with it
CLOSING = "closing"  # a replica closed by its owner


class Drain:
    """A request to stop admitting questions and finish those in flight within `seconds`. Set from a signal
    handler or another thread; read by the engine's coordinator (`requested`, `remaining`, `expired`)."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds
        self.event = threading.Event()
        self._deadline = float("inf")
        self.why: str | None = None  # the first request's reason

    def request(self, seconds: float | None = None, why: str = "") -> None:
        """Ask for the drain; a later request may shorten its deadline, never extend it, nor change its reason."""
        self.why = self.why or why or "drain requested"
        deadline = time.monotonic() + (self.seconds if seconds is None else seconds)
        if deadline < self._deadline:
            self._deadline = deadline
            self.seconds = self.seconds if seconds is None else seconds
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def remaining(self) -> float | None:
        """Seconds left to finish the questions in flight (None: no drain requested)."""
        return max(0.0, self._deadline - time.monotonic()) if self.requested else None

    @property
    def for_the_node(self) -> bool:
        """Drained because this process or its node goes (SIGTERM, a drain notice), not because the job or its
        owner ends it."""
        return self.requested and self.why not in (JOB_STOPPING, CLOSING)

    def expired(self) -> bool:
        return self.requested and time.monotonic() >= self._deadline
