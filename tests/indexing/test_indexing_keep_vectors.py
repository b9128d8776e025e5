"""`index.keep_vectors=false`: a shard's vectors.npy is deleted once its FAISS index is written. The index
is complete and verifiable without them, and a rebuild re-embeds the passages of the shards it changes,
giving the index a build that kept its vectors gives (hash encoder: the same text, the same vector)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import indexing.builder.shard_storage
from indexing import IndexSettings, build_index, open_index
from indexing.versions.manifest import read_manifest, verify_version


def rows(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    return [{"id": f"k{i}", "title": f"T{i}", "text": " ".join(rng.choices(words, k=60))} for i in range(n)]


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def settings(keep: bool) -> IndexSettings:
    index = {"shard_size": 100, "faiss_factory": "IVF8,SQ8", "faiss_train_size": 400, "keep_vectors": keep}
    return IndexSettings(embedding={"model": "hash"}, index=index)


def dense_hits(root, queries: list[str]) -> list[list[tuple[str, float]]]:
    with open_index(root, settings(True)) as index:
        return [[(h.id, round(h.score, 5)) for h in q] for q in index.search(queries, k=5, retriever="dense")]


def test_no_vectors_kept_and_rebuild_reembeds(tmp_path):
    first, final = rows(600), rows(660)
    final[300] = {**final[300], "text": final[300]["text"] + " changed"}
    a, b = write(tmp_path / "a.jsonl", first), write(tmp_path / "b.jsonl", final)
    dropped, kept = tmp_path / "dropped", tmp_path / "kept"
    build_index([a], dropped, settings(False))
    build_index([a], kept, settings(True))

    m = read_manifest(dropped)
    assert m["dim"] == 384 and len(m["shards"]) >= 3
    assert not list(dropped.rglob("vectors.npy")) and not any("vectors.npy" in s["files"] for s in m["shards"])
    assert verify_version(dropped, m, full=True)[0] > 0
    queries = [r["text"] for r in first[::50]]
    with open_index(dropped, settings(False)) as index:
        assert [h[0].id for h in index.search(queries, k=1, retriever="dense")] == [r["id"] for r in first[::50]]
        assert index.search(["w7 w8"], k=3, retriever="bm25")[0]

    # the rebuild re-embeds every passage of the shards it changes (nothing to copy), and gives the same index
    r_dropped = build_index([b], dropped, settings(False))
    r_kept = build_index([b], kept, settings(True))
    assert r_dropped["shards_built"] == r_kept["shards_built"] >= 2 and r_dropped["shards_reused"] >= 1
    built = [s for s in read_manifest(dropped)["shards"] if s["key"] not in {x["key"] for x in m["shards"]}]
    assert r_dropped["vectors_reused"] == 0 and r_dropped["passages_embedded"] == sum(s["passages"] for s in built)
    assert r_kept["vectors_reused"] > 0 and r_kept["passages_embedded"] < r_dropped["passages_embedded"]
    m2 = read_manifest(dropped)
    assert [s["key"] for s in m2["shards"]] == [s["key"] for s in read_manifest(kept)["shards"]]
    assert not list(dropped.rglob("vectors.npy")) and verify_version(dropped, m2, full=True)[0] > 0
    queries = [r["text"] for r in final[::40]]
    assert dense_hits(dropped, queries) == dense_hits(kept, queries)


class Killed(Exception):
    pass


def test_resume_after_vectors_deleted(tmp_path, monkeypatch):
    """Killed after a shard's vectors were deleted, before it moved into place: the rerun embeds that shard again."""
    corpus = write(tmp_path / "a.jsonl", rows(500))
    calls = []

    def point(name):
        if name == "shard.faiss_written":
            calls.append(name)
            if len(calls) == 2:
                raise Killed(name)

    monkeypatch.setattr(indexing.builder.shard_storage, "fault_point", point)
    with pytest.raises(Killed):
        build_index([corpus], tmp_path / "idx", settings(False))
    staged = [d for d in (tmp_path / "idx" / "staging").iterdir() if (d / "faiss.index").is_file()]
    assert staged and not (staged[0] / "vectors.npy").exists()
    monkeypatch.setattr(indexing.builder.shard_storage, "fault_point", lambda name: None)
    build_index([corpus], tmp_path / "idx", settings(False))
    build_index([corpus], tmp_path / "ref", settings(True))
    queries = [r["text"] for r in rows(500)[::25]]
    assert dense_hits(tmp_path / "idx", queries) == dense_hits(tmp_path / "ref", queries)
    assert not list((tmp_path / "idx").rglob("vectors.npy"))
    assert np.load(next((tmp_path / "ref").rglob("vectors.npy"))).shape[1] == 384
