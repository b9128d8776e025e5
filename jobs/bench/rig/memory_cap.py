"""A command run in a Linux memory cgroup capped at a number of bytes (`dynrag bench scale --memory-cap`).

Resident memory (RSS) counts the pages of mapped files, such as an index holder's Lucene segments, which are
page cache: the kernel reclaims them under pressure and reads them again when touched. What a process needs
is shown by running it under a cap that charges all of it (its anonymous memory and the page cache it reads)
and seeing it finish, and how fast. The page cache is dropped first (`/proc/sys/vm/drop_caches`), so that
the files the command reads are charged to its cgroup rather than to whoever read them before.

Needs root and a cgroup memory controller (v1's `memory` hierarchy, or v2 with `memory` delegated to the
process's own cgroup); otherwise `MemoryCapUnavailable` says which part is missing.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import DynragError

CGROUP_ROOT = Path("/sys/fs/cgroup")


class MemoryCapUnavailable(DynragError):
    pass


@dataclass
class CappedRun:
    returncode: int
    stdout: str
    wall_s: float
    peak_bytes: int | None  # the cgroup's highest charge, where the kernel reports it
    oom_killed: bool


def _own_group() -> tuple[Path, str]:
    """This process's memory cgroup directory and its file names' flavour ('v1' or 'v2')."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/"), "v1"
    for line in lines:
        if line.startswith("0::") and (CGROUP_ROOT / "cgroup.controllers").exists():
            group = CGROUP_ROOT / line[3:].lstrip("/")
            if "memory" in (group / "cgroup.subtree_control").read_text().split():
                return group, "v2"
    raise MemoryCapUnavailable("no cgroup memory controller to cap the search with (Linux cgroups, v1 or v2)")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise MemoryCapUnavailable(f"cannot write {path} ({e.strerror}): --memory-cap needs root") from e


def drop_page_cache() -> None:
    os.sync()
    _write(Path("/proc/sys/vm/drop_caches"), "1")


def run_capped(cmd: list[str], limit_bytes: int) -> CappedRun:
    """Run `cmd` (stdout captured) in a new cgroup under this process's, capped at `limit_bytes`, without swap."""
    parent, flavour = _own_group()
    group = parent / f"dynrag-cap-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:
        raise MemoryCapUnavailable(f"cannot create the cgroup {group} ({e.strerror}): --memory-cap needs root") from e
    try:
        if flavour == "v1":
            _write(group / "memory.limit_in_bytes", str(limit_bytes))
        else:
            _write(group / "memory.max", str(limit_bytes))
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", "0")
        drop_page_cache()
        procs = group / "cgroup.procs"
        t = time.perf_counter()
        p = subprocess.run(
            cmd, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: procs.write_text(str(os.getpid()))
        )
        wall = time.perf_counter() - t
        peak_file = group / ("memory.max_usage_in_bytes" if flavour == "v1" else "memory.peak")
        peak = int(peak_file.read_text()) if peak_file.exists() else None
        events = (group / ("memory.oom_control" if flavour == "v1" else "memory.events")).read_text().split()
        kills = int(events[events.index("oom_kill") + 1]) if "oom_kill" in events else int(p.returncode == -9)
        return CappedRun(p.returncode, p.stdout, wall, peak, oom_killed=kills > 0)
    finally:
        for _ in range(50):  # the child's exit uncharges it a moment later; an empty group can then go
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
