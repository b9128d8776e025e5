"""Text on demand: the per-shard passage store, and an open index that holds no passage text.

The index is built with the hash test encoder (embedding.model=hash) over 3,000 synthetic passages
made of words of the DPR sample, so that it has several shards and builds in seconds."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from indexing import IndexSettings, build_index, open_index
from indexing.corpus.passages import Passage, id_hash
from indexing.shards.embed import HashEncoder
from indexing.shards.store import PassageStore, read_table, write_store

N = 3000


def test_store_rows_follow_id_hashes_and_are_found_by_id(tmp_path):
    ps = [Passage(f"doc-{i}", f"Title {i}", f"text {i} é ü 中文") for i in range(300)]
    write_store(ps, tmp_path)
    keys = np.load(tmp_path / "ids.npy")
    assert np.all(np.diff(keys.astype(np.float64)) > 0) and len(keys) == 300
    store = PassageStore(tmp_path)
    rows = store.find(np.array([id_hash("doc-7"), id_hash("doc-299"), id_hash("nope")], dtype=np.uint64))
    assert rows[2] == -1
    assert store.get(int(rows[0])) == ("doc-7", "Title 7", "text 7 é ü 中文")
    assert store.get(int(rows[1]))[0] == "doc-299"
    table = read_table(tmp_path)
    assert [id_hash(i) for i in table.column("id").to_pylist()] == keys.tolist()
    assert all(store.get(r)[0] == table.column("id")[r].as_py() for r in (0, 63, 64, 65, 299))  # batch edges


def test_hash_encoder_is_deterministic_and_lexical():
    a, b = HashEncoder(), HashEncoder()
    texts = ["The Eiffel Tower is in Paris", "the eiffel tower\nis in PARIS", "Quantum chromodynamics", ""]
    v = a.encode(texts)
    np.testing.assert_array_equal(v, b.encode(texts))
    assert v.shape == (4, 384) and v.dtype == np.float32
    assert v[0] @ v[1] == pytest.approx(1.0) and abs(v[0] @ v[2]) < 0.5 and not v[3].any()
    assert IndexSettings().model_path("hash") == "hash"  # no model folder needed


@pytest.fixture(scope="module")
def corpus(data_dir, tmp_path_factory):
    words = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").split()
    rng = random.Random(3)
    rows = [{"id": f"s{i}", "title": f"Synthetic {i}", "text": " ".join(rng.choices(words, k=90))} for i in range(N)]
    path = tmp_path_factory.mktemp("store") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, rows


def _maps() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def test_open_and_search_read_text_for_hits_only(corpus, tmp_path):
    path, rows = corpus
    cfg = IndexSettings(embedding={"model": "hash"}, index={"shard_size": 300})
    root = tmp_path / "idx"
    report = build_index([str(path)], root, cfg)
    assert report["passages"] == N and report["shards"] >= 3
    text_bytes = sum(p.stat().st_size for p in root.glob("shards/*/passages.arrow"))
    by_id = {r["id"]: r for r in rows}
    queries = [r["text"] for r in rows[::15]]

    before = pa.total_allocated_bytes()
    with open_index(root, cfg) as index:
        for retriever in ("bm25", "dense"):
            hits = index.search(queries, k=10, retriever=retriever)
            assert [h[0].id for h in hits] == [r["id"] for r in rows[::15]]  # a passage's own text finds it first
            for h in (x for q in hits for x in q):
                assert (h.title, h.text) == (by_id[h.id]["title"], by_id[h.id]["text"])
        looked = index.passages(["s5", "s2999", "missing"])
        assert [p.text if p else None for p in looked] == [by_id["s5"]["text"], by_id["s2999"]["text"], None]
        # nothing of the text tables is held: no Arrow memory kept, the text files are read, not mapped
        held = pa.total_allocated_bytes() - before
        maps = _maps()
        assert held < 64 * 1024 < text_bytes, held
        assert "passages.arrow" not in maps and "ids.npy" in maps
