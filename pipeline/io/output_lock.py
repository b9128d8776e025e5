"""One answer job per output folder: `output_lock(out)` holds an exclusive lock on `<out>/.dynrag.lock`.

The lock is an `fcntl.flock` on the file, so the kernel releases it when its process dies however it
dies (SIGKILL included): a lock file left by a dead process is stale and is taken over, with a log
line naming the pid and host that left it (a job that ends removes its lock file, and the folder if
it made it and wrote nothing), and the half-written part files such a process can leave
(`parts/.part-*.tmp`, never read as rows) are removed. The file records the holder (pid, host, start time) so a
refused job says who holds the folder. Remote outputs (s3://, gs://) cannot be locked this way: two
jobs there both run, their part files never overwrite each other (each has a fresh name), and rows
are read one per question id (output.read_rows), so each question counts once.

With Ray the engine actors write the parts themselves: `check_shared(out)`, in each actor, refuses a
local folder whose lock file that actor cannot see (a node that does not share the driver's disk).

`state_lock(path)` holds a file a method keeps across runs (ERM4's reservoir) the same way, through
`<path>.lock`: one job at a time; `check_same_host(path)` refuses an actor on another node than the job
that holds it (SQLite's locking needs every process on one host).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import socket
import time

from pipeline.errors import DynragError

log = logging.getLogger(__name__)

LOCK_NAME = ".dynrag.lock"


class OutputBusyError(DynragError):
    """Another job is writing to the same output folder."""


class StateBusyError(DynragError):
    """Another job is using a state file (ERM4's reservoir) this run would use."""


def _holder() -> str:
    return f"pid {os.getpid()} on host {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"


@contextlib.contextmanager
def output_lock(out: str):
    if "://" in out and not out.startswith("file://"):
        log.warning(
            "%s is remote: it cannot be locked; a second job on it would answer the same questions again "
            "(each is read once)",
            out,
        )
        yield
        return
    folder = out.removeprefix("file://")
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    busy = f"{out} is in use by another answer job ({{holder}}); wait for it to end or choose another --out"
    try:
        with _held(os.path.join(folder, LOCK_NAME), OutputBusyError, busy) as stale:
            if stale:
                log.info("taking over the stale lock of %s: %s is no longer running", out, stale)
            for partial in glob.glob(os.path.join(folder, "parts", ".part-*.tmp")):
                os.unlink(partial)
            yield
    finally:
        if made and not os.listdir(folder):  # a job that wrote nothing leaves nothing
            os.rmdir(folder)


@contextlib.contextmanager
def state_lock(path: str):
    """Hold `path` (a local file a run reads and writes, e.g. ERM4's reservoir) for one job: `<path>.lock`,
    as output_lock does for a folder. A second job on the same file is refused with StateBusyError."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    busy = (
        f"{path} is in use by another job ({{holder}}); a state file serves one job at a time: "
        "wait for it to end, or give this run its own"
    )
    with _held(path + ".lock", StateBusyError, busy) as stale:
        if stale:
            log.info("taking over the stale lock of %s: %s is no longer running", path, stale)
        yield


def check_same_host(path: str) -> None:
    """Raise unless the job holding `path` (state_lock) runs on this host: a Ray actor on another node
    cannot share a local SQLite file (on a network filesystem its locking is not reliable)."""
    lock = os.path.abspath(path) + ".lock"
    holder = ""
    with contextlib.suppress(OSError):
        with open(lock, encoding="utf-8", errors="replace") as f:
            holder = f.read().strip()
    if f" on host {socket.gethostname()}," not in holder:
        raise DynragError(
            f"{path} is held by the job on another host ({holder or 'no lock visible here'}), not "
            f"{socket.gethostname()}: this local file cannot be shared by engine actors on several nodes; "
            "run the job on one node (ERM4: or method.params.reservoir=false)"
        )


@contextlib.contextmanager
def _held(path: str, error: type[DynragError], busy: str):
    """Hold the flock of the lock file `path` for the block, recording this process as its holder; yields
    the record a dead holder left ('' if none). A live holder: `error(busy)`, its '{holder}' replaced."""
    fd = _acquire(path, error, busy)
    try:
        stale = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder().encode(), 0)
        yield stale
    finally:
        os.unlink(path)  # still held: a job that opened this file meanwhile sees it gone and retries
        os.close(fd)


def _acquire(path: str, error: type[DynragError], busy: str) -> int:
    """An fd holding the flock of the file now at `path` (not of one a finishing job just removed)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise error(busy.replace("{holder}", holder)) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)


def check_shared(out: str) -> None:
    """Raise unless this process sees the answer job's local output folder (its lock file), as a Ray actor on
    another node does only when the folder is on storage shared with the driver's node. URIs pass."""
    if "://" in out and not out.startswith("file://"):
        return
    if not os.path.exists(os.path.join(out.removeprefix("file://"), LOCK_NAME)):
        raise DynragError(
            f"the output folder {out} of the answer job is not visible on {socket.gethostname()}: "
            "on a Ray cluster of several nodes --out must be shared by every node (s3://, gs://, "
            "or a filesystem mounted at the same path on each)"
        )
