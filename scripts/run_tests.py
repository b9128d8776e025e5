#!/usr/bin/env python3
"""Run the tests as pytest processes, several at once (`--jobs`, default the machine's cores), longest first.

The processes: the files that share one interpreter, split into `--jobs` processes of about equal seconds (the
files that use the session's tiny vLLM engine in one of them: the engine, the models and the JVM start once per
process, tests/conftest.py), each file marked `own_process` (Ray in-process, or memory measured against the
process's own start), unless all its tests are deselected, and one process of the files that mostly wait
(sleeps and timeouts: `mostly_waits`), run beside the `--jobs` others on the CPU they leave idle. "Longest" and
"mostly wait" are read from the per-file table in docs/operations.md ("Test seconds per file").

A process's output is printed when it ends (its tail, with its slowest tests), so that processes running at once
do not interleave. An own-process file that ends without pytest's summary (a native exit: Ray's core worker
ends its driver with exit 1 when it loses its raylet or GCS) shows its last lines and Ray's newest driver log,
and fails the run as crashed (not run again: a crash is a bug to fix). The run ends with the failing test ids,
the table of seconds per file (`DYNRAG_TEST_TIMES`, tests/conftest.py), each process's wall seconds and the summed line
"N passed, N failed, N skipped". Arguments after `--` go to every pytest."""

from __future__ import annotations

import argparse
import glob
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "operations.md"
UNKNOWN_TEST_S = 3.0  # a test of a file the table does not list yet
WAITING_SHARE = 0.35  # CPU-seconds per second under which a file mostly waits (mostly_waits)
SESSION_ENGINE = ("tiny_vllm", "tiny_cfg")  # tests/conftest.py's fixtures that start a vLLM engine per process
SUMMARY = re.compile(r"^=* ?\d+ (passed|failed|skipped|deselected|error)")


@dataclass
class Unit:
    """One pytest process over `files`."""

    files: list[str]
    own: bool  # an own-process file: named test by test (-v)
    estimate_s: float
    waits: bool = False  # files that mostly wait (mostly_waits): their own lane, beside the `--jobs` lanes
    wall_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    crashed: bool = False

    @property
    def name(self) -> str:
        return self.files[0] if len(self.files) == 1 else f"{len(self.files)} files ({Path(self.files[0]).name}, ...)"


def seconds_per_file() -> dict[str, tuple[float, int, float]]:
    """docs/operations.md's table rows `| tests/.../test_x.py | seconds | tests | cpu-seconds |`: each file's
    (seconds, tests, CPU-seconds)."""
    row = re.compile(r"^\|\s*`?(tests/(?:\w+/)*test_\w+\.py)`?\s*\|\s*([\d.]+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)")
    found = (row.match(line) for line in TABLE.read_text(encoding="utf-8").splitlines()) if TABLE.is_file() else ()
    return {m[1]: (float(m[2]), int(m[3]), float(m[4])) for m in found if m}


def mostly_waits(row: tuple[float, int, float] | None) -> bool:
    """Whether a file's table row says it mostly waits (sleeps, timeouts, other processes' signals): its CPU-seconds
    under WAITING_SHARE of its seconds. Such files run in a lane of their own beside the `--jobs` lanes, on CPU
    the others leave idle. Only files that share a process are judged so: an own-process file's CPU-seconds miss
    its Ray workers' (they are not its children)."""
    return row is not None and row[0] >= 1.0 and row[2] < WAITING_SHARE * row[0]


