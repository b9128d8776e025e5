"""A version's BM25 index updated from the previous version's (indexing/builder/local.py `_bm25_update`, sparse.update_lucene):
the dropped shards' documents deleted, the new shards' segments added, nothing copied; within its bounds,
otherwise merged again from every shard. Real HotpotQA paragraphs (the fixture kit's, or the whole kit's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from indexing import build_index, open_index
from indexing.builder import local as build
from indexing.corpus.passages import parent_id
from indexing.settings import IndexSettings
from indexing.versions.manifest import read_manifest, version_name


def settings() -> IndexSettings:
    return IndexSettings(embedding={"model": "hash"}, index={"shard_size": 5, "dense": False})


@pytest.fixture(scope="module")
def rows(data_dir):
    out, seen = [], set()
    for line in (data_dir / "hotpotqa/dev_400.jsonl").read_text(encoding="utf-8").splitlines()[:15]:
        for c in json.loads(line)["contexts"]:
            if c["title"] not in seen:
                seen.add(c["title"])
                out.append({"id": f"h{len(out)}", "title": c["title"], "text": c["paragraph_text"]})
    return out


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def bm25(root: Path, queries: list[str], k: int = 10) -> list[list[tuple[str, float]]]:
    with open_index(root, settings()) as index:
        return [[(h.id, h.score) for h in hits] for hits in index.search(queries, k=k, retriever="bm25")]


def test_an_append_updates_the_previous_bm25_index(rows, tmp_path):
    """+10%: the last shard's documents are deleted and come back in the new shards, once each; every
    passage is found by its own text first; scores stay within the deleted documents' share of a full
    build's, and the previous version's segment files are shared (hard links), not copied."""
    assert len(rows) >= 120
    base, more = rows[: len(rows) * 10 // 11], rows
    corpus = tmp_path / "c.jsonl"
    first = build_index([write(corpus, base)], tmp_path / "index", settings())
    assert first["bm25"]["updated"] is False and first["bm25"]["deleted"] == 0
    second = build_index([write(corpus, more)], tmp_path / "index", settings())
    full = build_index([str(corpus)], tmp_path / "full", settings())
    b = second["bm25"]
    assert b["updated"] is True and b["documents"] == second["passages"] == full["passages"]
    assert 0 < b["deleted"] <= build.BM25_MAX_DELETED * (b["documents"] + b["deleted"])

    m1, m2 = read_manifest(tmp_path / "index", version_name(1)), read_manifest(tmp_path / "index")
    assert m2["bm25"]["deleted"] == b["deleted"]
    linked = [
        n
        for n in m1["bm25"]["files"]
        if (tmp_path / "index/versions" / version_name(2) / "lucene" / n).exists()
        and os.path.samefile(
            tmp_path / "index/versions" / version_name(1) / "lucene" / n,
            tmp_path / "index/versions" / version_name(2) / "lucene" / n,
        )
    ]
    assert linked and all(m2["bm25"]["files"][n] == m1["bm25"]["files"][n] for n in linked)

    queries = [f"{r['title']} {r['text']}" for r in more]
    got, want = bm25(tmp_path / "index", queries), bm25(tmp_path / "full", queries)
    for r, hits, ref in zip(more, got, want):
        ids = [i for i, _ in hits]
        assert parent_id(ids[0]) == r["id"] and len(set(ids)) == len(ids)
        assert ref[0][0] == ids[0]
        np.testing.assert_allclose(hits[0][1], ref[0][1], rtol=0.1)


def test_past_its_bounds_the_bm25_index_is_merged_from_every_shard(rows, tmp_path, monkeypatch):
    """With no deleted document allowed, a rebuild that drops a shard merges every shard again: scores equal
    a full build's."""
    monkeypatch.setattr(build, "BM25_MAX_DELETED", 0.0)
    corpus = tmp_path / "c.jsonl"
    build_index([write(corpus, rows)], tmp_path / "index", settings())
    again = build_index([write(corpus, rows[:50] + rows[51:])], tmp_path / "index", settings())
    build_index([str(corpus)], tmp_path / "full", settings())
    assert again["bm25"] == {"updated": False, "deleted": 0, "documents": again["passages"], "segments": 1}
    queries = [r["text"][:80] for r in rows[::7]] + [rows[50]["text"]]
    for hits, ref in zip(bm25(tmp_path / "index", queries), bm25(tmp_path / "full", queries)):
        assert [i for i, _ in hits] == [i for i, _ in ref]
        np.testing.assert_allclose([s for _, s in hits], [s for _, s in ref], rtol=1e-6)


def test_a_deleted_passage_is_gone_from_the_updated_index(rows, tmp_path):
    """A record removed from the middle: its shard is rebuilt without it and the old documents are deleted."""
    corpus = tmp_path / "c.jsonl"
    build_index([write(corpus, rows)], tmp_path / "index", settings())
    gone = rows[60]
    again = build_index([write(corpus, rows[:60] + rows[61:])], tmp_path / "index", settings())
    assert again["bm25"]["updated"] is True
    hits = bm25(tmp_path / "index", [f"{gone['title']} {gone['text']}"], k=50)[0]
    assert gone["id"] not in {parent_id(i) for i, _ in hits}
    neighbours = [r for r in rows[50:70] if r is not gone]
    for r, h in zip(neighbours, bm25(tmp_path / "index", [f"{r['title']} {r['text']}" for r in neighbours])):
        assert parent_id(h[0][0]) == r["id"] and len({i for i, _ in h}) == len(h)
