"""Retrievers: one interface over an open index version; BM25 and dense implement it, and so may any other.

    class Retriever(Protocol):
        def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...  # one batch, top-k per query
        def resources(self) -> Resources: ...                                   # what it holds once searched
        def close(self) -> None: ...

A retriever is made from an open index version (`IndexVersion`: index.py's `Index`), which holds what every
retriever shares: the manifest, the passages' stores and the id map (a hit's text is read for hits only).
`Index.retriever(name)` makes each one once, on first use, and closes it with the index. A retriever is one
class with one `@register("name")` where it is defined: BM25, dense and `rrf` (their fusion) below;
`retrieval.retriever` and a method's `retriever` parameter then accept its name, and the GPU plan reads its
`resources()` (pipeline/runtime/gpu_plan.py).

`rrf`: BM25 and dense fused by reciprocal rank (Cormack, Clarke and Büttcher, SIGIR 2009). Each query's top
`index.fusion_depth` (at least k) hits of BM25 and of dense search are fused: a passage scores sum over the
lists that hold it of 1 / (`index.rrf_k` + rank), rank counted from 1 (the paper's k = 60); the top k by that
score are returned, ties by passage id. Both searches run as one batch each, on the index's own BM25 and dense
retrievers (opened once, shared with a plain `bm25` or `dense` search).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from indexing.errors import IndexingError
from indexing.search.hits import Hit

if TYPE_CHECKING:
    import numpy as np

    from indexing.settings import IndexSettings
    from indexing.shards.dense import ShardSet
    from indexing.shards.faiss_gpu import IndexPlacement, IndexShape


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


class IndexVersion(Protocol):
    """What a retriever is made from and reads: an open index version (index.py's `Index`)."""

    root: Path
    cfg: IndexSettings
    manifest: dict
    version_dir: Path
    shard_dirs: list[Path]
    analyzer: dict
    faiss_placement: IndexPlacement | None  # where dense search loads FAISS (None: on the CPU)

    def retriever(self, name: str) -> Retriever: ...

    def lookup(self, ids: list[str], score: list[float] | None = None) -> list[Hit | None]: ...

    def hit(self, shard: int, row: int, score: float) -> Hit: ...

    def encode_queries(self, queries: list[str]) -> np.ndarray: ...


Make = Callable[[IndexVersion], Retriever]
RETRIEVERS: dict[str, Make] = {}


def register(name: str) -> Callable[[Make], Make]:
    """Class decorator: the retriever `name`, made from an open index version."""

    def add(make: Make) -> Make:
        RETRIEVERS[name] = make
        return make

    return add


def retriever_names() -> tuple[str, ...]:
    """The registered retrievers."""
    return tuple(RETRIEVERS)


def make_retriever(name: str, index: IndexVersion) -> Retriever:
    """The registered retriever `name` over the open `index`."""
    if name not in RETRIEVERS:
        raise SearchError(f"unknown retriever {name!r}; choose from {', '.join(RETRIEVERS)}")
    return RETRIEVERS[name](index)


@register("bm25")
class BM25:
    """BM25 over the version's Lucene index: one pyserini batch_search (`index.threads` threads) per batch; a
    hit's passage is found by its id (the id map names its shard)."""

    def __init__(self, index: IndexVersion):
        from indexing.shards.sparse import LuceneShard

        self.index = index
        cfg = index.cfg.index
        self.lucene = LuceneShard(
            index.version_dir / index.manifest["bm25"]["path"], cfg.bm25_k1, cfg.bm25_b, index.analyzer
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        from indexing.shards.sparse import batch_search

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

    def __init__(self, index: IndexVersion):
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
                from indexing.shards.dense import load_shards, load_template_quantizer

                i, m = self.index.cfg.index, self.index.manifest
                template = m.get("faiss_template")
                quantizer = load_template_quantizer(self.index.root / template["path"]) if template else None
                self._faiss = load_shards(
                    [d / "faiss.index" for d in self.index.shard_dirs],
                    i.faiss_nprobe,
                    i.faiss_ef_search,
                    quantizer,
                    gpu=self.index.faiss_placement,
                )
        return self._faiss

    def resources(self) -> Resources:
        from indexing.shards.faiss_gpu import IndexShape

        m = self.index.manifest
        shape = IndexShape.from_factory(m["settings"]["faiss_factory"], int(m["dim"]), int(m["passages"]))
        files = sum(int(s["files"].get("faiss.index", {}).get("bytes", 0)) for s in m["shards"])
        return Resources(files, shape)

    def close(self) -> None:
        self._faiss = None


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
    """BM25 and dense fused by reciprocal rank (see the module docstring)."""

    def __init__(self, index: IndexVersion):
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
