"""Retrieval over an index built by `dynrag index`: the index version opened once, searched by name through
its retrievers (indexing/retrievers.py: bm25, dense, rrf, ...)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pipeline.config import DynragConfig

if TYPE_CHECKING:
    from indexing.faiss_gpu import IndexPlacement
    from indexing.index import Index
    from indexing.retrievers import Resources

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


def open_run_index(index: str, cfg: DynragConfig) -> tuple[dict, IndexRetriever | None]:
    """A run's index, checked before any row is written: in-process opened once (its manifest and its
    retriever, handed to the GPU plan and the backends); with Ray only its manifest read (and, for a local
    folder, its files' sizes under index.verify=size): the actors pull, open and search it on their nodes."""
    if cfg.runtime.mode == "ray":
        from indexing.remote import index_manifest

        return index_manifest(index, check_sizes=cfg.index.verify == "size"), None
    retriever = IndexRetriever(index, cfg)
    return retriever.index.manifest, retriever
