"""Quiet terminal: dynrag's own log records, progress bars, prints and errors stay on the terminal;
third-party log records, Python warnings and whatever other code writes to file descriptors 1 and 2
(vLLM's engine process, which inherits them; the JVM of pyserini; C libraries) go to a log file.

Used as `with divert_logs(out / "dynrag.log", args.log_level): ...`. At DEBUG nothing is diverted.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

OWN = ("dynrag", "jobs", "pipeline", "indexing", "platform_shims", "__main__")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _own(record: logging.LogRecord) -> bool:
    return record.name.split(".", 1)[0] in OWN


class _Terminal:
    """A terminal stream that sends what a log handler writes for a third-party record to the log file
    instead: libraries that bind their own handler to sys.stdout/sys.stderr (vLLM, transformers) while
    the block runs would otherwise print on the terminal."""

    def __init__(self, stream, logfile):
        self._stream, self._logfile = stream, logfile

    def write(self, text: str) -> int:
        caller = sys._getframe(1)
        record = caller.f_locals.get("record") if caller.f_code.co_name == "emit" else None
        if isinstance(record, logging.LogRecord) and not _own(record):
            return self._logfile.write(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@contextlib.contextmanager
def divert_to_output(out: str, level: str = "INFO") -> Iterator[None]:
    """Divert third-party output to OUT/dynrag.log for a job whose output folder `out` may not exist yet (a
    refused job must leave nothing): the block logs to a temporary file, appended to OUT/dynrag.log at the
    end if OUT exists then, else dropped; the path is printed when the block succeeds (a failed job's terminal
    shows its one error line). A remote OUT (s3://...) is not diverted."""
    from indexing.versions.remote import is_remote

    if level == "DEBUG" or is_remote(out):
        yield
        return
    import tempfile

    fd, staged_name = tempfile.mkstemp(prefix="dynrag-", suffix=".log")
    os.close(fd)
    staged, target, ok = Path(staged_name), Path(out) / "dynrag.log", False
    try:
        with divert_logs(staged, level, announce=False):
            yield
        ok = True
    finally:
        if target.parent.is_dir():
            with open(target, "ab") as f, open(staged, "rb") as src:
                shutil.copyfileobj(src, f)
            if ok:
                print(f"library logs and warnings: {target}", file=sys.stderr)
        staged.unlink(missing_ok=True)


@contextlib.contextmanager
def divert_logs(
    path: str | os.PathLike, level: str = "INFO", chatty: tuple[str, ...] = (), announce: bool = True
) -> Iterator[Path | None]:
    """Divert third-party output to `path` (appended) while the block runs; yields the path (None at DEBUG).
    Own loggers under `chatty` (e.g. "indexing") show only warnings on the terminal; the file has all.
    `announce`: print the file's path on entering."""
    if level == "DEBUG":
        yield None
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    saved_handlers, saved_level, saved_streams = root.handlers[:], root.level, (sys.stdout, sys.stderr)
    saved_fds: dict[int, int] = {}
    with open(path, "a", encoding="utf-8", buffering=1) as logfile:
        try:
            for fd, name in ((1, "stdout"), (2, "stderr")):
                stream = getattr(sys, name)
                stream.flush()
                saved_fds[fd] = os.dup(fd)
                if _fileno(stream) == fd:  # the terminal stream itself: keep writing to where fd pointed
                    stream = os.fdopen(
                        os.dup(fd), "w", buffering=1, encoding=stream.encoding, errors="backslashreplace"
                    )
                setattr(sys, name, _Terminal(stream, logfile))
                os.dup2(logfile.fileno(), fd)
            terminal = logging.StreamHandler(sys.stderr)
            terminal.addFilter(lambda r: _own(r) and (r.levelno >= logging.WARNING or not r.name.startswith(chatty)))
            terminal.setLevel(getattr(logging, level))
            to_file = logging.StreamHandler(logfile)
            for h in (terminal, to_file):
                h.setFormatter(logging.Formatter(FORMAT, "%H:%M:%S"))
            root.handlers = [terminal, to_file]
            root.setLevel(min(getattr(logging, level), logging.INFO))
            logging.captureWarnings(True)
            if announce:
                print(f"library logs and warnings: {path}", file=sys.stderr)
            yield path
        finally:
            logging.captureWarnings(False)
            root.handlers, root.level = saved_handlers, saved_level
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, copy in saved_fds.items():
                os.dup2(copy, fd)
                os.close(copy)
            for stream, old in zip((sys.stdout, sys.stderr), saved_streams):
                if isinstance(stream, _Terminal):  # handlers made meanwhile may keep it: it writes to `old` now
                    if stream._stream is not old:
                        stream._stream.close()
                    stream._stream = stream._logfile = old
            sys.stdout, sys.stderr = saved_streams
