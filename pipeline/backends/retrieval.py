"""Retrieval over an index built by `dynrag index`: the index version opened once, searched by name through
its retrievers (indexing/search/retrievers.py: bm25, dense, rrf, ...)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline.config import DynragConfig

if TYPE_CHECKING:
    from indexing.search.index import Index
    from indexing.search.retrievers import Resources
    from indexing.shards.faiss_gpu import IndexPlacement

log = logging.getLogger(__name__)


class IndexRetriever:
    """One open index version for a run's backends: open, search a batch, close; `resources()` for the GPU
    plan, whose FAISS placement `place` sets before the first dense search."""

    def __init__(self, index_dir: str, cfg: DynragConfig):
        from indexing import open_index

        self.index: Index = open_index(index_dir, cfg.index_settings())

    def resources(self) -> Resources:
        return self.index.resources()

    def place(self, placement: IndexPlacement | None) -> None:
        self.index.place_faiss(placement)  # a replica's GPU plan; None keeps FAISS on the CPU

    def search(self, queries: list[str], k: int, retriever: str) -> Any:
        return self.index.search(list(queries), k=k, retriever=retriever)

    def passages(self, ids: list[str]) -> Any:
        return self.index.passages(ids)

    def close(self) -> None:
        self.index.close()
