"""Helpers of the fault-injection tests: run the real `dynrag` CLI in a subprocess, let it pause at a
named point (platform_shims/faults.py), send it a real signal there, and poll an index as a reader would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from indexing.errors import IndexingError
from indexing.versions.manifest import read_manifest, verify_version

ROOT = Path(__file__).resolve().parent.parent
# vLLM's default process layout (an EngineCore process, its worker in another), for the tests whose point it is: the
# other tests run the engine in-process (tests/conftest.py)
VLLM_PROCESSES = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie counts: it holds nothing but its entry)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, seconds: float = 20) -> bool:
    """Whether process `pid` ends within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return False


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobs.cli", "--log-level", "WARNING", *args]


def no_model_answer(dataset, out, n: int, *extra: str) -> list[str]:
    """`dynrag answer` of the first `n` questions of `dataset` into `out`, the model's cost taken out
    (no-retrieval, generation.backend=none), in batches of 25; `extra`: more arguments (`--set` ...)."""
    return cli(
        "answer",
        "--dataset",
        str(dataset),
        "--method",
        "no-retrieval",
        "--out",
        str(out),
        "--limit",
        str(n),
        "--no-progress",
        "--set",
        "generation.backend=none",
        "--set",
        "answer.batch_questions=25",
        *extra,
    )


def env_for(pause_at: str | None = None, pause_dir: Path | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("DYNRAG_PAUSE_AT", None)
    if pause_at:
        env.update(DYNRAG_PAUSE_AT=pause_at, DYNRAG_PAUSE_DIR=str(pause_dir))
    return env


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    """A CLI process in its own session (so a kill of its group also ends its helpers)."""
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def run(cmd: list[str], env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env or env_for(), capture_output=True, text=True, timeout=timeout)


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)


def run_until_paused(cmd: list[str], point: str, pause_dir: Path, timeout: float = 600) -> subprocess.Popen:
    """Start `cmd`, return once it sits paused at `point` (raises if it ends first)."""
    marker = pause_dir / point
    marker.unlink(missing_ok=True)
    proc = start(cmd, env_for(point, pause_dir))
    deadline = time.time() + timeout
    while not (marker.exists() and marker.read_text()):
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{point}: the process ended (rc {proc.returncode}) before pausing:\n{err[-3000:]}")
        if time.time() > deadline:
            kill_group(proc)
            raise AssertionError(f"{point}: not reached in {timeout}s")
        time.sleep(0.05)
    return proc


def kill_at(cmd: list[str], point: str, pause_dir: Path, sig: int = signal.SIGKILL) -> subprocess.CompletedProcess:
    """Run `cmd` until it pauses at `point`, send it `sig` with os.kill, and return how it ended."""
    proc = run_until_paused(cmd, point, pause_dir)
    try:
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def one_error_line(err: str) -> str:
    """The one `dynrag: error: ...` line of a refused job's stderr (asserts there is nothing else)."""
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("dynrag: error: "), err
    return lines[0]


def damage_faiss_header(index_root: Path) -> Path:
    """Overwrite 16 header bytes of an index's first FAISS file without changing its size (so
    index.verify=size passes it); returns the damaged file."""
    target = next((index_root / "shards").glob("*/faiss.index"))
    header = bytearray(target.read_bytes())
    header[8:24] = b"\xff" * 16
    target.write_bytes(bytes(header))
    return target


def published_version(root: Path) -> int | None:
    """What a reader opening the index sees now: None before the first publish, else the version
    number, after checking that every file its manifest lists is present at its full size."""
    if not (root / "CURRENT").exists():
        return None
    m = read_manifest(root)
    verify_version(root, m, full=False)
    return m["version"]


class IndexReader(threading.Thread):
    """Polls `published_version` until stopped; records the versions seen and any inconsistency."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.seen, self.failures, self.polls = root, set(), [], 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.seen.add(published_version(self.root))
            except (IndexingError, OSError, ValueError) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.polls += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)
