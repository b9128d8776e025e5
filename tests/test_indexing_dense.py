"""FAISS shards searched together (faiss.IndexShards): exact for Flat shards, other factory strings, bad settings (random vectors)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from indexing.dense import DenseIndexError, ShardSet, build_faiss, load_faiss, load_template_quantizer, train_template


def unit(rng, n, d=32):
    v = rng.standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_flat_shards_merge_equals_one_index(tmp_path):
    rng = np.random.default_rng(0)
    parts = [unit(rng, n) for n in (50, 130, 7, 90)]
    shards = []
    for i, p in enumerate(parts):
        build_faiss(p, "Flat", tmp_path / f"{i}.index")
        shards.append(load_faiss(tmp_path / f"{i}.index", 1, 16))
    queries = unit(rng, 25)
    S, SH, R = ShardSet(shards).search(queries, k=20)
    one = faiss.IndexFlatIP(32)
    one.add(np.vstack(parts))
    D, I = one.search(queries, 20)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    np.testing.assert_array_equal(offsets[SH] + R, I)
    np.testing.assert_allclose(S, D, rtol=1e-6)
    # k larger than the corpus: everything, once
    S, SH, R = ShardSet(shards).search(queries[:2], k=1000)
    assert S.shape[1] == sum(len(p) for p in parts) and len(set(zip(SH[0], R[0]))) == S.shape[1]


@pytest.mark.parametrize("factory", ["HNSW16", "IVF4,Flat", "IVF4,PQ8x4"])
def test_other_factories_find_near_neighbours(tmp_path, factory):
    rng = np.random.default_rng(1)
    vecs = unit(rng, 600)
    build_faiss(vecs, factory, tmp_path / "x.index")
    index = load_faiss(tmp_path / "x.index", nprobe=4, ef_search=64)
    S, SH, R = ShardSet([index]).search(vecs[:20], k=5)
    hit = np.mean(R[:, 0] == np.arange(20))  # a stored vector finds itself first
    assert hit >= (0.8 if "PQ" in factory else 0.95)


def test_bad_factory_and_untrainable_shard(tmp_path):
    rng = np.random.default_rng(2)
    with pytest.raises(DenseIndexError, match="not a valid FAISS factory"):
        build_faiss(unit(rng, 10), "NoSuchIndex", tmp_path / "a.index")
    with pytest.raises(DenseIndexError, match="cannot train 'IVF64,Flat' on a shard of 10 vectors"):
        build_faiss(unit(rng, 10), "IVF64,Flat", tmp_path / "b.index")


def ivf_shards(tmp_path, vecs, factory: str, n: int) -> tuple:
    """A template trained on every third vector, `n` shards filled from it: (quantizer, shards, parts)."""
    template = tmp_path / "template.index"
    train_template(vecs[::3], factory, template)
    parts = np.array_split(vecs, n)
    for i, p in enumerate(parts):
        build_faiss(p, factory, tmp_path / f"{i}.index", template)
    quantizer = load_template_quantizer(template)
    shards = [load_faiss(tmp_path / f"{i}.index", nprobe=4, ef_search=16, quantizer=quantizer) for i in range(n)]
    return quantizer, shards, parts


def test_ivf_shards_share_one_trained_quantizer_and_equal_one_index(tmp_path):
    """Shards filled from one trained template hold no quantizer of their own; searched together they
    return what one index over all vectors, from the same template, returns."""
    rng = np.random.default_rng(3)
    vecs = unit(rng, 3000)
    quantizer, shards, parts = ivf_shards(tmp_path, vecs, "IVF16,PQ8", 4)
    for i in range(4):
        assert faiss.extract_index_ivf(faiss.read_index(str(tmp_path / f"{i}.index"))).quantizer.ntotal == 0
    template = tmp_path / "template.index"
    S, SH, R = ShardSet(shards, quantizer, nprobe=40).search(vecs[:50], k=10)  # 40 > 16 lists: clamped
    one = faiss.read_index(str(template))
    one.add(vecs)
    one.nprobe = 16
    D, I = one.search(vecs[:50], 10)
    np.testing.assert_allclose(S, D, rtol=1e-5)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    assert np.mean(offsets[SH] + R == I) > 0.99  # equal up to ties of equal PQ codes
    assert np.mean(R[:, 0] + offsets[SH[:, 0]] == np.arange(50)) >= 0.8  # a stored vector finds itself


@pytest.mark.parametrize("factory", ["IVF16,PQ8", "IVF16,SQ8"])
def test_ivf_shards_probing_some_lists_equal_one_index(tmp_path, factory):
    """nprobe 4 of 16 lists: each query is assigned to its 4 lists once, by the shared quantizer, and every
    shard scans just those lists, so the top-k equals one index's over all vectors with the same nprobe
    (and differs from probing every list)."""
    rng = np.random.default_rng(4)
    vecs = unit(rng, 3000)
    quantizer, shards, parts = ivf_shards(tmp_path, vecs, factory, 3)
    template = tmp_path / "template.index"
    queries = unit(rng, 60)  # not stored vectors: their neighbours spread over several lists
    S, SH, R = ShardSet(shards, quantizer, nprobe=4).search(queries, k=10)
    one = faiss.read_index(str(template))
    one.add(vecs)
    one.nprobe = 4
    D, I = one.search(queries, 10)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    np.testing.assert_allclose(S, D, rtol=1e-5)
    assert np.mean(offsets[SH] + R == I) > 0.99  # equal up to ties of equal codes
    one.nprobe = 16
    D_all, I_all = one.search(queries, 10)
    assert not np.array_equal(I, I_all)  # 4 lists are not all lists: the case is a partial probe


def test_build_faiss_reads_the_template_once_and_leaves_it_unchanged(tmp_path, monkeypatch):
    """A build fills many shards from one template: it is read from disk once per process, each shard gets
    a copy (the shared one stays empty), and a retrained template (new file) is read again."""
    import indexing.dense as dense

    rng = np.random.default_rng(5)
    vecs = unit(rng, 1200)
    template = tmp_path / "template.index"
    train_template(vecs[::2], "IVF8,SQ8", template)
    reads = []
    real_read = faiss.read_index
    monkeypatch.setattr(faiss, "read_index", lambda p, *a: reads.append(p) or real_read(p, *a))
    for i, part in enumerate(np.array_split(vecs, 3)):
        build_faiss(part, "IVF8,SQ8", tmp_path / f"{i}.index", template)
    assert reads.count(str(template)) == 1
    assert dense._template(template).ntotal == 0
    for i in range(3):
        assert real_read(str(tmp_path / f"{i}.index")).ntotal == 400
    train_template(vecs[1::2], "IVF8,SQ8", template)
    build_faiss(vecs[:10], "IVF8,SQ8", tmp_path / "again.index", template)
    assert reads.count(str(template)) == 2


def test_ivf_shards_merged_for_a_gpu_search_as_the_shard_set_does(tmp_path):
    """The GPU path (IVF shards merged into one index, since IndexShardsIVF does not run on a GPU), taken on the
    CPU: the same scores and (shard, row) hits as the shard set, and the shards themselves stay unchanged."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 2400)
    quantizer, shards, parts = ivf_shards(tmp_path, vecs, "IVF16,PQ8", 3)
    queries = unit(rng, 40)
    S, SH, R = ShardSet(shards, quantizer, nprobe=4).search(queries, k=10)
    S2, SH2, R2 = ShardSet(shards, quantizer, nprobe=4, merge=True).search(queries, k=10)
    np.testing.assert_allclose(S2, S, rtol=1e-5)
    assert np.mean((SH2 == SH) & (R2 == R)) > 0.99  # equal up to ties of equal codes
    assert [s.ntotal for s in shards] == [len(p) for p in parts]
    # nprobe reaches the merged index: probing every list differs
    S3, _, _ = ShardSet(shards, quantizer, nprobe=16, merge=True).search(queries, k=10)
    assert not np.allclose(S3, S2)