def selected_tests(py: str, files: list[str], extra: list[str]) -> dict[str, int]:
    """How many tests of each file the marker expression selects (one collection process for them all). Where
    collection fails, every file without a test found is kept (its own process then reports the error), so that
    a file that cannot be imported is never skipped in silence."""
    done = subprocess.run(
        [py, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    found: dict[str, int] = {}
    for line in done.stdout.splitlines():
        if "::" in line:
            name = line.split("::", 1)[0]
            found[name] = found.get(name, 0) + 1
    if done.returncode not in (0, 5):  # 5: no test selected at all
        found.update({f: 1 for f in files if f not in found})
    return found


def plan(files: list[str], py: str, extra: list[str], jobs: int) -> list[Unit]:
    """The processes to run, longest first: each own-process file alone, the other files in `jobs` processes of
    about equal seconds (the files that use the session's vLLM engine in one of them: an engine start each)."""
    table, selected = seconds_per_file(), selected_tests(py, files, extra)

    def estimate(f: str) -> float:
        seconds, tests, _ = table.get(f, (UNKNOWN_TEST_S * selected[f], selected[f], 0.0))
        return seconds * selected[f] / max(tests, 1)

    chosen = [f for f in files if f in selected]
    own = [f for f in chosen if "pytest.mark.own_process" in source_of(f)]
    engine = [f for f in chosen if f not in own and any(name in source_of(f) for name in SESSION_ENGINE)]
    waiting = [f for f in chosen if f not in own and f not in engine and mostly_waits(table.get(f))]
    shared = [f for f in chosen if f not in own and f not in waiting]
    items = ([engine] if engine else []) + [[f] for f in shared if f not in engine]
    lanes = max(1, min(jobs, len(items)))
    chunks: list[list[str]] = [[] for _ in range(lanes)]
    # each lane's load: its chunk and, placed first, the own-process files (longest first, each to the least loaded
    # lane), so that the chunks leave room for them and the lanes end together
    loads = [0.0] * lanes
    for f in sorted(own, key=estimate, reverse=True):
        loads[loads.index(min(loads))] += estimate(f)
    for item in sorted(items, key=lambda fs: -sum(map(estimate, fs))):  # longest first, to the least loaded lane
        lane = loads.index(min(loads))
        chunks[lane].extend(item)
        loads[lane] += sum(map(estimate, item))
    units = [Unit(sorted(c), False, sum(map(estimate, c))) for c in chunks if c]
    units += [Unit([f], True, estimate(f)) for f in own]
    if waiting:
        units.append(Unit(sorted(waiting), False, sum(map(estimate, waiting)), waits=True))
    return sorted(units, key=lambda u: -u.estimate_s)


class Runner:
    def __init__(self, py: str, extra: list[str], jobs: int):
        self.py, self.extra, self.jobs = py, extra, jobs
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.logs = Path(tempfile.mkdtemp(prefix="dynrag-tests-"))

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def pytest(self, unit: Unit, attempt: int) -> tuple[int, str]:
        log = self.logs / f"{Path(unit.files[0]).stem}-{len(unit.files)}-{attempt}.log"
        cmd = [self.py, "-m", "pytest", "-rfE", "-p", "no:cacheprovider", "--durations=15"]
        cmd += ["-v" if unit.own else "-q", *unit.files, *self.extra]
        with open(log, "w") as out:
            rc = subprocess.run(
                cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            ).returncode
        return rc, log.read_text(encoding="utf-8", errors="replace")

    def run(self, unit: Unit) -> None:
        self.say(f"[{self.elapsed()}] start {unit.name} (about {unit.estimate_s:.0f} s)")
        started = time.monotonic()
        rc, out = self.pytest(unit, 0)
        summary = [line for line in out.splitlines() if SUMMARY.match(line)]
        notes = ""
        if unit.own and rc != 0 and not summary:
            unit.crashed = True
            notes = "\n".join(out.splitlines()[-15:]) + driver_log_tail()
            notes += f"\nCRASHED {unit.name} (pytest exit {rc}, no summary)\n"
        unit.wall_s = time.monotonic() - started
        line = summary[-1] if summary else ""
        unit.counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", line)}
        if rc not in (0, 5):
            ids = [x for x in out.splitlines() if re.match(r"(FAILED|ERROR) tests/", x)]
            unit.failures = ids or [f"CRASHED {unit.name} (pytest exit {rc})"]
        tail = "\n".join(out.splitlines()[-40:])
        self.say(f"=== [{self.elapsed()}] {' '.join(unit.files)} ({unit.wall_s:.0f} s)\n{notes}{tail}")

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.t0:6.0f} s"

    def run_all(self, units: list[Unit]) -> None:
        todo: queue.Queue = queue.Queue()
        for u in units:
            if not u.waits:
                todo.put(u)

        def lane(todo: queue.Queue) -> None:
            while True:
                try:
                    unit = todo.get_nowait()
                except queue.Empty:
                    return
                self.run(unit)

        waiting: queue.Queue = queue.Queue()
        for u in units:
            if u.waits:
                waiting.put(u)
        lanes = [threading.Thread(target=lane, args=(todo,)) for _ in range(max(1, self.jobs))]
        lanes += [threading.Thread(target=lane, args=(waiting,))] if waiting.qsize() else []
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()


def driver_log_tail() -> str:
    logs = glob.glob("/tmp/dynrag-gpu-*/session_*/logs/python-core-driver-*.log")
    logs += glob.glob("/tmp/ray/session_*/logs/python-core-driver-*.log")
    if not logs:
        return ""
    newest = max(logs, key=os.path.getmtime)
    lines = Path(newest).read_text(errors="replace").splitlines()[-20:]
    return f"\n--- the last lines of {newest}\n" + "\n".join(lines)


def source_of(path: str) -> str:
    return Path(ROOT, path).read_text(encoding="utf-8")


def read_times(path: Path) -> list[tuple[str, float, int, float]]:
    """A DYNRAG_TEST_TIMES file's rows (tests/conftest.py): file, test seconds, tests, CPU-seconds (0 in a file
    written before that column); slowest first."""
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    return sorted(((r[0], float(r[1]), int(r[2]), float((r + ["0"])[3])) for r in rows), key=lambda r: -r[1])


def report(units: list[Unit], times: Path, wall_s: float) -> int:
    rows = read_times(times) if times.is_file() else []
    print("\ntest seconds per file (setup + call + teardown), slowest first; tests run; CPU-seconds meanwhile")
    for name, seconds, n, cpu in rows:
        print(f"{seconds:8.1f} s {n:4d} {cpu:8.1f} cpu-s  {name}")
    print("wall seconds per process (with its start and collection):")
    for u in sorted(units, key=lambda u: -u.wall_s):
        print(f"{u.wall_s:8.0f} s  {u.name}")
    failures = [f for u in units for f in u.failures]
    if failures:
        print("\nfailures:\n" + "\n".join(failures))
    crashed = [u.name for u in units if u.crashed]
    if crashed:
        print("\ncrashed (see above):\n" + "\n".join(crashed))
    total = {k: sum(u.counts.get(k, 0) for u in units) for k in ("passed", "failed", "error", "skipped")}
    failed = (
        total["failed"]
        + total["error"]
        + sum(1 for u in units if u.failures and not (u.counts.get("failed") or u.counts.get("error")))
    )
    print(f"{total['passed']} passed, {failed} failed, {total['skipped']} skipped in {wall_s:.0f} s")
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="test files (default tests/**/test_*.py)")
    parser.add_argument("-m", dest="marks", help="pytest's marker expression, for every process")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", 0)) or os.cpu_count() or 1)
    parser.add_argument("--table", type=Path, help="print a DYNRAG_TEST_TIMES file as docs/operations.md's rows")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.table:
        print("\n".join(f"| {f} | {s:.1f} | {n} | {cpu:.1f} |" for f, s, n, cpu in read_times(args.table)))
        return 0
    os.chdir(ROOT)
    files = args.files or sorted(glob.glob("tests/**/test_*.py", recursive=True))
    extra = (["-m", args.marks] if args.marks else []) + extra
    py = os.environ.get("PYTHON") or str(ROOT / ".venv" / "bin" / "python")
    times = Path(os.environ.setdefault("DYNRAG_TEST_TIMES", tempfile.mktemp(prefix="dynrag-test-times-")))
    t0 = time.monotonic()
    units = plan(files, py, extra, args.jobs)
    waits = sum(u.waits for u in units)
    print(f"{len(units)} pytest processes, {args.jobs} at once (and {waits} that mostly waits beside them)", flush=True)
    Runner(py, extra, args.jobs).run_all(units)
    return report(units, times, time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
