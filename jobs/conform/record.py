"""What either side of `dynrag conform` records of one question, written once for both: the reference's drivers
(dragin_driver.py, erm4_driver.py: scripts in the reference's venv, which import this module and nothing else of
dynrag) and dynrag's side (harness.run_dynrag). Standard library only."""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


def prompt_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def question_row(qid: str, question: str, events: list[dict]) -> Iterator[dict[str, Any]]:
    """`with question_row(...) as row:` the block answers the question into `row` ({id, question}); then the row
    gets `error` and `traceback` where the block raised (one question's failure is its row's, never the run's
    end), its `seconds`, and the `events` recorded meanwhile (the list is emptied first)."""
    events.clear()
    row: dict[str, Any] = {"id": qid, "question": question}
    t0 = time.perf_counter()
    try:
        yield row
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc()[-2000:]
    row["seconds"] = time.perf_counter() - t0
    row["events"] = list(events)


def write_row(out: IO[str], row: dict) -> None:
    """One JSON line, flushed: the harness counts a driver's lines as it runs."""
    out.write(json.dumps(row) + "\n")
    out.flush()
