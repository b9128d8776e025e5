"""Dense shards: one FAISS index per shard, inner product over L2-normalised vectors.

The index type comes from `index.faiss_factory` (`Flat`, `HNSW32`, `IVF1024,PQ64`, ...), built with
`faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)`. Searching all shards and merging their
top-k by score (ties broken by shard order, then row) gives exactly the top-k of one index over
all vectors when the shards are Flat.
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


def search_shards(indexes: list, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One FAISS search per shard over all queries, merged exactly.

    Returns (scores, shard_idx, row), each (n_queries, k'); k' <= k, padded with shard -1.
    """
    nq = len(queries)
    all_s, all_sh, all_r = [], [], []
    for si, index in enumerate(indexes):
        kk = min(k, index.ntotal)
        if kk == 0:
            continue
        D, I = index.search(np.ascontiguousarray(queries, dtype=np.float32), kk)
        all_s.append(D)
        all_sh.append(np.where(I >= 0, si, -1))
        all_r.append(I)
    if not all_s:
        empty = np.zeros((nq, 0))
        return empty, empty.astype(int), empty.astype(int)
    S, SH, R = np.hstack(all_s), np.hstack(all_sh), np.hstack(all_r)
    S = np.where(SH < 0, -np.inf, S)
    # sort by score desc, then shard, then row: deterministic and equal to one index's order
    order = np.lexsort((R, SH, -S), axis=-1)[:, :k]
    take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
    return take(S), take(SH), take(R)
