"""`--json`: exactly one JSON document on stdout; every other byte goes to stderr (or a run's log file).

For a `--json` command, `json_stdout()` keeps a private copy of file descriptor 1 for the document, then
points fd 1 and `sys.stdout` at stderr. Whatever else writes to stdout then lands on stderr: log handlers
bound to the old `sys.stdout` object (it writes to fd 1), the JVM and C libraries, and child processes
(vLLM's EngineCore, Ray's raylet and workers), which inherit fd 1. `emit()` writes the document to the copy.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_doc: TextIO | None = None  # where the document goes while a --json command runs
_emitted = False


@contextlib.contextmanager
def json_stdout(restore: bool = True) -> Iterator[None]:
    """Reserve stdout for the one document `emit` writes. `restore=False` (the CLI process) leaves fd 1 on
    stderr after the block, so output at interpreter exit (Ray's and vLLM's shutdown) stays off stdout."""
    global _doc, _emitted
    real = sys.stdout
    real.flush()
    try:
        own = real.fileno() == 1
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        own = False  # a Python-level capture (pytest's capsys): the document goes to it
    doc = os.fdopen(os.dup(1), "w", encoding="utf-8") if own else real
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _doc, _emitted = doc, False
    try:
        yield
    finally:
        _doc = None
        if doc is not real:
            doc.close()
        sys.stderr.flush()
        if restore:
            os.dup2(saved, 1)
            sys.stdout = real
        os.close(saved)


def emit(document: Any, **dumps: Any) -> None:
    """Write the command's JSON document (json.dumps keywords in `dumps`; default=str) and a newline."""
    global _emitted
    if _doc is not None and _emitted:
        raise RuntimeError("a --json command writes one JSON document")
    out = _doc if _doc is not None else sys.stdout
    out.write(json.dumps(document, default=str, **dumps) + "\n")
    out.flush()
    _emitted = True
