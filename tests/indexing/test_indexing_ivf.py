"""FAISS at scale: an IVF factory is trained once, on a sample, into a template every shard shares;
incremental builds keep it. Built with the hash test encoder over synthetic passages."""

from __future__ import annotations

import json
import random

import faiss
import numpy as np
import pytest

import indexing.builder.unit_work
from indexing import IndexSettings, build_index, open_index
from indexing.shards.store import read_table
from indexing.versions.manifest import read_manifest, verify_version


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def synthetic(data_dir, n, seed=5):
    words = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    return [{"id": f"v{i}", "title": f"T{i}", "text": " ".join(rng.choices(words, k=80))} for i in range(n)]


def assert_equals_one_index(root, cfg, queries, k=5):
    """The published version's dense search equals one IVF index over all its shards' vectors, filled
    from the version's template and searched with the same nprobe: true only if every shard was
    filled from that very template."""
    m = read_manifest(root)
    one = faiss.read_index(str(root / m["faiss_template"]["path"]))
    one.nprobe = min(cfg.index.faiss_nprobe, one.nlist)
    ids = []
    for s in m["shards"]:
        one.add(np.load(root / "shards" / s["key"] / "vectors.npy"))
        ids += read_table(root / "shards" / s["key"]).column("id").to_pylist()
    with open_index(root, cfg) as index:
        hits = index.search(queries, k=k, retriever="dense")
        D, I = one.search(index.encode_queries(queries), k)
    np.testing.assert_allclose([[h.score for h in q] for q in hits], D, rtol=1e-4, atol=1e-5)
    same = np.mean([[h.id for h in q] == [ids[i] for i in row] for q, row in zip(hits, I)])
    assert same >= 0.95, same  # equal up to ties of equal codes


def test_ivf_template_trained_once_and_shared(data_dir, tmp_path):
    words = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").split()
    rng = random.Random(5)
    rows = [{"id": f"v{i}", "title": f"T{i}", "text": " ".join(rng.choices(words, k=80))} for i in range(2400)]
    cfg = IndexSettings(
        embedding={"model": "hash"}, index={"shard_size": 400, "faiss_factory": "IVF8,SQ8", "faiss_train_size": 600}
    )
    root = tmp_path / "idx"
    first = build_index([write(tmp_path / "a.jsonl", rows[:2000])], root, cfg)
    m1 = read_manifest(root)
    assert first["shards"] >= 3 and "faiss_train_s" in first
    assert [p.name for p in (root / "trained").iterdir()] == [m1["faiss_template"]["path"].split("/")[1]]
    with open_index(root, cfg) as index:
        hits = index.search([r["text"] for r in rows[:2000:40]], k=5, retriever="dense")
    found = sum(h[0].id == r["id"] for h, r in zip(hits, rows[:2000:40]))
    assert found >= 0.9 * len(hits)

    # a refresh keeps the template: old shards are reused as they are, only new passages are embedded
    second = build_index([write(tmp_path / "b.jsonl", rows)], root, cfg)
    m2 = read_manifest(root)
    assert m2["faiss_template"] == m1["faiss_template"] and "faiss_train_s" not in second
    assert second["shards_reused"] >= first["shards"] - 1 and second["passages_embedded"] < 600
    assert verify_version(root, m2, full=True)[0] > 0  # the template is part of the version's files
    with open_index(root, cfg) as index:
        assert index.search([rows[2300]["text"]], k=1, retriever="dense")[0][0].id == "v2300"

    # other training settings: a new template, every shard rebuilt from reused vectors
    cfg.index.faiss_train_size = 500
    third = build_index([str(tmp_path / "b.jsonl")], root, cfg.model_copy(deep=True))
    m3 = read_manifest(root, None)
    assert m3["faiss_template"] != m2["faiss_template"] and third["shards_reused"] == 0
    assert third["passages_embedded"] == 0 and third["vectors_reused"] == len(rows)


def test_partial_probe_equals_one_index(data_dir, tmp_path):
    """nprobe 4 of 16 lists through a real build: the shards searched together equal one IVF index over
    all vectors with the same template and nprobe."""
    rows = synthetic(data_dir, 1200, seed=6)
    cfg = IndexSettings(
        embedding={"model": "hash"},
        index={"shard_size": 300, "faiss_factory": "IVF16,SQ8", "faiss_train_size": 800, "faiss_nprobe": 4},
    )
    root = tmp_path / "idx"
    assert build_index([write(tmp_path / "a.jsonl", rows)], root, cfg)["shards"] >= 3
    rng = random.Random(7)
    queries = [" ".join(rng.sample(r["text"].split(), 12)) for r in rows[::30]]  # fragments: not stored vectors
    assert_equals_one_index(root, cfg, queries)


