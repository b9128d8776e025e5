"""Peak resident memory of a process tree (the process and all its descendants, e.g. vLLM's engine
core), sampled with psutil from a thread, for the benchmarks' memory figures.

RSS of the tree is the sum of each process's RSS at one sampling instant (pages shared between
processes count once per process, so it errs high); the peak is the largest such sum seen. A short
spike between two samples (default every 0.5 s; sampling scans /proc, so it is kept rare) can be missed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

GIB = 1024**3


def tree_rss(pid: int) -> int:
    """RSS in bytes of `pid` plus all its descendants now (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class TreeRss:
    """`with TreeRss(pid) as m:` samples the tree until exit; `m.peak` is bytes. `m.phase = name` makes
    later samples count towards `m.peaks[name]` too (phases of one process, e.g. two sides of a ratio)."""

    def __init__(self, pid: int | None = None, interval: float = 0.5):
        self.pid = pid or os.getpid()
        self.interval = interval
        self.peak = 0
        self.peaks: dict[str, int] = {}
        self.phase: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-rss", daemon=True)

    def sample(self) -> int:
        rss = tree_rss(self.pid)
        self.peak = max(self.peak, rss)
        if self.phase is not None:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)
        return rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> TreeRss:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def __enter__(self) -> TreeRss:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss: int


def _reap_session(sid: int, timeout: float = 10.0) -> None:
    """Kill what is left of a session we started (e.g. an orphaned vLLM engine core), by pid, and wait
    until each is gone or a zombie (SIGKILL is delivered asynchronously)."""
    killed = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) == sid:
                p.kill()
                killed.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    for p in killed:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)


def run_measured(
    cmd: list[str],
    *,
    env: dict | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    interval: float = 0.5,
    capture_stderr: bool = True,
) -> Measured:
    """Run `cmd` in its own session, sampling its tree's RSS; afterwards nothing of that session is left.
    Without `capture_stderr` its stderr is ours (its progress bars and logs show as it runs)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if capture_stderr else None,
        text=True,
        start_new_session=True,
    )
    try:
        with TreeRss(proc.pid, interval) as m:
            out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        _reap_session(proc.pid)
    return Measured(proc.returncode, out, err or "", time.perf_counter() - t0, m.peak)
