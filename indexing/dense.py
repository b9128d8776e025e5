"""Dense shards: one FAISS index per shard, inner product over L2-normalised vectors.

The index type comes from `index.faiss_factory` (`Flat`, `HNSW32`, `IVF1024,PQ64`, ...), built with
`faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)`. `ShardSet` searches all shards together
(`faiss.IndexShards`), which gives exactly the top-k of one index over all vectors when the shards
are Flat.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from indexing.errors import IndexingError

log = logging.getLogger(__name__)


class DenseIndexError(IndexingError):
    """A FAISS index cannot be built with the configured factory string."""


def build_faiss(vectors: np.ndarray, factory: str, out: Path) -> None:
    """Build, train if needed, fill and write one shard's FAISS index."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    d = vectors.shape[1]
    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise DenseIndexError(f"index.faiss_factory={factory!r} is not a valid FAISS factory string: {exc}") from None
    if not index.is_trained:
        try:
            index.train(vectors)
        except RuntimeError as exc:
            raise DenseIndexError(
                f"cannot train {factory!r} on a shard of {len(vectors)} vectors ({str(exc).splitlines()[0]}); "
                "use fewer lists/centroids or a larger index.shard_size"
            ) from None
    index.add(vectors)
    tmp = out.with_name(out.name + ".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(out)


def load_faiss(path: Path, nprobe: int, ef_search: int):
    import faiss

    index = faiss.read_index(str(path))
    params = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        try:
            params.set_index_parameter(index, name, value)
        except RuntimeError:
            pass  # this index type has no such parameter
    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
        index = faiss.index_cpu_to_all_gpus(index)
    return index


class ShardSet:
    """All shards' FAISS indexes searched as one `faiss.IndexShards` (threaded; ids numbered shard after
    shard), each hit mapped back to (shard, row). With Flat shards the top-k equals one index's over all
    vectors."""

    def __init__(self, indexes: list):
        import faiss

        self.offsets = np.cumsum([0] + [ix.ntotal for ix in indexes])
        self.shards = faiss.IndexShards(indexes[0].d, True, True) if indexes else None
        for ix in indexes:
            self.shards.add_shard(ix)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores, shard, row), each (n_queries, k'); k' <= k, padded with shard -1."""
        k = min(k, int(self.offsets[-1]))
        if k == 0:
            empty = np.zeros((len(queries), 0))
            return empty, empty.astype(int), empty.astype(int)
        S, ids = self.shards.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        shard = np.searchsorted(self.offsets, ids, side="right") - 1
        shard = np.where(ids >= 0, shard, -1)
        return S, shard, np.where(ids >= 0, ids - self.offsets[np.maximum(shard, 0)], -1)
