"""No wait without a limit on the build path (issue 78): a local build's pool of processes (executors.py) waits
for its tasks for as long as they make progress (a task ends, or a running one ticks), and `index.build_stall_s`
without any ends the build with one line; nothing is published. The Ray executor's tests are in
tests/cluster/test_cluster_build.py (its cluster fixture)."""

from __future__ import annotations

import json
import re
import time

import pytest

from indexing import build_index, open_index
from indexing.builder import executors
from indexing.builder.executors import LocalExecutor
from indexing.errors import BuildStalled
from indexing.versions.manifest import current_version, read_manifest
from pipeline.config import load_config

LINE = (
    r"index build \(pid \d+ on \S+\): waited [\d.]+ s for {n} tasks? on a pool of 2 build processes \({names}\) "
    r"with no progress \(no task ended, none reported a step; index\.build_stall_s={limit}\); stopping, nothing "
    r"published"
)


def warm(ex: LocalExecutor, stall_s: float) -> None:
    """The pool's processes started and this module imported in them (seconds on a busy machine), then the limit."""
    assert ex.gather([ex.submit(ticking, 0)[0] for _ in range(2)]) == ["ticked"] * 2
    ex.stall_s = stall_s


def ticking(seconds: float) -> str:
    """A pool task longer than the limit that reports a step every 0.2 s (as an embedding step does)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        executors.tick()
    return "ticked"


@pytest.mark.timeout(60)  # without the limit, gather waits for the hung task (600 s)
def test_a_pool_task_that_never_ends_stops_the_build_with_one_line():
    ex = LocalExecutor(2, stall_s=3.0)  # past the pool's start (spawned processes): the quick task ends
    pool = ex.pool
    assert pool is not None
    hung = ex.submit(time.sleep, 600)[0]
    quick = ex.submit(time.sleep, 0)[0]
    t = time.monotonic()
    with pytest.raises(BuildStalled) as ended:
        ex.gather([hung, quick], "build")
    assert time.monotonic() - t < 20
    assert re.fullmatch(LINE.format(n=1, names="sleep", limit=3), str(ended.value)), str(ended.value)
    assert all(not p.is_alive() for p in (getattr(pool, "_processes", None) or {}).values())  # the hung one ended
    ex.close()  # returns at once: nothing left to wait for


@pytest.mark.timeout(60)
def test_a_pool_that_keeps_finishing_tasks_runs_past_the_limit():
    """Six tasks of 2 s on two processes: about 6 s in all, twice the 3 s limit, and never 3 s without one
    ending."""
    ex = LocalExecutor(2)
    try:
        warm(ex, 3.0)
        t = time.monotonic()
        assert ex.gather([ex.submit(time.sleep, 2.0)[0] for _ in range(6)], "build") == [None] * 6
        assert time.monotonic() - t > 3.0
    finally:
        ex.close()


@pytest.mark.timeout(60)
def test_a_long_task_that_reports_steps_runs_past_the_limit():
    """One task of 5 s with a 1.5 s limit: it ticks, so it is not taken for a hung one."""
    ex = LocalExecutor(2)
    try:
        warm(ex, 1.5)
        assert ex.gather(ex.submit(ticking, 5.0), "build") == ["ticked"]
    finally:
        ex.close()


def corpus(folder, n: int, extra: str = "") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(2):
        rows = [
            {
                "id": f"f{f}p{i}",
                "title": f"Title {f} {i}",
                "text": f"passage {i} of file {f} about topic {i % 7}{extra}",
            }
            for i in range(n)
        ]
        path = folder / f"part{f}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths.append(str(path))
    return paths


def settings(**overrides):
    o = {"runtime.mode": "local", "embedding.model": "hash", "index.shard_size": 8, "index.build_workers": 2}
    return load_config(overrides=[f"{k}={v}" for k, v in {**o, **overrides}.items()]).index_settings()


@pytest.mark.timeout(120)  # without the limit, the build waits for the paused task (600 s)
def test_a_build_whose_unit_hangs_stops_and_leaves_the_published_version(tmp_path, monkeypatch):
    """A rebuild on a pool of two processes whose first unit task to stage a shard hangs there (fault_point
    pauses it for 600 s): the build stops after index.build_stall_s (8 s) with the one line, and version 1 stays
    published and searchable, its manifest untouched."""
    root = tmp_path / "idx"
    first = build_index(corpus(tmp_path / "c1", 20), str(root), settings(**{"index.build_workers": 1}))
    assert first["version"] == 1 and current_version(root) == "v000001"
    before = read_manifest(root)
    pause = tmp_path / "pause"
    monkeypatch.setenv("DYNRAG_PAUSE_AT", "build.passages_staged")  # the pool's processes inherit it
    monkeypatch.setenv("DYNRAG_PAUSE_DIR", str(pause))
    t = time.monotonic()
    with pytest.raises(BuildStalled) as ended:
        build_index(corpus(tmp_path / "c2", 20, " changed"), str(root), settings(**{"index.build_stall_s": 8}))
    assert time.monotonic() - t < 60
    assert (pause / "build.passages_staged").read_text()  # the task did hang there
    assert re.fullmatch(LINE.format(n=1, names=r"build_unit\(\S+part[01]\.jsonl\)", limit=8), str(ended.value)), str(
        ended.value
    )
    assert current_version(root) == "v000001" and read_manifest(root) == before
    with open_index(root, settings()) as idx:
        assert idx.passages(["f0p3"])[0].text == "passage 3 of file 0 about topic 3"
