"""FAISS at scale: an IVF factory is trained once, on a sample, into a template every shard shares;
incremental builds keep it. Built with the hash test encoder over synthetic passages."""

from __future__ import annotations

import json
import random

from indexing import IndexSettings, build_index, open_index
from indexing.manifest import read_manifest, verify_version


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_ivf_template_trained_once_and_shared(data_dir, tmp_path):
    words = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").split()
    rng = random.Random(5)
    rows = [{"id": f"v{i}", "title": f"T{i}", "text": " ".join(rng.choices(words, k=80))} for i in range(2400)]
    cfg = IndexSettings(embedding={"model": "hash"},
                        index={"shard_size": 400, "faiss_factory": "IVF8,SQ8", "faiss_train_size": 600})
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
