"""Retrieval over an index built by `dynrag index` (BM25 on Lucene, dense on FAISS)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pipeline.config import DynragConfig

if TYPE_CHECKING:
    from indexing.faiss_gpu import IndexPlacement

log = logging.getLogger(__name__)


class IndexRetriever:
    def __init__(self, index_dir: str, cfg: DynragConfig, faiss_placement: IndexPlacement | None = None):
        from indexing import open_index

        settings = cfg.index_settings()
        settings.faiss_placement = faiss_placement  # a replica's GPU plan; None keeps FAISS on the CPU
        self.index = open_index(index_dir, settings)

    def search(self, queries: list[str], k: int, retriever: str):
        return self.index.search(list(queries), k=k, retriever=retriever)

    def passages(self, ids):
        return self.index.passages(ids)

    def close(self) -> None:
        close = getattr(self.index, "close", None)
        if close:
            close()
