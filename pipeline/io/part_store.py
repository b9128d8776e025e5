"""How parts are stored so that a cluster can trust them (issue 47): writes retried on transient storage
errors, one object per write attempt (`PartWriter` in output.py) with the attempts a later complete one
covers removed, and the driver's ledger of the parts a run committed.

Why one object per attempt, and not "replace the part of the same key" or "refuse to replace it": a
zombie writer (an engine actor thought dead, whose batch Ray gave to another, that finishes late) must
not overwrite a complete part with part of the batch or with error rows, and a batch drained part way
and then run again whole must end with its whole rows. With one object per attempt nothing is ever
overwritten; `read_rows` keeps one row per question id (an answer over an error row, then the last
finished), so readers see each question once whatever attempts exist; and after its write, an attempt
removes the other attempts of its batch that it strictly covers (`drop_covered_attempts`), so a drained
attempt goes once its batch is written whole (never the attempt a writer reports: the ledger reads it). Replacing by key would let the last writer win (the
zombie); refusing to replace would keep a drained batch's partial part and lose the rest of the batch;
both would need a conditional write that every store honours (S3's If-None-Match is recent, a local
rename has none).
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

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


def part_key(path: str) -> str:
    """A PartWriter part's key without its attempt (`<run id>-<digest of the batch's ids>`), shared by every
    attempt at one batch (a drained attempt's part of the batch included)."""
    name = path.rsplit("/", 1)[-1].removeprefix("part-").removesuffix(".parquet")
    return name.rsplit("-", 1)[0]


class PartLedger:
    """The driver's account of the parts its summary reads: those listed when the run started (what
    `answered_ids` read) and those the run's reports name. Never a listing at the end: an object store's
    listing (s3fs caches them) may not yet show the run's own parts, and another job's parts are not
    this run's to count.

    `parts` is None when a report of rows named no part (a runner that does not report them): the caller
    then falls back to a listing."""

    def __init__(self, start: Iterable[str]):
        self._parts = list(dict.fromkeys(start))
        self.complete = True

    def add(self, report: dict[str, Any]) -> None:
        part = report.get("part")
        if part:
            if part not in self._parts:
                self._parts.append(part)
        elif report.get("rows"):
            self.complete = False

    @property
    def parts(self) -> list[str] | None:
        return list(self._parts) if self.complete else None


def drop_covered_attempts(fs: Any, path: str, mine: dict[str, bool], read: Callable[[str], dict[str, bool]]) -> int:
    """After the part at `path` (rows {question id: answered}) is written, remove the other attempts of its
    batch (same `part_key`) that it strictly covers: each of their questions has a row here, an answer
    wherever they had one, and this one has more. Never itself, nor an attempt that covers it: the part a
    writer reports is in the driver's ledger (the run's summary reads it), so it stays; two complete
    attempts (a batch answered again after its actor exited before returning) both stay, and readers take
    each question once. So a drained attempt goes once its batch is written whole; a zombie's late partial
    part stays beside the complete one, read once. `read(path)` gives a part's rows as {question id:
    answered}. Best effort: a failure is logged, never raised. Returns how many went."""
    folder, name = path.rsplit("/", 1)
    prefix = f"part-{part_key(path)}-"

    def covers(a: dict[str, bool], b: dict[str, bool]) -> bool:
        return all(q in a and (a[q] or not ok) for q, ok in b.items())

    removed = 0
    try:
        fs.invalidate_cache(folder)
        found = fs.find(folder, prefix=prefix)  # object stores list just the prefix; others list the folder
        for other in [p for p in found if p.rsplit("/", 1)[-1].startswith(prefix) and p.rsplit("/", 1)[-1] != name]:
            try:
                theirs = read(other)
            except FileNotFoundError:
                continue  # removed meanwhile by another attempt
            if covers(mine, theirs) and not covers(theirs, mine):
                fs.rm(other)
                removed += 1
    except Exception as exc:  # never fails the write: readers are correct with every attempt present
        log.warning("could not remove the covered attempts of %s (%s: %s)", path, type(exc).__name__, exc)
    return removed
