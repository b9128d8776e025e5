"""Dense shards: one FAISS index per shard, inner product over L2-normalised vectors.

The index type comes from `index.faiss_factory`, built with `faiss.index_factory(d, factory,
METRIC_INNER_PRODUCT)`. `Flat` (the default; exact) and `HNSW32` are built per shard. An IVF factory
(`IVF4096,PQ64`, `IVF4096,SQ8`, ...) is trained once, on a sample of the corpus, into a template
(`train_template`): every shard is a copy of it filled with its own vectors, written without the
coarse quantizer, which the reader attaches from the template (`load_faiss`), so the quantizer is on
disk and in memory once and the PQ/SQ codebooks are the same in every shard. `ShardSet` searches all
shards together: `faiss.IndexShards` (Flat: exactly the top-k of one index over all vectors) or, for
IVF, `faiss.IndexShardsIVF`, which assigns each query to its lists once for all shards (equal to one
IVF index over all vectors built from the same template). On a GPU (a replica's plan placed it there,
`indexing.faiss_gpu`) the shards become one merged index, cloned once; without a plan nothing goes to a GPU.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from indexing.errors import IndexingError
from indexing.faiss_gpu import FaissGpuMover, GpuMover, IndexPlacement

log = logging.getLogger(__name__)


class DenseIndexError(IndexingError):
    """A FAISS index cannot be built with the configured factory string."""


def is_ivf(factory: str) -> bool:
    """Whether shards of this factory share one trained template (an IVF coarse quantizer)."""
    return "IVF" in factory


def _factory(d: int, factory: str) -> Any:
    import faiss

    try:
        return faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise DenseIndexError(f"index.faiss_factory={factory!r} is not a valid FAISS factory string: {exc}") from None


def _train(index: Any, vectors: np.ndarray, what: str) -> None:
    try:
        index.train(vectors)
    except RuntimeError as exc:
        raise DenseIndexError(
            f"cannot train {what} ({str(exc).splitlines()[0]}); "
            "use fewer lists/centroids or more training vectors (index.faiss_train_size)"
        ) from None


def _write(index: Any, out: Path) -> None:
    import faiss

    tmp = out.with_name(out.name + ".tmp")
    faiss.write_index(index, str(tmp))
    tmp.replace(out)


def train_template(vectors: np.ndarray, factory: str, out: Path) -> None:
    """Train an empty index of `factory` on `vectors` (a sample of the corpus) and write it to `out`."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = _factory(vectors.shape[1], factory)
    _train(index, vectors, f"{factory!r} on {len(vectors)} vectors")
    _write(index, out)


_TEMPLATES: dict[tuple, object] = {}  # the template last read by this process: (path, size, mtime) -> index
_TEMPLATES_LOCK = threading.Lock()


def _template(path: Path) -> Any:
    """The trained template at `path`, read from disk once per process (a build fills every shard from
    one); callers copy it (`faiss.clone_index`), never change it."""
    import faiss

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _TEMPLATES_LOCK:
        if key not in _TEMPLATES:
            _TEMPLATES.clear()
            _TEMPLATES[key] = faiss.read_index(str(path))
        return _TEMPLATES[key]


def build_faiss(vectors: np.ndarray, factory: str, out: Path, template: Path | None = None) -> None:
    """Build and write one shard's FAISS index: a copy of the trained `template` (its coarse quantizer
    left out of the file) or, without one, an index of `factory` trained on the shard if it needs it."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if template is not None:
        index = faiss.clone_index(_template(template))
        index.add(vectors)
        ivf = faiss.extract_index_ivf(index)
        quantizer, stand_in = ivf.quantizer, faiss.IndexFlatIP(ivf.d)
        ivf.quantizer, ivf.own_fields = stand_in, False  # written empty: load_faiss attaches the template's
        try:
            _write(index, out)
        finally:
            ivf.quantizer, ivf.own_fields = quantizer, True  # the copy's own quantizer goes with it
        return
    index = _factory(vectors.shape[1], factory)
    if not index.is_trained:
        _train(index, vectors, f"{factory!r} on a shard of {len(vectors)} vectors")
    index.add(vectors)
    _write(index, out)


def load_template_quantizer(path: Path) -> Any:
    """The coarse quantizer of a trained template, to be shared by every shard (kept alive by the caller)."""
    import faiss

    template = faiss.read_index(str(path))
    ivf = faiss.extract_index_ivf(template)
    ivf.own_fields = False  # the quantizer outlives the template
    return ivf.quantizer


def load_faiss(path: Path, nprobe: int, ef_search: int, quantizer: Any = None) -> Any:
    import faiss

    index = faiss.read_index(str(path))
    if quantizer is not None:
        ivf = faiss.extract_index_ivf(index)
        ivf.quantizer, ivf.own_fields = quantizer, False
    params = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        try:
            params.set_index_parameter(index, name, value)
        except RuntimeError:
            pass  # this index type has no such parameter
    return index


def merged_ivf(indexes: list, consume: bool = False) -> Any:
    """One IVF index holding the inverted lists of every shard (all filled from one template, so their lists
    agree), ids numbered shard after shard as in a ShardSet: what a GPU searches, as faiss's IndexShardsIVF
    does not run there. The shards are left as they were (their copies are merged), or with `consume` the
    first shard becomes the merged index and the others are emptied into it (merge_from moves the lists), so
    the shards and a merged copy are never held at once."""
    import faiss

    merged = indexes[0] if consume else faiss.clone_index(indexes[0])
    ivf = faiss.extract_index_ivf(merged)
    for ix in indexes[1:]:
        source = ix if consume else faiss.clone_index(ix)  # kept referenced: the extracted IVF is a view of it
        ivf.merge_from(faiss.extract_index_ivf(source), ivf.ntotal)
    merged.ntotal = ivf.ntotal  # a wrapper (e.g. a pre-transform) counts its inner index's vectors
    return merged


def merged_flat(indexes: list) -> Any:
    """One flat index of every shard's vectors in shard order, each shard emptied once copied."""
    import faiss

    merged = faiss.IndexFlat(indexes[0].d, indexes[0].metric_type)
    for ix in indexes:
        merged.add(ix.reconstruct_n(0, ix.ntotal))
        ix.reset()
    return merged


