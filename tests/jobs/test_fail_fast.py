"""Fail fast: a missing dataset is refused by the real CLI process before any backend, index or model is
started (each is made to fail if it is), with one `dynrag: error:` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fault_tools import one_error_line

ROOT = Path(__file__).resolve().parents[2]
# the CLI, with every expensive start made fatal: reaching one of them is a failure of this test
GUARDED_CLI = """
import sys
import pipeline.backends as b
import pipeline.assets.models as m

def started(what):
    def fail(*args, **kwargs):
        print(f"STARTED {what}", file=sys.stderr)
        sys.exit(99)
    return fail

b.Backends.__init__ = started("backends")
b.make_generator = started("generator")
m.resolve_model = started("model")
from jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_missing_dataset_fails_at_once_without_starting_anything(tmp_path):
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            GUARDED_CLI,
            "answer",
            "--dataset",
            "/nonexistent.jsonl",
            "--method",
            "sr-rag",
            "--index",
            str(tmp_path / "index"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    seconds = time.perf_counter() - t0
    print(f"`dynrag answer --dataset /nonexistent.jsonl`: exit {done.returncode} after {seconds:.2f} s")
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr) == "dynrag: error: dataset file not found: /nonexistent.jsonl"
    assert not (tmp_path / "out").exists()
    assert seconds < 30  # a generous sanity bound only: the guards above are the real check
