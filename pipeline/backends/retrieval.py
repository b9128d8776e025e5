"""Retrieval over an index built by `dynrag index` (BM25 on Lucene, dense on FAISS)."""

from __future__ import annotations

import logging

from pipeline.config import DynragConfig

log = logging.getLogger(__name__)


class IndexRetriever:
    def __init__(self, index_dir: str, cfg: DynragConfig):
        from indexing import open_index

        self.index = open_index(index_dir, cfg.index_settings())

    def search(self, queries: list[str], k: int, retriever: str):
        return self.index.search(list(queries), k=k, retriever=retriever)

    def passages(self, ids):
        return self.index.passages(ids)

    def close(self) -> None:
        close = getattr(self.index, "close", None)
        if close:
            close()
