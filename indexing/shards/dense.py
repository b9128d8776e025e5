"""Dense shards: one FAISS index per shard, inner product over L2-normalised vectors.

The index type comes from `index.faiss_factory`, built with `faiss.index_factory(d, factory,
METRIC_INNER_PRODUCT)`. `Flat` (the default; exact) and `HNSW32` are built per shard. An IVF factory
(`IVF4096,PQ64`, `IVF4096,SQ8`, ...) is trained once, on a sample of the corpus, into a template
(`train_template`): every shard is a copy of it filled with its own vectors, written without the
coarse quantizer, which the reader attaches from the template (`load_faiss`), so the quantizer is on
disk and in memory once and the PQ/SQ codebooks are the same in every shard.

`ShardSet` searches all shards together with a number of threads that does not grow with the shard count
(faiss's threaded shard sets ran one thread, with its own scratch, per shard: ~420 at 21M passages).
IVF shards are merged at load into one IVF index of all their inverted lists (`merged_ivf`: each shard
moved into the first as it is read, so shards and copy are never both held), searched with FAISS's
OpenMP threads; its top-k is that of one IVF index over all vectors built from the same template.
Flat and HNSW shards are searched one after another (a non-threaded `faiss.IndexShards`, each search
using FAISS's threads; a batch's per-shard top-k lists, n x k each, are held until merged); Flat gives
exactly the top-k of one index over all vectors. On a GPU (a
replica's plan placed it there, `indexing.shards.faiss_gpu`) the merged index is cloned once (Flat shards are
merged into one flat index first); without a plan nothing goes to a GPU.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from indexing.errors import IndexingError
from indexing.shards.faiss_gpu import FaissGpuMover, GpuMover, IndexPlacement

log = logging.getLogger(__name__)


class DenseIndexError(IndexingError):
    """A FAISS index cannot be built with the configured factory string."""


def is_ivf(factory: str) -> bool:
    """Whether shards of this factory share one trained template (an IVF coarse quantizer)."""
    return "IVF" in factory


def _factory(d: int, factory: str) -> Any:
    """An empty index of `factory`. An IVF-PQ index skips faiss's polysemous training (Douze et al., "Polysemous
    codes", ECCV 2016: it reorders each sub-quantizer's centroids for Hamming filtering, `polysemous_ht`, which
    dynrag never sets): the same distances and top-k; training an IVF16,PQ8 on 1,000 vectors took 17.6 CPU-s with
    it, 0.16 without. The factory's `np` suffix does the same."""
    import faiss

    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise DenseIndexError(f"index.faiss_factory={factory!r} is not a valid FAISS factory string: {exc}") from None
    ivf: Any = faiss.try_extract_index_ivf(index)
    ivf = faiss.downcast_index(ivf) if ivf is not None else None
    if hasattr(ivf, "do_polysemous_training"):
        ivf.do_polysemous_training = False
    return index


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


def faiss_dim(f: BinaryIO) -> int:
    """The dimension of the FAISS index in the file `f` (local or fsspec) from its first bytes: every index
    file starts with a 4-byte type code and then `d` as an int32 (faiss's write_index_header)."""
    head = f.read(8)
    if len(head) < 8:
        raise IndexingError(f"{getattr(f, 'name', 'a FAISS file')} is too short to be a FAISS index")
    return int.from_bytes(head[4:8], "little", signed=True)


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


def ivf_list_sizes(paths: Iterable[Path]) -> np.ndarray | None:
    """The length of each inverted list summed over the IVF shard files at `paths`, read from their headers:
    each file is opened memory-mapped (`IO_FLAG_MMAP`: its lists stay on disk) and its per-list sizes copied
    from faiss's on-disk list table in one call (a call per list costs 0.5 us: 14 s over 421 shards of
    65,536 lists), checked against the shard's vector count. None for lists faiss does not map that way
    (fast-scan's blocks)."""
    import faiss

    total = None
    for path in paths:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
        ivf: Any = faiss.extract_index_ivf(index)  # Any: faiss's stub lacks SWIG's vector methods used below
        if not isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists):
            return None
        lists: Any = faiss.downcast_InvertedLists(ivf.invlists)
        table: np.ndarray = np.empty((lists.nlist, 3), dtype=np.uint64)  # OnDiskOneList: size, capacity, offset
        faiss.memcpy(faiss.swig_ptr(table), lists.lists.data(), table.nbytes)
        if int(table[:, 0].sum()) != ivf.ntotal:  # another faiss layout: ask list by list
            table[:, 0] = [lists.list_size(i) for i in range(lists.nlist)]
        total = table[:, 0].copy() if total is None else total + table[:, 0]
    return total


def merged_ivf(indexes: Iterable, list_sizes: np.ndarray | None = None) -> Any:
    """One IVF index holding the inverted lists of every shard (all filled from one template, so their lists
    agree), ids numbered shard after shard: the first shard becomes the merged index and each shard is moved
    into it (merge_from) and dropped, so with shards loaded one at a time (a generator) the shards and a merged
    copy are never held at once. With `list_sizes` (ivf_list_sizes of the shards) each merged list is
    allocated once at its final length; without, lists grow as shards arrive and end up to twice as large
    as their contents (measured: +45% over 421 shards)."""
    import faiss

    shards = iter(indexes)
    merged = next(shards)
    ivf: Any = faiss.extract_index_ivf(merged)  # faiss's stub: optional lists, no SWIG `this`
    if list_sizes is not None:
        lists: Any = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
        for i in np.flatnonzero(list_sizes):
            lists.resize(int(i), int(list_sizes[i]))  # allocated at the final size, then emptied: capacity stays
            lists.resize(int(i), 0)
        lists.merge_from(ivf.invlists, 0)
        ivf.replace_invlists(lists, True)  # frees the first shard's own lists
        lists.this.disown()  # now the index's
    for ix in shards:
        ivf.merge_from(faiss.extract_index_ivf(ix), ivf.ntotal)
    merged.ntotal = ivf.ntotal  # a wrapper (e.g. a pre-transform) counts its inner index's vectors
    return merged


