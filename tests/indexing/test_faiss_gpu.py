"""The FAISS half of the GPU plan, on the CPU: index shapes and their GPU bytes, where the index goes, and the
one clone a GPU placement makes (a fake mover records what faiss-gpu would be given)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from test_indexing_dense import faiss_shard_set, ivf_shards, unit

from indexing.shards.dense import DenseIndexError, ShardSet, build_faiss, load_faiss
from indexing.shards.faiss_gpu import GiB, IndexPlacement, IndexShape, gpu_index_bytes, place_index

DPR = 21_015_324  # passages of the DPR Wikipedia dump


class FakeMover:
    """Records each clone and returns the CPU index itself, so searches still run."""

    def __init__(self):
        self.calls = []

    def to_gpu(self, index, placement):
        self.calls.append((index, placement, index.ntotal))
        return index


def test_shapes_from_factories_and_their_bytes_per_vector():
    """Bytes per vector from faiss's wiki table (Flat 4d, IVF-Flat 4d+8, IVF-SQ8 d+8, IVF-PQ M+8) plus the
    quantizer and PQ centroids."""
    n, d = 1000, 768
    assert gpu_index_bytes(IndexShape.from_factory("Flat", d, n)) == n * 4 * d
    assert gpu_index_bytes(IndexShape.from_factory("Flat", d, n), float16=True) == n * 2 * d
    pq = IndexShape.from_factory("IVF4096,PQ64", d, n)
    assert (pq.kind, pq.nlist, pq.pq_m, pq.code_bytes) == ("ivf-pq", 4096, 64, 64)
    assert gpu_index_bytes(pq) == n * (64 + 8) + 4096 * d * 4 + 256 * d * 4
    sq = IndexShape.from_factory("IVF16,SQ8", d, n)
    assert gpu_index_bytes(sq) == n * (d + 8) + 16 * 32 * d + 16 * d * 4  # + lists padded to 32 vectors
    assert IndexShape.from_factory("IVF16,Flat", d, n).kind == "ivf-flat"
    assert IndexShape.from_factory("HNSW32", d, n).kind == "hnsw"
    assert IndexShape.from_factory("OPQ64,IVF4096,PQ64", d, n).kind == "other"
    assert IndexShape.from_factory("IVF4096,PQ64np", d, n) == pq  # no polysemous training: the same index
    assert IndexShape.from_factory("IVF4096,PQ64x4fs", d, n).kind == "other"  # fast-scan: not on a GPU


def test_index_placement_rules():
    """PQ64 needs float16 lookup tables (64 x 256 x 4 bytes > 48 KiB), PQ32 not; Flat is float32 when that fits,
    float16 when only that fits, else CPU; HNSW and unsupported PQ sizes stay on the CPU."""
    room, total = 10 * GiB, 80 * GiB
    assert place_index(IndexShape.from_factory("IVF4096,PQ64", 768, DPR), room, total).use_float16
    pq32 = place_index(IndexShape.from_factory("IVF4096,PQ32", 768, DPR), room, total)
    assert pq32.on_gpu and not pq32.use_float16
    assert not place_index(IndexShape.from_factory("IVF4096,PQ80", 768, 1000), room, total).on_gpu
    assert not place_index(IndexShape.from_factory("IVF4096,PQ64x4", 768, 1000), room, total).on_gpu
    small = place_index(IndexShape.from_factory("Flat", 768, 2_000_000), room, total)
    assert small.on_gpu and not small.use_float16 and small.scratch_bytes == 3 * GiB // 2
    half = place_index(IndexShape.from_factory("Flat", 768, 3_000_000), room, total)  # 8.6 GiB in float32
    assert half.on_gpu and half.use_float16 and half.gpu_bytes == 3_000_000 * 768 * 2
    assert not place_index(IndexShape.from_factory("Flat", 768, 6_000_000), room, total).on_gpu
    hnsw = place_index(IndexShape.from_factory("HNSW32", 768, 1000), room, total)
    assert not hnsw.on_gpu and "HNSW" in hnsw.reason


GPU = IndexPlacement(True, "test", gpu_bytes=1, scratch_bytes=2, use_float16=True)


def test_ivf_shards_cloned_once_as_one_merged_index(tmp_path):
    """A GPU placement clones one merged index holding every shard's lists, with the plan's options, the shards
    emptied into it; searches return faiss's CPU shard set's hits."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 2400)
    quantizer, shards, parts = ivf_shards(tmp_path, vecs, "IVF16,SQ8", 3)  # SQ8 trains in a blink; PQ alike
    queries = unit(rng, 40)
    D, ids = faiss_shard_set(shards, quantizer, 4, queries, 10)
    mover = FakeMover()
    on_gpu = ShardSet(shards, quantizer, nprobe=4, gpu=GPU, mover=mover)
    assert len(mover.calls) == 1
    index, placement, ntotal = mover.calls[0]
    assert placement is GPU and ntotal == len(vecs) and faiss.extract_index_ivf(index).nprobe == 4
    assert index is shards[0] and [s.ntotal for s in shards[1:]] == [0, 0]  # no copy beside the shards
    S2, SH2, R2 = on_gpu.search(queries, k=10)
    np.testing.assert_allclose(S2, D, rtol=1e-5)
    np.testing.assert_array_equal(on_gpu.offsets[SH2] + R2, ids)


def test_flat_shards_cloned_once_and_nothing_cloned_on_the_cpu(tmp_path):
    """Flat shards become one IndexFlat of all vectors, cloned once; without a GPU placement (a plan that keeps
    the index on the CPU, or no plan) the mover is never called and the shard set is faiss's IndexShards,
    searching the shards one after another."""
    rng = np.random.default_rng(0)
    parts = [unit(rng, n) for n in (50, 130, 7)]

    def shards():
        for i, p in enumerate(parts):
            build_faiss(p, "Flat", tmp_path / f"{i}.index")
        return [load_faiss(tmp_path / f"{i}.index", 1, 16) for i in range(len(parts))]

    queries = unit(rng, 25)
    mover = FakeMover()
    for placement in (None, IndexPlacement(False, "does not fit")):
        cpu = ShardSet(shards(), gpu=placement, mover=mover)
        assert isinstance(cpu.shards, faiss.IndexShards) and mover.calls == []
    S, SH, R = cpu.search(queries, k=20)
    on_gpu = ShardSet(shards(), gpu=GPU, mover=mover)
    assert len(mover.calls) == 1 and isinstance(mover.calls[0][0], faiss.IndexFlat)
    assert mover.calls[0][2] == sum(len(p) for p in parts)
    S2, SH2, R2 = on_gpu.search(queries, k=20)
    np.testing.assert_allclose(S2, S, rtol=1e-6)
    np.testing.assert_array_equal(SH2, SH)
    np.testing.assert_array_equal(R2, R)


def test_hnsw_never_cloned(tmp_path):
    """The plan keeps HNSW on the CPU, so no clone; a GPU placement forced on HNSW shards is refused."""
    rng = np.random.default_rng(1)
    build_faiss(unit(rng, 300), "HNSW16", tmp_path / "h.index")
    placement = place_index(IndexShape.from_factory("HNSW16", 32, 300), 10 * GiB, 80 * GiB)
    mover = FakeMover()
    ShardSet([load_faiss(tmp_path / "h.index", 1, 16)], gpu=placement, mover=mover)
    assert mover.calls == []
    with pytest.raises(DenseIndexError, match="cannot be placed on a GPU"):
        ShardSet([load_faiss(tmp_path / "h.index", 1, 16)], gpu=GPU, mover=mover)
    assert mover.calls == []
