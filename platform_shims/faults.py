"""A test hook: pause at a named point so a fault-injection test can kill the process right there.

    fault_point("publish.before_current")

does nothing unless the environment variable DYNRAG_PAUSE_AT names that point (a comma-separated
list). When it does, the first process to get there writes its pid to `$DYNRAG_PAUSE_DIR/<point>`
and sleeps until a signal ends it (the tests in tests/faults/ send SIGKILL or SIGTERM with os.kill), until the
test creates `<point>.resume` beside that file, or for at most DYNRAG_PAUSE_SECONDS (default 600) before
going on. Once that file exists the point no longer pauses, so a restarted worker or a retried task runs
through. Real runs never set the variable.

`name@N` pauses at the N-th time a process gets to the point (e.g. `engine.question_done@10`: after ten
questions finished). A caller may pass `until`: the pause also ends when it returns true (a drain
requested by the signal the test sent, which does not end the process).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

_hits: dict[str, int] = {}  # times this process got to each point named with @N


def fault_point(name: str, until: Callable[[], bool] | None = None) -> None:
    wanted = os.environ.get("DYNRAG_PAUSE_AT")
    if not wanted:
        return
    spec = next((p for p in wanted.split(",") if p.split("@")[0] == name), None)  # "name" or "name@N"
    if spec is None:
        return
    if "@" in spec:  # the N-th time only (a plain name pauses at any time, until its marker exists)
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != int(spec.split("@")[1]):
            return
    folder = Path(os.environ.get("DYNRAG_PAUSE_DIR", "."))
    folder.mkdir(parents=True, exist_ok=True)
    try:  # the marker is named as the test named the point
        fd = os.open(folder / spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    deadline = time.monotonic() + float(os.environ.get("DYNRAG_PAUSE_SECONDS", "600"))
    resume = folder / f"{spec}.resume"
    while time.monotonic() < deadline and not (until and until()) and not resume.exists():
        time.sleep(0.05)