class Interrupted(Exception):
    pass


def interrupt_after_shards(monkeypatch, n):
    """Stop the build (as a kill would) once `n` shards are finished: at the next shard's embedded point."""
    calls = []

    def point(name):
        if name == "build.shard_embedded":
            calls.append(name)
            if len(calls) > n:
                raise Interrupted(name)

    monkeypatch.setattr(indexing.builder.unit_work, "fault_point", point)


@pytest.mark.parametrize("marker_lost", [False, True])
def test_interrupted_first_build_keys_shards_by_their_template(data_dir, tmp_path, monkeypatch, marker_lost):
    """A first IVF build stopped after two shards were finished, rerun over a grown corpus: the rerun
    reuses the template it trained (and the finished shards with it); with that record lost, it trains
    another template, and no shard filled from the first one is reused (the template is in the key)."""
    rows = synthetic(data_dir, 360, seed=8)
    cfg = IndexSettings(
        embedding={"model": "hash"}, index={"shard_size": 60, "faiss_factory": "IVF4,SQ8", "faiss_train_size": 200}
    )
    root = tmp_path / "idx"
    interrupt_after_shards(monkeypatch, 2)
    with pytest.raises(Interrupted):
        build_index([write(tmp_path / "a.jsonl", rows[:300])], root, cfg)
    monkeypatch.undo()
    first = [p.name for p in (root / "trained").iterdir()]
    finished = {p.name for p in (root / "shards").iterdir()}
    assert len(first) == 1 and len(finished) == 2 and (root / "staging" / ".template.json").is_file()
    if marker_lost:
        (root / "staging" / ".template.json").unlink()

    report = build_index([write(tmp_path / "b.jsonl", rows)], root, cfg)  # more passages: another training sample
    m = read_manifest(root)
    keys = {s["key"] for s in m["shards"]}
    if marker_lost:
        assert "faiss_train_s" in report and m["faiss_template"]["path"] != f"trained/{first[0]}"
        assert report["shards_reused"] == 0 and not keys & finished
    else:
        assert "faiss_train_s" not in report and m["faiss_template"]["path"] == f"trained/{first[0]}"
        assert report["shards_reused"] == 2 and finished <= keys
    assert [p.name for p in (root / "trained").iterdir()] == [m["faiss_template"]["path"].split("/")[1]]
    assert not (root / "staging").exists()  # emptied, then removed
    assert_equals_one_index(root, cfg, [r["text"] for r in rows[::12]])


def test_four_bit_pq_is_searched_in_fast_scan_layout(data_dir, tmp_path):
    """IVF-PQ with 4-bit codes: shards stored plain (faiss cannot merge fast-scan lists), the merged index
    converted to fast-scan at load; its top-k agree with the plain index's (fast-scan's lookup tables are
    quantised to 8 bits, so scores agree closely, not exactly)."""
    from indexing.shards.dense import fast_scan

    rows = synthetic(data_dir, 1200, seed=11)
    cfg = IndexSettings(
        embedding={"model": "hash"},
        index={"shard_size": 300, "faiss_factory": "IVF8,PQ16x4np", "faiss_train_size": 600, "faiss_nprobe": 8},
    )
    root = tmp_path / "idx"
    build_index([write(tmp_path / "a.jsonl", rows)], root, cfg)
    assert len(read_manifest(root)["shards"]) >= 3
    queries = [r["text"][:120] for r in rows[::60]]
    with open_index(root, cfg) as index:
        hits = index.search(queries, k=5, retriever="dense")
        shards = index.retriever("dense")._shards()
        assert isinstance(shards.shards, faiss.IndexIVFPQFastScan)
        one = faiss.read_index(str(root / read_manifest(root)["faiss_template"]["path"]))
        one.nprobe = 8
        ids = []
        for s in read_manifest(root)["shards"]:
            one.add(np.load(root / "shards" / s["key"] / "vectors.npy"))
            ids += read_table(root / "shards" / s["key"]).column("id").to_pylist()
        assert type(one) is faiss.IndexIVFPQ and type(fast_scan(one)) is faiss.IndexIVFPQFastScan
        D, I = one.search(index.encode_queries(queries), 5)
    overlap = np.mean([len({h.id for h in q} & {ids[i] for i in row}) / 5 for q, row in zip(hits, I)])
    assert overlap >= 0.8, overlap
    np.testing.assert_allclose([q[0].score for q in hits], D[:, 0], atol=0.05)


def test_fast_scan_shards_are_refused_with_the_factory_to_use():
    with pytest.raises(ValueError, match="'IVF4096,PQ128x4np'"):
        IndexSettings(index={"faiss_factory": "IVF4096,PQ128x4fs"})
