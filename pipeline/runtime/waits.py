"""No wait without a limit (issue 78): the blocking calls of the answer path wait at most a limit derived from the
settings (`ray.stall_s`, `ray.replica_wait_s`), and running past it ends the job with one line that names what was
awaited, where, and for how long (`WaitExpired`). tests/test_bounded_waits.py lists every blocking call of
pipeline/ and indexing/ without a limit, and fails on one that is neither bounded nor allowed with a reason.

    report = bounded_get(control.begin.remote(key), "RunControl.begin (the driver's run control)", cfg.ray.stall_s,
                         "ray.stall_s")
    outcomes = until_stalled(future, progress, cfg.ray.stall_s, "the answers of a batch of 25 questions")
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from pipeline.errors import DynragError

LOOK_S = 1.0  # how often a wait bounded by progress (`until_stalled`) looks at the progress count


class WaitExpired(DynragError):
    """A blocking call ran past its limit: the job's end, with one line naming what was awaited, where, and how
    long."""


def here() -> str:
    """Where this process is: its pid, host and (in a Ray worker or driver) Ray node."""
    where = f"pid {os.getpid()} on {socket.gethostname()}"
    try:
        import ray

        if ray.is_initialized():
            where += f", Ray node {ray.get_runtime_context().get_node_id()[:8]}"
    except Exception:  # noqa: BLE001 - only a detail of the line
        pass
    return where


def expired(what: str, waited_s: float, limit: str, how: str = "with no answer") -> str:
    """The job's line for a wait past its limit: where, what was awaited, how long, and the setting that limits it."""
    return f"{here()}: waited {round(waited_s, 1):g} s for {what} {how} ({limit}); stopping"


def bounded_get(refs: Any, what: str, timeout_s: float, limit: str) -> Any:
    """`ray.get(refs)`, at most `timeout_s`; past it, WaitExpired naming `what` and the setting `limit` (its name
    and value, e.g. "ray.stall_s=900")."""
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise WaitExpired(expired(what, timeout_s, limit)) from None


def until_stalled(
    future: concurrent.futures.Future, progress: Callable[[], int], stall_s: float, what: str, limit: str
) -> Any:
    """`future.result()`, for as long as `progress()` (a count that grows with the work the future waits for) keeps
    growing: once it has not for `stall_s`, WaitExpired naming `what` and `limit`. A long wait that makes progress
    (a large batch) never expires; a hung engine does, after `stall_s`."""
    last, since = progress(), time.monotonic()
    while True:
        try:
            return future.result(timeout=LOOK_S)
        except concurrent.futures.TimeoutError:
            now, seen = time.monotonic(), progress()
            if seen != last:
                last, since = seen, now
            elif now - since > stall_s:
                raise WaitExpired(expired(what, now - since, limit, "with no progress")) from None
