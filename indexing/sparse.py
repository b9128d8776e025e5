"""Sparse shards: one pyserini Lucene index per shard, BM25 batch search, merged by score.

Documents are indexed through pyserini's `LuceneIndexer` (Anserini's JsonCollection documents:
`id` = passage id, `contents` = title + newline + text). BM25 scores use each shard's own term
statistics, as in any sharded Lucene deployment without global statistics, so merging by score is
exact only when the shards' statistics agree; with shards of tens of thousands of passages the
difference is small (the tests compare against one index).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Iterable

from indexing.java import ensure_java

log = logging.getLogger(__name__)


def build_lucene(docs: Iterable[tuple[str, str]], out: Path, threads: int) -> int:
    """Index (id, contents) pairs into a fresh Lucene index at `out`; return the document count."""
    ensure_java()
    from pyserini.index.lucene import LuceneIndexer

    if out.exists():
        shutil.rmtree(out)
    indexer = LuceneIndexer(str(out), threads=threads)
    n = 0
    batch: list[dict] = []
    for doc_id, contents in docs:
        batch.append({"id": doc_id, "contents": contents})
        if len(batch) >= 5000:
            indexer.add_batch_dict(batch)
            n += len(batch)
            batch = []
    if batch:
        indexer.add_batch_dict(batch)
        n += len(batch)
    indexer.close()
    lock = out / "write.lock"
    if lock.exists():
        lock.unlink()  # an empty marker Lucene leaves behind; not part of the index
    return n


class LuceneShard:
    """One shard's searcher, opened on first use."""

    def __init__(self, path: Path, k1: float, b: float):
        self.path, self.k1, self.b = path, k1, b
        self._searcher = None

    @property
    def searcher(self):
        if self._searcher is None:
            ensure_java()
            from pyserini.search.lucene import LuceneSearcher

            self._searcher = LuceneSearcher(str(self.path))
            self._searcher.set_bm25(self.k1, self.b)
        return self._searcher

    def batch_search(self, queries: list[str], k: int, threads: int) -> list[list[tuple[str, float]]]:
        qids = [str(i) for i in range(len(queries))]
        res = self.searcher.batch_search(queries, qids, k=k, threads=threads)
        return [[(h.docid, float(h.score)) for h in res.get(q, [])] for q in qids]

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None


def search_shards(shards: list[LuceneShard], queries: list[str], k: int, threads: int) -> list[list[tuple[float, int, str]]]:
    """One Lucene batch_search per shard over all queries; per query the top-k (score, shard, docid)
    by score, ties broken by shard order and then by rank within the shard."""
    live = [i for i, q in enumerate(queries) if q.strip()]
    merged: list[list[tuple[float, int, int, str]]] = [[] for _ in queries]
    if live:
        qs = [queries[i] for i in live]
        for si, shard in enumerate(shards):
            for qi, hits in zip(live, shard.batch_search(qs, k, threads)):
                merged[qi].extend((score, si, rank, docid) for rank, (docid, score) in enumerate(hits))
    out = []
    for hits in merged:
        hits.sort(key=lambda h: (-h[0], h[1], h[2]))
        out.append([(s, si, d) for s, si, _, d in hits[:k]])
    return out
