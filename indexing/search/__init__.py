"""Searching a published version: the open index (index), the registered retrievers, BM25, dense and fused
(retrievers), and what a search returns (hits)."""

from indexing.search.hits import Hit

__all__ = ["Hit", "index", "retrievers"]
