"""A test hook: pause at a named point so a fault-injection test can kill the process right there.

    fault_point("publish.before_current")

does nothing unless the environment variable DYNRAG_PAUSE_AT names that point (a comma-separated
list). When it does, the first process to get there writes its pid to `$DYNRAG_PAUSE_DIR/<point>`
and sleeps until a signal ends it (tests/test_faults_*.py send SIGKILL or SIGTERM with os.kill), or
for at most DYNRAG_PAUSE_SECONDS (default 600) before going on. Once that file exists the point no
longer pauses, so a restarted worker or a retried task runs through. Real runs never set the variable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def fault_point(name: str) -> None:
    wanted = os.environ.get("DYNRAG_PAUSE_AT")
    if not wanted or name not in wanted.split(","):
        return
    folder = Path(os.environ.get("DYNRAG_PAUSE_DIR", "."))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    deadline = time.monotonic() + float(os.environ.get("DYNRAG_PAUSE_SECONDS", "600"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
