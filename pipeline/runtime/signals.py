"""SIGTERM drains a job; a second SIGTERM, or Ctrl-C, stops it at once.

SIGTERM is what a preemptible node gets shortly before it goes. `stop_on_sigterm(drain)` turns the first
one into a `Drain` request: the engine stops admitting questions, finishes those in flight for at most
`answer.drain_s`, every finished answer is written, and the job then raises `Interrupted` (a
KeyboardInterrupt), so `finally` blocks run, backends close, and the CLI exits 130; a rerun answers the
rest. A second SIGTERM (or Ctrl-C, SIGINT) raises `Interrupted` at once: rows already written stay.
Only the main thread can install the handler; elsewhere this is a no-op.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from pipeline.engine.drain import Drain


class Interrupted(KeyboardInterrupt):
    """The job was asked to stop (SIGTERM)."""


@contextlib.contextmanager
def stop_on_sigterm(drain: Drain | None = None):
    """While inside: SIGTERM requests `drain` (the second one, or any without a drain, raises Interrupted)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    sigterm_drains(drain)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_drains(drain: Drain | None) -> None:
    """Install the handler (again: `ray.init` installs its own, which exits at once); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm(signum, frame):
        if drain is None or drain.requested:
            raise Interrupted(f"stopped by {signal.Signals(signum).name}")
        drain.request()

    signal.signal(signal.SIGTERM, on_sigterm)
