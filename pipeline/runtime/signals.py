"""SIGTERM stops a job the way Ctrl-C does: `stop_on_sigterm()` turns it into `Interrupted` (a
KeyboardInterrupt), so `finally` blocks run, rows already written stay, backends close, and the CLI
exits 130 with a one-line message. Only the main thread can install the handler; elsewhere this is
a no-op."""

from __future__ import annotations

import contextlib
import signal
import threading


class Interrupted(KeyboardInterrupt):
    """The job was asked to stop (SIGTERM)."""


def _raise(signum, frame):
    raise Interrupted(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
