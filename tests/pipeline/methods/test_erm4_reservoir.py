"""ERM4's Memory Knowledge Reservoir (Sec. 3.3) and Retrieval Trigger (Sec. 3.4): Pop at the threshold
edges, replacement by title, persistence across processes and concurrent writers without lost updates."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import DynragConfig
from pipeline.methods.reservoir import (
    Knowledge,
    Reservoir,
    ReservoirBackend,
    ReservoirError,
    popularity,
    within_boundary,
)

ROOT = Path(__file__).resolve().parents[3]


def unit_with_first(c: float, dim: int = 4) -> np.ndarray:
    """A unit vector whose inner product with e1 is exactly c (c is a dyadic fraction)."""
    v = np.zeros(dim, dtype=np.float32)
    v[0] = c
    v[1] = np.sqrt(1.0 - c * c)
    return v


E1 = np.array([1, 0, 0, 0], dtype=np.float32)


# -- Pop(q) = |{k : S(q, title(k)) >= tau}| and Pop >= theta -----------------------------------------


def test_popularity_counts_similarities_at_or_above_tau():
    sims = np.array([0.25, 0.5, 0.75, 0.5, 0.49999997], dtype=np.float32)
    assert popularity(sims, 0.5) == 3  # two exactly at tau count, just below does not
    assert popularity(sims, 0.75) == 1
    assert popularity(sims, 0.76) == 0
    assert popularity(np.array([]), 0.2) == 0


def test_boundary_is_pop_at_least_theta():
    assert within_boundary(3, 3) and within_boundary(4, 3)
    assert not within_boundary(2, 3)


def test_reservoir_lookup_pop_at_the_edges(tmp_path):
    r = Reservoir(tmp_path / "k.sqlite")
    r.upsert([Knowledge(f"t{c}", f"content {c}", unit_with_first(c)) for c in (0.25, 0.5, 0.625, 0.75)])
    # S(e1, title) is exactly the first coordinate: tau = 0.5 keeps 0.5, 0.625, 0.75
    pop, hits = r.lookup(E1, tau=0.5)
    assert pop == 3 and within_boundary(pop, 3)
    assert [h.title for h in hits] == ["t0.75", "t0.625", "t0.5"]  # most similar first
    assert hits[-1].score == 0.5
    pop, _ = r.lookup(E1, tau=0.625)
    assert pop == 2 and not within_boundary(pop, 3)
    pop, hits = r.lookup(E1, tau=0.25, limit=2)
    assert pop == 4 and len(hits) == 2  # the limit caps hits, not Pop
    assert r.lookup(E1, tau=0.8) == (0, [])


def test_an_empty_reservoir_has_pop_zero_and_a_wrong_size_is_refused(tmp_path):
    r = Reservoir(tmp_path / "k.sqlite")
    assert r.lookup(E1, tau=0.0) == (0, [])
    r.upsert([Knowledge("a", "x", E1)])
    with pytest.raises(ReservoirError, match="size"):
        r.upsert([Knowledge("b", "y", np.ones(3, dtype=np.float32))])
    with pytest.raises(ReservoirError, match="size"):
        r.lookup(np.ones(3), tau=0.5)
    assert len(r) == 1  # the failed transaction left nothing behind


# -- replacement by title ------------------------------------------------------------------------------


def test_a_newer_entry_replaces_the_older_one_with_the_same_title(tmp_path):
    r = Reservoir(tmp_path / "k.sqlite")
    r.upsert([Knowledge("Paris", "old text", unit_with_first(0.5), "d1"), Knowledge("Rome", "rome", E1, "d2")])
    assert r.get("Paris") == ("old text", "d1")
    r.upsert([Knowledge("Paris", "new text", E1, "d9")])
    assert len(r) == 2
    assert r.get("Paris") == ("new text", "d9")
    # the embedding was replaced too: both titles now match e1 exactly
    assert r.lookup(E1, tau=1.0)[0] == 2
    # within one batch the later pair wins
    r.upsert([Knowledge("Oslo", "first", E1), Knowledge("Oslo", "second", E1)])
    assert r.get("Oslo")[0] == "second" and len(r) == 3
    assert r.version() == 5  # every pair written counts


# -- persistence and several processes -------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from pipeline.methods.reservoir import Knowledge, Reservoir
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = Reservoir(path)
    v = np.zeros(4, dtype=np.float32); v[0] = 1
    for i in range(n):  # one transaction per pair: the two writers interleave
        r.upsert([Knowledge(f"{tag}-{i}", f"{tag} content {i}", v), Knowledge("shared", f"{tag} {i}", v)])
    print(len(r))
""")


def _run(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_the_reservoir_survives_into_a_second_process(tmp_path):
    path = tmp_path / "k.sqlite"
    proc = _run(str(path), "a", "5")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    r = Reservoir(path)  # this process opens what the other one wrote
    assert len(r) == 6 and r.get("a-4")[0] == "a content 4" and r.get("shared")[0] == "a 4"


def test_two_processes_writing_at_once_lose_no_update(tmp_path):
    path = tmp_path / "k.sqlite"
    r = Reservoir(path)
    r.upsert([Knowledge("seed", "s", E1)])
    assert r.lookup(E1, tau=1.0)[0] == 1  # snapshot cached before the others write
    n = 150
    procs = [_run(str(path), tag, str(n)) for tag in ("a", "b")]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert len(r) == 1 + 2 * n + 1  # seed, every tagged pair, one "shared"
    assert r.version() == 1 + 2 * 2 * n  # each of the 4n pairs got its own version: no write was lost
    assert all(r.get(f"{t}-{i}") is not None for t in "ab" for i in range(n))
    assert r.get("shared")[0] in (f"a {n - 1}", f"b {n - 1}")  # the last writer's pair is kept
    # this connection sees the other processes' commits (the cached snapshot is refreshed)
    assert r.lookup(E1, tau=1.0)[0] == len(r)


def test_backend_batches_lookups_and_adds_per_store(tmp_path):
    cfg = DynragConfig()
    cfg.paths.cache_dir = str(tmp_path / "cache")
    b = ReservoirBackend(cfg)
    run, other = str(tmp_path / "run.sqlite"), str(tmp_path / "other.sqlite")
    versions = b.add(
        [
            {"store": run, "title": "A", "content": "a", "id": "1", "vector": E1},
            {"store": other, "title": "B", "content": "b", "id": "2", "vector": E1},
            {"store": run, "title": "C", "content": "c", "id": "3", "vector": unit_with_first(0.5)},
        ]
    )
    assert versions == [2, 1, 2]  # one transaction per store
    assert not (tmp_path / "cache").exists()  # no reservoir outside the one a run names
    with pytest.raises(ReservoirError, match="bound to a run"):
        b.lookup([{"store": None, "vector": E1, "tau": 0.5, "limit": None}])
    res = b.lookup(
        [
            {"store": run, "vector": E1, "tau": 0.5, "limit": None},
            {"store": other, "vector": E1, "tau": 0.5, "limit": None},
        ]
    )
    assert [r["pop"] for r in res] == [2, 1]
    assert [h.id for h in res[0]["hits"]] == ["1", "3"]
    b.close()
