"""Where a job's wall time goes: named stages, printed as one line; and a call started on a thread beside them."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

SETUP_ENV = "DYNRAG_SETUP_S"  # seconds `make demo` spent in scripts/setup.sh before the demo started


class Stages:
    """Wall seconds per stage, in the order first seen; `setup` from $DYNRAG_SETUP_S where make sets it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.notes: dict[str, str] = {}
        self.t0 = time.perf_counter()
        setup = os.environ.get(SETUP_ENV, "")
        if setup.replace(".", "", 1).isdigit():
            self.seconds["setup"] = float(setup)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float, note: str = "") -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if note:
            self.notes[name] = note

    def line(self) -> str:
        """e.g. `stage times (s): setup 95, data 3, engine start 70 (beside data and index), ...; total 300`:
        the total is this process's wall time plus setup's (stages that overlap are not summed)."""
        total = time.perf_counter() - self.t0 + self.seconds.get("setup", 0.0)
        parts = [f"{n} {s:.0f}" + (f" ({self.notes[n]})" if n in self.notes else "") for n, s in self.seconds.items()]
        return f"stage times (s): {', '.join(parts)}; total {total:.0f}"


class Background:
    """`fn()` on a daemon thread from now; `result()` waits for it and returns its value or raises its error;
    `close()` waits and then calls `finish(value)` (e.g. closing what it made), once."""

    def __init__(self, fn: Callable[[], Any], finish: Callable[[Any], None] | None = None) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._finish = finish
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn,), name="dynrag-background", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed to whoever waits for it
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - self.t0

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value

    def close(self) -> None:
        self._thread.join()
        value, self._value = self._value, None
        if value is not None and self._finish is not None:
            self._finish(value)
