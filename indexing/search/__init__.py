"""Searching a published version: the open index (index), the registered retrievers, BM25, dense and fused
(retrievers), and what a search returns (hits)."""
