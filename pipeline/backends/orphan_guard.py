"""`OrphanGuard`: the processes started while it is armed die with this one, even by SIGKILL.

vLLM runs its engine in spawned processes that never check on their parent: a driver killed with
SIGKILL (OOM killer, `kill -9`, a preempted node) would leave them holding their memory (GPU memory
on a cluster), and the rerun then fails for lack of it. Arming the guard starts a watchdog that
records this process's descendants (polling) and reads a pipe from this one; the kernel closes the
pipe however this process ends, and the watchdog then kills those descendants and every process that
carries the guard's token in its environment (`DYNRAG_GUARD`, inherited by every process started
after arming: it covers one started just before the kill). Armed before the engine starts, it
covers a kill during start-up too. `close()` (a normal shutdown) stops the watchdog first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

ENV = "DYNRAG_GUARD"

_WATCHDOG = (
    """
import os, sys, threading, time, psutil
parent, token = int(sys.argv[1]), sys.argv[2]
seen = {}  # pid: start time, of every process seen under the parent

def watch():
    while True:
        try:
            children = psutil.Process(parent).children(recursive=True)
        except psutil.Error:
            return
        for p in children:
            try:
                seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
        time.sleep(0.2)

def ours(p):  # seen under the parent, or just started with the token (a process may later rename
    try:      # itself over its environment, as vLLM's do)
        return seen.get(p.pid) == p.create_time() or p.environ().get("%s") == token
    except psutil.Error:
        return False

threading.Thread(target=watch, daemon=True).start()
sys.stdin.buffer.read()  # returns at EOF: the parent has ended, or closed the guard
for _ in range(5):  # again, for any process a dying one started meanwhile
    marked = [p for p in psutil.process_iter() if p.pid != os.getpid() and ours(p)]
    for p in marked:
        try:
            for c in [p, *p.children(recursive=True)]:
                seen.setdefault(c.pid, c.create_time())
                c.kill()
        except psutil.Error:
            pass
    if not marked:
        break
    psutil.wait_procs(marked, timeout=5)
"""
    % ENV
)


class OrphanGuard:
    def __init__(self):
        self._previous = os.environ.get(ENV)
        token = uuid.uuid4().hex
        # its own session: a Ctrl-C to the job's process group does not end the watchdog early
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), token], stdin=subprocess.PIPE, start_new_session=True
        )
        os.environ[ENV] = token

    def close(self) -> None:
        """A normal shutdown: the children are ended by their owner, not by the watchdog."""
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait()
        self._proc.stdin.close()
        self._proc = None
        if self._previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._previous
