"""The retriever interface (indexing/search/retrievers.py): BM25 and dense behind one `search`, the stated resources,
their reciprocal-rank fusion `rrf`, and a retriever added as one class with one registration."""

from __future__ import annotations

import json
import random

import pytest

from indexing import IndexSettings, build_index, open_index
from indexing.search.hits import Hit
from indexing.search.retrievers import RETRIEVERS, Resources, SearchError, fuse, register, retriever_names


def rows(n: int, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    return [{"id": f"p{i}", "title": f"T{i}", "text": " ".join(rng.choices(words, k=40))} for i in range(n)]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retrievers")
    corpus = tmp / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows(300)), encoding="utf-8")
    build_index([str(corpus)], tmp / "idx", settings())
    return tmp / "idx"


def settings(**index) -> IndexSettings:
    return IndexSettings(embedding={"model": "hash"}, index={"shard_size": 80, **index})


def hit(pid: str) -> Hit:
    return Hit(id=pid, title="", text=pid, score=0.0)


def test_fuse_scores_by_reciprocal_rank():
    bm25 = [hit("a"), hit("b"), hit("c")]
    dense = [hit("c"), hit("d"), hit("a")]
    fused = fuse([bm25, dense], k=3, c=60)
    # a: 1/61 + 1/63, c: 1/63 + 1/61 (a tie, broken by id), b: 1/62, d: 1/62
    assert [h.id for h in fused] == ["a", "c", "b"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 63)
    assert [h.id for h in fuse([[], bm25], k=5, c=60)] == ["a", "b", "c"]


def test_rrf_fuses_the_index_own_bm25_and_dense_lists(index_dir):
    queries = [r["text"] for r in rows(300)[::37]] + ["w1 w2 w3", ""]
    with open_index(index_dir, settings(fusion_depth=20)) as index:
        got = index.search(queries, k=5, retriever="rrf")
        bm25 = index.search(queries, k=20, retriever="bm25")
        dense = index.search(queries, k=20, retriever="dense")
        assert index.retriever("rrf").parts == [index.retriever("bm25"), index.retriever("dense")]  # opened once
        resources = index.resources()
    for q, hits, b, d in zip(queries, got, bm25, dense):
        assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in fuse([b, d], 5, 60)], q
        assert all(h.text for h in hits)
    assert got[0][0].id == "p0"  # a passage's own text: first in both lists
    assert resources.faiss is not None and resources.faiss.vectors == 300 and resources.memory_bytes > 0


def test_unknown_and_bm25_only(index_dir, tmp_path):
    with open_index(index_dir, settings()) as index, pytest.raises(SearchError, match="unknown retriever 'nope'"):
        index.search(["q"], k=3, retriever="nope")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows(50)), encoding="utf-8")
    build_index([str(corpus)], tmp_path / "bm25", settings(dense=False))
    with open_index(tmp_path / "bm25", settings()) as index:
        assert index.resources().faiss is None and len(index.search(["w1"], k=3, retriever="bm25")[0]) == 3
        with pytest.raises(SearchError, match="BM25-only"):
            index.search(["w1"], k=3, retriever="rrf")


def test_a_retriever_is_one_class_and_one_registration(index_dir, monkeypatch):
    """A registered retriever is searched by name through the index, and the run's configuration accepts it."""
    from pipeline.config import DynragConfig

    monkeypatch.setattr("indexing.search.retrievers.RETRIEVERS", dict(RETRIEVERS))  # as it was, after the test

    @register("reversed-bm25")
    class Reversed:
        def __init__(self, index):
            self.bm25 = index.retriever("bm25")

        def search(self, queries, k):
            return [list(reversed(hits)) for hits in self.bm25.search(queries, k)]

        def resources(self):
            return Resources()

        def close(self):
            pass

    assert "reversed-bm25" in retriever_names()
    with open_index(index_dir, settings()) as index:
        plain, mine = (index.search(["w5 w6"], k=4, retriever=r)[0] for r in ("bm25", "reversed-bm25"))
    assert [h.id for h in mine] == [h.id for h in reversed(plain)]
    cfg = DynragConfig.model_validate({"retrieval": {"retriever": "reversed-bm25"}})
    assert cfg.retrieval.retriever == "reversed-bm25"
    with pytest.raises(ValueError, match="unknown retriever"):
        DynragConfig.model_validate({"retrieval": {"retriever": "nope"}})