def fast_scan(index: Any) -> Any:
    """An IVF-PQ index of 4-bit codes (`PQ{M}x4`) in faiss's fast-scan layout: lists in blocks of 32 codes whose
    distances are looked up in SIMD registers (faiss wiki "Fast accumulation of PQ and AQ codes (FastScan)").
    Measured here on 200k vectors at 384-d, nprobe 32: 35,259 queries/s against 3,227 plain and 10,626 for
    PQ64's 8-bit codes; recall@10 against exact search 0.541 (both 4-bit) vs 0.549. Shards are stored plain:
    faiss crashes merging fast-scan lists (BlockInvertedLists::add_entries, seen merging 20 shards), so the
    merged index is converted: the codes repacked into a copy (twice their memory while it is made); the plain
    index is dropped when its quantizer is not its own (shards filled from a shared template). Any other index
    is returned as it is."""
    import faiss

    if type(index) is not faiss.IndexIVFPQ or index.pq.nbits != 4 or index.pq.M % 2:
        return index
    converted = faiss.IndexIVFPQFastScan(index)
    if not index.own_fields:  # the quantizer is the caller's (a shared template's): the plain index can go
        converted.referenced_objects = []  # type: ignore[attr-defined]  # faiss's wrapper kept it alive (its codes)
    return converted


def merged_flat(indexes: Iterable) -> Any:
    """One flat index of every shard's vectors in shard order, each shard emptied once copied."""
    import faiss

    merged = None
    for ix in indexes:
        if merged is None:
            merged = faiss.IndexFlat(ix.d, ix.metric_type)
        merged.add(ix.reconstruct_n(0, ix.ntotal))
        ix.reset()
    return merged


class ShardSet:
    """All shards' FAISS indexes searched as one (ids numbered shard after shard), each hit mapped back to
    (shard, row), with threads that do not grow in number with the shards. The set takes the
    indexes it is given (a list or, better, a generator that loads them one at a time): IVF shards, on the CPU
    as on a GPU, become one index of all their lists (`merged_ivf`, over the shared `quantizer`; the same
    top-k as faiss's IndexShardsIVF or one IVF index over all vectors from the template), searched with
    FAISS's own OpenMP threads. Flat and HNSW shards are searched one after another by a non-threaded
    `faiss.IndexShards` (each shard's search uses FAISS's threads; Flat: exactly the top-k of one index over
    all vectors). With a `gpu` placement on the GPU (a replica's GPU plan) Flat shards become one flat index
    (`merged_flat`) and `mover` clones the merged index once. `list_sizes`: see `merged_ivf`."""

    def __init__(
        self,
        indexes: Iterable,
        quantizer: Any = None,
        nprobe: int = 1,
        gpu: IndexPlacement | None = None,
        mover: GpuMover | None = None,
        list_sizes: np.ndarray | None = None,
    ):
        import faiss

        sizes: list[int] = []

        def sized(shards: Iterable) -> Iterator[Any]:  # each shard's size, taken before it is merged
            for ix in shards:
                sizes.append(ix.ntotal)
                yield ix

        shards = iter(indexes)
        first = next(shards, None)
        on_gpu = gpu is not None and gpu.on_gpu
        self.shards: Any
        if first is None:
            self.shards, self._indexes = None, []
        elif quantizer is not None:
            merged = merged_ivf(sized(itertools.chain([first], shards)), list_sizes)
            first = None  # the merged index itself (merged_ivf fills the first shard): `merged` is its one holder
            if not on_gpu:
                from indexing.shards.native_memory import release_free_memory

                merged = fast_scan(merged)
                release_free_memory()  # the plain lists' pages, freed as `merged` moved on
            faiss.extract_index_ivf(merged).nprobe = min(nprobe, quantizer.ntotal)  # a GPU copy takes it too
            self.shards, self._indexes = merged, [merged]
        elif on_gpu:
            if not isinstance(first, faiss.IndexFlat):
                raise DenseIndexError(f"a {type(first).__name__} index cannot be placed on a GPU")
            merged = merged_flat(sized(itertools.chain([first], shards)))
            self.shards, self._indexes = merged, [merged]
        else:
            # faiss's stub has only IndexShards(d); the SWIG class also takes (d, threaded, successive_ids)
            self.shards = faiss.IndexShards(first.d, False, True)  # type: ignore[call-arg]
            self._indexes = list(sized(itertools.chain([first], shards)))  # the wrappers own what it points to
            for ix in self._indexes:
                self.shards.add_shard(ix)
        self.offsets = np.cumsum([0] + sizes)
        self._quantizer = quantizer  # shared by the shards (and so the merged index), owned by none
        if gpu is not None and on_gpu and self.shards is not None:
            self._mover = mover or FaissGpuMover()  # holds the GPU resources the index allocates through
            self.shards = self._mover.to_gpu(self.shards, gpu)
            self._indexes = [self.shards]

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


def load_shards(
    paths: list[Path], nprobe: int, ef_search: int, quantizer: Any = None, gpu: IndexPlacement | None = None
) -> ShardSet:
    """The ShardSet of the shard index files at `paths`, read one at a time (IVF shards merged as they are
    read, into lists sized beforehand from the files' headers)."""
    sizes = ivf_list_sizes(paths) if quantizer is not None else None
    shards = (load_faiss(p, nprobe, ef_search, quantizer) for p in paths)
    return ShardSet(shards, quantizer, nprobe, gpu=gpu, list_sizes=sizes)
