"""How parts are stored so that a cluster can trust them: writes retried on transient storage errors, and the
names of a batch's attempts.

A batch may be written more than once (a Ray actor drained or lost after writing, before its result reached
the driver; a zombie that finishes late): each write is an attempt of its own under `<out>/_attempts/`, never
a part, and the driver commits exactly one attempt per batch key into parts/ (commit.py).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from pipeline.errors import DynragError

log = logging.getLogger(__name__)

ATTEMPTS = "_attempts"  # under an output folder: staged write attempts (a leading _: hidden from Spark, pyarrow)
PART_WRITE_ATTEMPTS = 5  # one upload and up to 4 retries
PART_WRITE_BACKOFF_S = 0.5  # before the 2nd attempt; doubled each time (with jitter), at most 8 s
_NETWORK = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ServerDisconnectedError",
    "ClientPayloadError",
}
_PERMANENT = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}
T = TypeVar("T")


def transient(exc: BaseException) -> bool:
    """Whether a storage error may pass if tried again (a dropped connection, a throttled or failed request),
    as opposed to one that will not (no permission, a full or read-only disk, a missing bucket)."""
    if isinstance(exc, (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return False
    if type(exc).__name__ in _NETWORK:  # botocore's and aiohttp's, which s3fs lets through after its own retries
        return True
    return isinstance(exc, OSError) and exc.errno not in _PERMANENT


def with_retries(what: str, fn: Callable[[], T], attempts: int | None = None) -> T:
    """`fn()`, tried again after a transient storage error (`transient`) with exponential backoff, at most
    `attempts` times in all (default PART_WRITE_ATTEMPTS); the last error is raised."""
    attempts = attempts or PART_WRITE_ATTEMPTS
    for i in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if i == attempts or not transient(exc):
                raise
            wait = min(8.0, PART_WRITE_BACKOFF_S * 2 ** (i - 1)) * random.uniform(0.5, 1.0)
            log.warning(
                "%s failed (%s: %s), attempt %d of %d; again in %.1fs", what, type(exc).__name__, exc, i, attempts, wait
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


class PartWriteError(DynragError):
    """A part that could not be written, after the retries of a transient error: names the store and the error."""


def batch_key(ids: list[str]) -> str:
    """A batch's key: a digest of its sorted question ids (the same in every attempt of the batch)."""
    return hashlib.sha1("\n".join(sorted(ids)).encode()).hexdigest()[:16]


def attempt_key(path: str) -> str:
    """A staged attempt's batch key with its run (`<run id>-<batch key>`), without the attempt's token."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet").rsplit("-", 1)[0]