class ShardSet:
    """All shards' FAISS indexes searched as one (threaded; ids numbered shard after shard), each hit
    mapped back to (shard, row): `faiss.IndexShards`, or `faiss.IndexShardsIVF` over the shared
    `quantizer` of IVF shards. With Flat shards the top-k equals one index's over all vectors.
    With a `gpu` placement on the GPU (a replica's GPU plan) the shards are merged into one index (`merged_ivf`,
    `merged_flat`; the shards emptied into it) and `mover` clones that index once; `merge=True` merges IVF shards
    on the CPU (tests: same hits)."""

    def __init__(
        self,
        indexes: list,
        quantizer: Any = None,
        nprobe: int = 1,
        merge: bool = False,
        gpu: IndexPlacement | None = None,
        mover: GpuMover | None = None,
    ):
        import faiss

        self.offsets = np.cumsum([0] + [ix.ntotal for ix in indexes])
        self.params = None
        self._quantizer = quantizer  # shared by the shards (and a merged index made of them), owned by none
        if gpu is not None and gpu.on_gpu and indexes:
            if quantizer is None and not isinstance(indexes[0], faiss.IndexFlat):
                raise DenseIndexError(f"a {type(indexes[0]).__name__} index cannot be placed on a GPU")
            merged = merged_flat(indexes) if quantizer is None else merged_ivf(indexes, consume=True)
            if quantizer is not None:
                faiss.extract_index_ivf(merged).nprobe = min(nprobe, quantizer.ntotal)  # the GPU copy takes it
            self._mover = mover or FaissGpuMover()  # holds the GPU resources the index allocates through
            self.shards = self._mover.to_gpu(merged, gpu)
            self._indexes = [self.shards]
            return
        if quantizer is not None and indexes and merge:
            merged = merged_ivf(indexes)
            faiss.extract_index_ivf(merged).nprobe = min(nprobe, quantizer.ntotal)
            self.shards, self._indexes = merged, [merged]
            return
        if quantizer is not None:
            nprobe = min(nprobe, quantizer.ntotal)  # more probes than lists misaligns IndexShardsIVF's assignments
            for ix in indexes:
                faiss.extract_index_ivf(ix).nprobe = nprobe  # it checks that each shard's equals the search's
            self.shards = faiss.IndexShardsIVF(quantizer, quantizer.ntotal, True, True)
            # faiss's stub lacks the keyword arguments its Python wrapper adds to SearchParameters classes
            self.params = faiss.SearchParametersIVF(nprobe=nprobe)  # type: ignore[call-arg]
        else:
            # faiss's stub has only IndexShards(d); the SWIG class also takes (d, threaded, successive_ids)
            self.shards = faiss.IndexShards(indexes[0].d, True, True) if indexes else None  # type: ignore[call-arg]
        for ix in indexes:
            self.shards.add_shard(ix)
        self._indexes = indexes  # the Python wrappers own the shards IndexShards points to

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores, shard, row), each (n_queries, k'); k' <= k, padded with shard -1."""
        k = min(k, int(self.offsets[-1]))
        if k == 0:
            empty = np.zeros((len(queries), 0))
            return empty, empty.astype(int), empty.astype(int)
        S, ids = self.shards.search(np.ascontiguousarray(queries, dtype=np.float32), k, params=self.params)
        shard = np.searchsorted(self.offsets, ids, side="right") - 1
        shard = np.where(ids >= 0, shard, -1)
        return S, shard, np.where(ids >= 0, ids - self.offsets[np.maximum(shard, 0)], -1)
