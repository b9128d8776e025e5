"""`OrphanGuard`: child processes (vLLM's engine core) that die with this one, even by SIGKILL.

vLLM runs its engine in a spawned process that never checks on its parent: a driver killed with
SIGKILL (OOM killer, `kill -9`, a preempted node) leaves the engine holding its memory (GPU memory on
a cluster), and the rerun then fails for lack of it. The guard is a small watchdog process reading
a pipe from this one; the kernel closes the pipe however this process ends, and the watchdog then
kills the processes it was given. `close()` (a normal shutdown) stops the watchdog first.
"""

from __future__ import annotations

import subprocess
import sys

_WATCHDOG = """
import os, signal, sys
pids = [int(p) for p in sys.argv[1:]]
sys.stdin.buffer.read()  # returns at EOF: the parent has ended, or closed the guard
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


def child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


class OrphanGuard:
    def __init__(self, pids: set[int] | list[int]):
        self.pids = sorted(pids)
        self._proc = None
        if self.pids:
            # its own session: a Ctrl-C to the job's process group does not end the watchdog early
            self._proc = subprocess.Popen([sys.executable, "-c", _WATCHDOG, *map(str, self.pids)],
                                          stdin=subprocess.PIPE, start_new_session=True)

    def close(self) -> None:
        """A normal shutdown: the children are ended by their owner, not by the watchdog."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc = None
