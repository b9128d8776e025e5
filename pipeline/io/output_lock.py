"""One answer job per output folder: `output_lock(out)` holds the folder for the job, or refuses it with one line
naming the job that holds it (its pid, host, Ray job id where it is one, and since when).

A local folder: an exclusive lock on `<out>/.dynrag.lock`, an `fcntl.flock` on the file, so the kernel releases it
when its process dies however it dies (SIGKILL included): a lock file left by a dead process is stale and is taken
over at once, with a log line naming the pid and host that left it (a job that ends removes its lock file, and the
folder if it made it and wrote nothing), and the half-written part files such a process can leave
(`parts/.part-*.tmp`, never read as rows) are removed. The file records the holder so a refused job says who holds
the folder.

An object store (s3://, gs://, ...) has no lock that a dead process drops: the job holds a lease instead, the object
`<out>/_lease.json` (`_Lease`), created only if absent and renewed by a thread of the job every LEASE_S/3 seconds.
A lease not renewed for its time to live (LEASE_S, recorded in the lease) belongs to a dead job: the next job
takes it over (a log line names the dead holder). On S3 every write of the lease is conditional (`If-None-Match: *`
to create it, `If-Match` its last ETag to renew, take over or remove it), so two jobs never both hold it, and its
age is the store's own clock (the response's Date less the object's Last-Modified). On another store (no
conditional write through fsspec) the lease is written, then read back to check that it holds this job's token:
two jobs that start within one round trip of each other can both pass that check (the window is the time
between one's check that no lease is there and the other's read back); the age is the holder's clock.
A job that cannot renew its lease for its time to live may find it taken over: it stops at its next commit
(`check_held`, called by the committer) with one line, its rows so far kept.

Holding the output is what makes the committer's removal of every staged attempt at its start safe
(commit.py): no other live job writes attempts there (a dead job's leftovers are never committed).

With Ray the engine actors write the parts themselves: `check_shared(out)`, in each actor, refuses a
local folder whose lock file that actor cannot see (a node that does not share the driver's disk).

`state_lock(path)` holds a file a method keeps across runs (ERM4's reservoir) the same way, through
`<path>.lock`: one job at a time; `check_same_host(path)` refuses an actor on another node than the job
that holds it (SQLite's locking needs every process on one host).
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import glob
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from pipeline.errors import DynragError

log = logging.getLogger(__name__)

LOCK_NAME = ".dynrag.lock"
LEASE_NAME = "_lease.json"  # an object-store output's lease (a leading _: no reader of rows looks)
# An object-store lease's time to live: renewed every LEASE_S / 3, so a live job's lease is at most a third of
# this old unless three renewals in a row fail (each a small PUT, retried on its own); a dead job's output is
# free again this long after its last renewal. No setting measures "a driver's longest pause", so this is a
# constant, recorded in each lease (a job judges another's lease by the holder's own figure).
LEASE_S = 60.0


class OutputBusyError(DynragError):
    """Another job is writing to the same output folder."""


class StateBusyError(DynragError):
    """Another job is using a state file (ERM4's reservoir) this run would use."""


def _holder() -> str:
    """This job: its pid and host, since when, and its Ray job (submission) id under Ray's Jobs API."""
    held = f"pid {os.getpid()} on host {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    return held + (f", Ray job {job}" if (job := _ray_job_id()) else "")


def _ray_job_id() -> str:
    """The Ray Jobs API's submission id of this driver (the job's supervisor hands its driver the job config with
    the id in its metadata), '' outside a submitted job."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "") or "{}")
        return str((config.get("metadata") or {}).get("job_submission_id") or "")
    return ""


def _busy(out: str) -> str:
    return f"{out} is in use by another answer job ({{holder}}); wait for it to end or choose another --out"


@contextlib.contextmanager
def output_lock(out: str):
    """Hold `out` for this job (module docstring): a local folder's flock, an object store's lease. A second job
    on it is refused with OutputBusyError, one line naming the holder."""
    if "://" in out and not out.startswith("file://"):
        lease = _Lease(out, LEASE_S)
        try:
            lease.acquire()
        except OutputBusyError:
            raise
        except Exception as exc:  # a store that refuses the write (no permission, no bucket): the job's one line
            raise DynragError(f"cannot write {lease.path_uri}: {type(exc).__name__}: {exc}") from exc
        _leases[_key(out)] = lease
        try:
            yield
        finally:
            _leases.pop(_key(out), None)
            lease.release()
        return
    folder = out.removeprefix("file://")
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    busy = _busy(out)
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


_leases: dict[str, _Lease] = {}  # the object-store outputs this process holds (output_lock), by URI


def _key(out: str) -> str:
    return out.rstrip("/")


def held_throughout(out: str) -> bool:
    """Whether this process has held `out`'s lease since it took it with no gap of its time to live, so that no
    other job can have written there meanwhile (a local folder's flock: always). False for an output this
    process holds no lease of."""
    lease = _leases.get(_key(out))
    return lease is not None and lease.held_throughout()


def check_held(out: str) -> None:
    """Raise OutputBusyError if this process held `out`'s lease and has lost it (not renewed for its time to live,
    then taken over by another job): the job must stop writing there. A no-op for a local folder (a flock is not
    lost) and for an output this process does not hold."""
    lease = _leases.get(_key(out))
    if lease is not None:
        lease.check()


class _Lease:
    """The lease of an object-store output (module docstring): `acquire` or OutputBusyError, renewed by a thread
    until `release`. Its record: the holder (`_holder`), since when, its time to live, and a token of its own."""

    def __init__(self, out: str, ttl_s: float):
        from pipeline.io.output import _fs

        self.out, self.ttl_s = out, ttl_s
        self.fs, base = _fs(out)
        self.path = f"{base}/{LEASE_NAME}"
        self.path_uri = f"{out.rstrip('/')}/{LEASE_NAME}"
        self.s3 = "s3" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.token = uuid.uuid4().hex
        self.record = {"holder": _holder(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "ttl_s": ttl_s}
        self.etag = ""  # S3: the ETag of this job's last write of the lease (the condition of its next one)
        self.lost = ""  # why the lease is no longer this job's ('' while it is)
        self.renewed_at = 0.0  # time.monotonic() of its last write
        self.lapsed = False  # once not renewed for its time to live: another job may have taken it meanwhile
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the job's side -----------------------------------------------------------------------------
    def acquire(self) -> None:
        for _ in range(10):  # each turn: a lease released, or taken over by a third job, between two reads
            if self._create():
                break
            seen = self._read()
            if seen is None:  # released meanwhile: try again
                continue
            record, age, version = seen
            if record.get("token") == self.token:  # this job's own create, applied though its answer was lost
                self.etag = version
                break
            ttl = float(record.get("ttl_s") or self.ttl_s)
            holder = str(record.get("holder") or "unknown")
            if age <= ttl:
                raise OutputBusyError(
                    _busy(self.out).replace("{holder}", f"{holder}; its lease renewed {max(age, 0):.0f}s ago")
                )
            if self._replace(version):
                log.warning(
                    "taking over the expired lease of %s: %s has not renewed it for %.0fs (its time to live %.0fs)",
                    self.out,
                    holder,
                    age,
                    ttl,
                )
                break
        else:
            raise OutputBusyError(_busy(self.out).replace("{holder}", "its lease changes hands too often to take"))
        self.renewed_at = time.monotonic()
        self._thread = threading.Thread(target=self._renew_loop, name="dynrag-output-lease", daemon=True)
        self._thread.start()

    def held_throughout(self) -> bool:
        return not (self.lost or self.lapsed or time.monotonic() - self.renewed_at > self.ttl_s)

    def check(self) -> None:
        if self.lost:
            raise OutputBusyError(
                f"{self.out} is no longer this job's: {self.lost}; this job stops, its rows so far stay "
                "(a rerun answers the rest)"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)  # a renewal in flight: one small PUT, retried
            if self._thread.is_alive():
                log.warning("the renewal of %s's lease did not end within %.0fs; it is left", self.out, self.ttl_s)
        if self.lost:
            return  # another job's now
        try:
            if self.s3:
                self._s3("delete_object", IfMatch=self.etag)
            elif self._read_token() == self.token:
                self.fs.rm(self.path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # left: it expires after its time to live
            log.warning("could not remove the lease of %s (%s: %s); it expires", self.out, type(exc).__name__, exc)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self._renew():
                    return
                now = time.monotonic()
                self.lapsed = self.lapsed or now - self.renewed_at > self.ttl_s
                self.renewed_at = now
            except Exception as exc:  # tried again at the next turn; a lease not renewed for its ttl may go
                log.warning("could not renew the lease of %s (%s: %s)", self.out, type(exc).__name__, exc)

    def _renew(self) -> bool:
        """Write the lease again (S3: only if it is still this job's last write); False once it is lost."""
        if self.s3:
            try:
                self._put(IfMatch=self.etag)
                return True
            except FileNotFoundError:
                self.lost = "its lease was removed"
            except OSError:
                seen = self._read()
                if seen is not None and seen[0].get("token") == self.token:
                    self.etag = seen[2]  # still this job's (a write applied though its answer was lost)
                    raise  # a transient error: renewed at the next turn
                self.lost = f"its lease was taken over by {seen[0].get('holder') if seen else 'another job'}"
        else:
            record = self._read_record()
            if record is not None and record.get("token") == self.token:
                self._put()
                return True
            self.lost = f"its lease was taken over by {record.get('holder') if record else 'another job'}"
        log.error("%s: %s", self.out, self.lost)
        return False

    # -- the store ----------------------------------------------------------------------------------
    def _body(self) -> bytes:
        return json.dumps({**self.record, "token": self.token, "renewed_at": time.time()}).encode()

    def _put(self, **condition: str) -> None:
        if self.s3:
            self.etag = self._s3("put_object", Body=self._body(), **condition)["ETag"]
        else:
            self.fs.pipe_file(self.path, self._body())

    def _create(self) -> bool:
        """Create the lease if there is none; whether this job now holds it."""
        if self.s3:
            try:
                self._put(IfNoneMatch="*")
                return True
            except FileExistsError:  # s3fs's error for a failed If-None-Match
                return False
        if self.fs.exists(self.path):
            return False
        self._put()
        return self._read_token() == self.token  # another job's write after this one's wins: it holds it

    def _replace(self, version: str) -> bool:
        """Write this job's lease over an expired one (S3: only if it is still the version judged expired)."""
        if self.s3:
            try:
                self._put(IfMatch=version)
                return True
            except (FileNotFoundError, OSError):  # renewed, released or taken over meanwhile: judged again
                return False
        self._put()
        return self._read_token() == self.token

    def _read(self) -> tuple[dict[str, Any], float, str] | None:
        """The lease now (None if there is none): its record, its age in seconds and its version (S3: ETag)."""
        if not self.s3:
            record = self._read_record()
            return None if record is None else (record, time.time() - float(record.get("renewed_at", 0)), "")
        try:
            head = self._s3("head_object")
            body = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        now = email.utils.parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
        return _parse(body), (now - head["LastModified"]).total_seconds(), head["ETag"]

    def _read_record(self) -> dict[str, Any] | None:
        try:
            return _parse(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    def _read_token(self) -> str:
        record = self._read_record()
        return str(record.get("token")) if record else ""

    def _s3(self, method: str, **kwargs: Any) -> dict[str, Any]:
        bucket, key, _ = self.fs.split_path(self.path)
        self.fs.invalidate_cache(self.path)
        return self.fs.call_s3(method, Bucket=bucket, Key=key, **kwargs)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        record = json.loads(body)
    except ValueError:
        return {"holder": "a lease that is not JSON"}
    return record if isinstance(record, dict) else {"holder": "a lease that is not a JSON object"}
