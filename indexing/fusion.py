"""`rrf`: BM25 and dense fused by reciprocal rank (Cormack, Clarke and Büttcher, SIGIR 2009), a hybrid
retriever added through the retriever interface (retrievers.py) in one module.

Each query's top `index.fusion_depth` (at least k) hits of BM25 and of dense search are fused: a passage
scores sum over the lists that hold it of 1 / (`index.rrf_k` + rank), rank counted from 1 (the paper's
k = 60); the top k by that score are returned, ties by passage id. Both searches run as one batch each, on
the index's own BM25 and dense retrievers (opened once, shared with a plain `bm25` or `dense` search).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from indexing.hits import Hit
from indexing.retrievers import Resources, register

if TYPE_CHECKING:
    from indexing.index import Index


def fuse(lists: list[list[Hit]], k: int, c: int) -> list[Hit]:
    """The top k of ranked hit lists by reciprocal rank: score(d) = sum of 1 / (c + rank of d in a list)."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for hits in lists:
        for rank, hit in enumerate(hits, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (c + rank)
            first.setdefault(hit.id, hit)
    best = sorted(scores, key=lambda pid: (-scores[pid], pid))[:k]
    return [Hit(id=pid, title=first[pid].title, text=first[pid].text, score=scores[pid]) for pid in best]


@register("rrf")
class ReciprocalRankFusion:
    def __init__(self, index: Index):
        self.index = index
        self.parts = [index.retriever("bm25"), index.retriever("dense")]  # dense refuses a BM25-only index

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        cfg = self.index.cfg.index
        depth = max(k, cfg.fusion_depth)
        ranked = [part.search(queries, depth) for part in self.parts]
        return [fuse([r[i] for r in ranked], k, cfg.rrf_k) for i in range(len(queries))]

    def resources(self) -> Resources:
        return sum((part.resources() for part in self.parts), Resources())

    def close(self) -> None:
        """Its parts are the index's, closed with it."""
