"""Retrievers: one interface over an open index version; BM25 and dense implement it, and so may any other.

    class Retriever(Protocol):
        def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...  # one batch, top-k per query
        def resources(self) -> Resources: ...                                   # what it holds once searched
        def close(self) -> None: ...

A retriever is made from an open `Index` (index.py), which holds what every retriever shares: the manifest,
the passages' stores and the id map (a hit's text is read for hits only). `Index.retriever(name)` makes each
one once, on first use, and closes it with the index. Adding a retriever is one module with one class and
one `@register("name")` (fusion.py is one; index.py imports each such module, so that it registers); `retrieval.retriever` and a method's `retriever` parameter then
accept its name, and the GPU plan reads its `resources()` (pipeline/runtime/gpu_plan.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from indexing.errors import IndexingError
from indexing.hits import Hit

if TYPE_CHECKING:
    from indexing.dense import ShardSet
    from indexing.faiss_gpu import IndexShape
    from indexing.index import Index


class SearchError(IndexingError, ValueError):
    """A bad search request (unknown retriever, k < 1, dense search of a BM25-only index)."""


@dataclass(frozen=True)
class Resources:
    """What a retriever holds once it has searched: host memory it maps or loads (bytes, an estimate from the
    manifest) and a FAISS index the GPU plan may place on a GPU (None: nothing for a GPU)."""

    memory_bytes: int = 0
    faiss: IndexShape | None = None

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.memory_bytes + other.memory_bytes, self.faiss or other.faiss)


class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...

    def resources(self) -> Resources: ...

    def close(self) -> None: ...


RETRIEVERS: dict[str, Callable[[Index], Retriever]] = {}


def register(name: str) -> Callable[[Callable[[Index], Retriever]], Callable[[Index], Retriever]]:
    """Class decorator: the retriever `name`, made from an open Index."""

    def add(make: Callable[[Index], Retriever]) -> Callable[[Index], Retriever]:
        RETRIEVERS[name] = make
        return make

    return add


@register("bm25")
class BM25:
    """BM25 over the version's Lucene index: one pyserini batch_search (`index.threads` threads) per batch; a
    hit's passage is found by its id (the id map names its shard)."""

    def __init__(self, index: Index):
        from indexing.sparse import LuceneShard

        self.index = index
        cfg = index.cfg.index
        self.lucene = LuceneShard(
            index.version_dir / index.manifest["bm25"]["path"], cfg.bm25_k1, cfg.bm25_b, index.analyzer
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        from indexing.sparse import batch_search

        results = batch_search(self.lucene, queries, k, self.index.cfg.index.threads)
        flat = [h for hits in results for h in hits]
        found = self.index.lookup([d for d, _ in flat], [s for _, s in flat])  # one call per shard hit
        if None in found:
            missing = flat[found.index(None)][0]
            raise IndexingError(f"Lucene index {self.lucene.path} returned id {missing!r} missing from the passages")
        out, at = [], 0
        for hits in results:
            out.append([h for h in found[at : at + len(hits)] if h is not None])
            at += len(hits)
        return out

    def resources(self) -> Resources:
        files = self.index.manifest["bm25"].get("files", {})
        return Resources(sum(int(f.get("bytes", 0)) for f in files.values()))

    def close(self) -> None:
        self.lucene.close()


@register("dense")
class Dense:
    """FAISS over every shard (dense.ShardSet, loaded on first search; on a GPU where the plan put it), the
    queries encoded by the index's own embedding model."""

    def __init__(self, index: Index):
        if index.manifest["settings"].get("dense") is False:
            raise SearchError(
                f"{index.root} is a BM25-only index (built with index.dense=false): search it with "
                "bm25, or rebuild it with --set index.dense=true"
            )
        self.index = index
        self._faiss: ShardSet | None = None
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        S, SH, R = self._shards().search(self.index.encode_queries(queries), k)
        return [
            [self.index.hit(int(sh), int(r), s) for s, sh, r in zip(S[i], SH[i], R[i]) if sh >= 0]
            for i in range(len(queries))
        ]

    def _shards(self) -> ShardSet:
        with self._lock:
            if self._faiss is None:
                from indexing.dense import load_shards, load_template_quantizer

                i, m = self.index.cfg.index, self.index.manifest
                template = m.get("faiss_template")
                quantizer = load_template_quantizer(self.index.root / template["path"]) if template else None
                self._faiss = load_shards(
                    [d / "faiss.index" for d in self.index.shard_dirs],
                    i.faiss_nprobe,
                    i.faiss_ef_search,
                    quantizer,
                    gpu=self.index.cfg.faiss_placement,
                )
        return self._faiss

    def resources(self) -> Resources:
        from indexing.faiss_gpu import IndexShape

        m = self.index.manifest
        shape = IndexShape.from_factory(m["settings"]["faiss_factory"], int(m["dim"]), int(m["passages"]))
        files = sum(int(s["files"].get("faiss.index", {}).get("bytes", 0)) for s in m["shards"])
        return Resources(files, shape)

    def close(self) -> None:
        self._faiss = None
