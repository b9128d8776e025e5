"""FAISS shards searched together (dense.ShardSet): exact for Flat shards, IVF shards merged into one index,
threads that do not grow with the shard count, other factory strings, bad settings (random vectors)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import faiss
import numpy as np
import pytest

from indexing.shards.dense import (
    DenseIndexError,
    ShardSet,
    build_faiss,
    ivf_list_sizes,
    load_faiss,
    load_template_quantizer,
    train_template,
)


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
    import indexing.shards.dense as dense

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


def reload(tmp_path, n: int, quantizer, nprobe: int = 4) -> list:
    """The `n` shards `ivf_shards` wrote, read again (a ShardSet takes the shards it merges)."""
    return [load_faiss(tmp_path / f"{i}.index", nprobe=nprobe, ef_search=16, quantizer=quantizer) for i in range(n)]


def faiss_shard_set(shards: list, quantizer, nprobe: int, queries, k: int) -> tuple:
    """faiss's own IndexShardsIVF over the shards (what ShardSet used on the CPU before merging): (D, I)."""
    ref = faiss.IndexShardsIVF(quantizer, quantizer.ntotal, False, True)
    for ix in shards:
        ref.add_shard(ix)
    return ref.search(queries, k, params=faiss.SearchParametersIVF(nprobe=nprobe))


def test_ivf_shards_merged_into_one_index_equal_faiss_shard_set(tmp_path):
    """IVF shards become one index of all their lists (the first shard, the others moved into it), with lists
    sized from the files' headers or grown as shards arrive: the same scores and (shard, row) hits as faiss's
    IndexShardsIVF over the same shards; nprobe reaches the merged index."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 2400)
    quantizer, shards, parts = ivf_shards(tmp_path, vecs, "IVF16,SQ8", 3)  # SQ8 trains in a blink
    queries = unit(rng, 40)
    D, I = faiss_shard_set(shards, quantizer, 4, queries, 10)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    sizes = ivf_list_sizes([tmp_path / f"{i}.index" for i in range(3)])
    ivf = faiss.extract_index_ivf(shards[0])
    assert sizes.sum() == len(vecs) and sizes[3] == sum(
        ix.invlists.list_size(3) for ix in map(faiss.extract_index_ivf, shards)
    )
    for list_sizes in (sizes, None):
        fresh = reload(tmp_path, 3, quantizer)
        merged = ShardSet(fresh, quantizer, nprobe=4, list_sizes=list_sizes)
        assert merged.shards is fresh[0] and [s.ntotal for s in fresh] == [len(vecs), 0, 0]
        S, SH, R = merged.search(queries, k=10)
        np.testing.assert_allclose(S, D, rtol=1e-5)
        assert np.mean(offsets[SH] + R == I) > 0.99  # equal up to ties of equal codes
        assert faiss.extract_index_ivf(merged.shards).invlists.list_size(3) == sizes[3]
    assert ivf.ntotal == len(parts[0])
    S3, _, _ = ShardSet(reload(tmp_path, 3, quantizer), quantizer, nprobe=16).search(queries, k=10)
    assert not np.allclose(S3, S)  # probing every list differs


THREADS_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    import numpy as np
    from indexing.shards.dense import build_faiss, load_shards, load_template_quantizer, train_template

    tmp, factory = Path(sys.argv[1]), sys.argv[2]
    tmp.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((2400, 32)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    template = tmp / "template.index" if "IVF" in factory else None
    if template:
        train_template(vecs[::2], factory, template)

    def shard_set(n):
        paths = [tmp / f"{n}-{i}.index" for i in range(n)]
        for path, part in zip(paths, np.array_split(vecs, n)):
            build_faiss(part, factory, path, template)
        return load_shards(paths, 4, 16, load_template_quantizer(template) if template else None)

    def threads():
        return len(os.listdir("/proc/self/task"))

    queries, shards = vecs[:200], shard_set(int(sys.argv[3]))
    shards.search(queries, 10)  # the pools FAISS's OpenMP and BLAS start on first use exist from here on
    peak, done = [threads()], threading.Event()

    def watch():
        while not done.is_set():
            peak.append(threads())

    watcher = threading.Thread(target=watch)
    watcher.start()
    for _ in range(10):
        shards.search(queries, 10)  # FAISS searches without the GIL: the watcher samples meanwhile
    done.set()
    watcher.join()
    print(max(peak))
    """
)


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF16,SQ8"])
def test_search_threads_do_not_grow_with_the_shard_count(tmp_path, factory):
    """The process's threads (/proc/self/task) while it searches 2 shards, and while another searches 12, each
    a fresh process after one search of its own (which starts the thread pools that OpenMP and BLAS start on
    first use, at times only under the second set when one process searched both): the same count (faiss's
    threaded shard sets ran a thread per shard)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    peaks = {}
    for n in (2, 12):
        out = subprocess.run(
            [sys.executable, "-c", THREADS_SCRIPT, str(tmp_path / str(n)), factory, str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        peaks[n] = int(out.stdout.strip().splitlines()[-1])
    assert peaks[2] == peaks[12], peaks


def test_ivf_pq_templates_skip_polysemous_training_and_equal_the_np_factory(tmp_path):
    """faiss trains an IVF-PQ index's polysemous codes by default (Hamming filtering, which dynrag never uses;
    nearly all of the training's CPU on small samples): the template of `IVF16,PQ8` skips it, and so is the
    same index as `IVF16,PQ8np`'s, code for code and hit for hit."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 1500)
    for factory in ("IVF16,PQ8", "IVF16,PQ8np"):
        train_template(vecs[::3], factory, tmp_path / f"{factory}.index")
    plain, np_ = (faiss.read_index(str(tmp_path / f"{f}.index")) for f in ("IVF16,PQ8", "IVF16,PQ8np"))
    assert not faiss.downcast_index(faiss.extract_index_ivf(plain)).do_polysemous_training
    for index in (plain, np_):
        index.add(vecs)
        index.nprobe = 4
    assert np.array_equal(plain.search(vecs[:40], 10)[1], np_.search(vecs[:40], 10)[1])
    assert np.array_equal(faiss.serialize_index(plain), faiss.serialize_index(np_))
