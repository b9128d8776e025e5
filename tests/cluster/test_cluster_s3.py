"""Remote storage end to end on a real S3-compatible server on loopback (moto in server mode, s3fs):
corpus and questions are read from S3, the index is built and published to S3, the answer job pulls
the index into a local cache once and writes its rows to S3."""

from __future__ import annotations

import json

import pytest
from engine_fixtures import HOTPOT, tiny_model_path
from on_disk import assert_each_question_once

from jobs.cli import main as dynrag

N_CORPUS = 10  # HotpotQA dev questions whose context paragraphs form the corpus (~100 passages)
N_ANSWER = 4


def _config_file(tmp_path, model: str | None = None) -> str:
    cfg = {
        "index": {"shard_size": 40, "remote_cache_dir": str(tmp_path / "index-cache")},
        "retrieval": {"retriever": "bm25", "k": 3},
        "answer": {"progress": False},
    }
    if model:
        cfg["generation"] = {"model": model, "backend": "transformers", "max_new_tokens": 8, "max_model_len": 4096}
    path = tmp_path / "dynrag.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return str(path)


@pytest.mark.slow  # about 45 s
def test_index_and_answer_on_s3(s3, data_dir, tmp_path, tmp_path_factory, capsys):
    s3, BUCKET = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()
    s3.pipe(f"{BUCKET}/corpus/v1.jsonl", ("\n".join(lines[:N_CORPUS]) + "\n").encode())
    s3.pipe(f"{BUCKET}/corpus/v2.jsonl", ("\n".join(lines[: N_CORPUS + 2]) + "\n").encode())
    s3.pipe(f"{BUCKET}/questions/dev.jsonl", ("\n".join(lines[:N_ANSWER]) + "\n").encode())
    index, out = f"s3://{BUCKET}/index", f"s3://{BUCKET}/runs/sr-rag"
    conf = ["--config", _config_file(tmp_path, str(tiny_model_path(tmp_path_factory)))]

    # build: published straight to the bucket, CURRENT naming a complete version
    assert (
        dynrag(["index", "build", f"s3://{BUCKET}/corpus/v1.jsonl", "--format", "hotpotqa", "--index", index, *conf])
        == 0
    )
    assert s3.cat(f"{BUCKET}/index/CURRENT").decode().strip() == "v000001"
    m1 = json.loads(s3.cat(f"{BUCKET}/index/versions/v000001/manifest.json"))
    assert len(m1["shards"]) >= 2 and m1["passages"] > 50
    for s in m1["shards"]:
        for rel, meta in {**s["files"], "checksums.json": None}.items():
            obj = f"{BUCKET}/index/shards/{s['key']}/{rel}"
            assert s3.exists(obj), obj
            if meta:
                assert s3.size(obj) == meta["bytes"]
    assert not list((tmp_path / "index-cache" / "builds").iterdir())  # the local build directory is gone
    capsys.readouterr()
    assert dynrag(["index", "info", "--index", index, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1

    # refresh with two more questions' paragraphs: incremental, only new shards uploaded, v1 kept
    assert (
        dynrag(["index", "build", f"s3://{BUCKET}/corpus/v2.jsonl", "--format", "hotpotqa", "--index", index, *conf])
        == 0
    )
    assert s3.cat(f"{BUCKET}/index/CURRENT").decode().strip() == "v000002"
    m2 = json.loads(s3.cat(f"{BUCKET}/index/versions/v000002/manifest.json"))
    assert m2["passages"] > m1["passages"] and m2["build"]["previous_version"] == 1
    assert 0 < m2["build"]["shards_reused"] < len(m2["shards"])
    assert s3.exists(f"{BUCKET}/index/versions/v000001/manifest.json")
    remote_shards = {p.rsplit("/", 1)[-1] for p in s3.ls(f"{BUCKET}/index/shards")}
    assert remote_shards == {s["key"] for s in m1["shards"]} | {s["key"] for s in m2["shards"]}

    # answer: questions from S3, index pulled once into the local cache, rows written to S3
    assert (
        dynrag(
            [
                "answer",
                "--dataset",
                f"s3://{BUCKET}/questions/dev.jsonl",
                "--index",
                index,
                "--out",
                out,
                "--method",
                "sr-rag",
                "--no-progress",
                *conf,
            ]
        )
        == 0
    )
    from pipeline.io.output import read_rows

    assert_each_question_once(out, N_ANSWER)  # as pyarrow counts parts/ on the bucket
    rows = read_rows(out).to_pylist()
    assert len(rows) == N_ANSWER and all(r["error"] is None for r in rows)
    assert all(r["retrieval_calls"] == 1 and len(r["retrieved"]) == 3 for r in rows)
    summary = json.loads(s3.cat(f"{BUCKET}/runs/sr-rag/summary.json"))
    assert summary["rows"] == N_ANSWER and summary["out"] == out
    assert s3.exists(f"{BUCKET}/runs/sr-rag/config.resolved.yaml")

    # the rows retrieved what a direct search of the published version returns
    from indexing import open_index
    from pipeline.config import load_config

    cfg = load_config(conf[1])
    with open_index(index, cfg.index_settings()) as idx:
        assert idx.version == 2
        hits = idx.search([r["question"] for r in rows], k=3, retriever="bm25")
    assert [[d["id"] for d in r["retrieved"]] for r in rows] == [[h.id for h in hs] for hs in hits]
    cached = sorted(p.name for p in (tmp_path / "index-cache").iterdir() if p.name != "builds")
    assert len(cached) == 1
    local = tmp_path / "index-cache" / cached[0]
    assert {p.name for p in (local / "shards").iterdir()} >= {s["key"] for s in m2["shards"]}


def test_cached_version_is_reused(s3, data_dir, tmp_path, capsys):
    """Opening pulls only the files search reads, each checked against its sha256; a second open of the
    same version reads only CURRENT and the manifest from the store. A corrupted remote object is named
    at pull; a corrupted cached file by `dynrag index verify`."""
    from indexing import build_index, open_index
    from indexing.errors import CorruptIndexError
    from pipeline.config import load_config

    s3, BUCKET = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()
    s3.pipe(f"{BUCKET}/c.jsonl", ("\n".join(lines[:3]) + "\n").encode())
    conf = _config_file(tmp_path)
    cfg = load_config(conf)
    uri = f"s3://{BUCKET}/small-index"
    build_index([f"s3://{BUCKET}/c.jsonl"], uri, cfg.index_settings(), fmt="hotpotqa")
    with open_index(uri, cfg.index_settings()) as idx:
        first = idx.search(["Kiss and Tell"], k=2)
    assert first[0]
    shard = next((tmp_path / "index-cache").glob("*/shards/*"))
    assert sorted(p.name for p in shard.iterdir()) == ["faiss.index", "ids.npy", "passages.arrow"]
    for marker in s3.glob(f"{BUCKET}/small-index/shards/*/checksums.json"):
        s3.rm(marker)  # a full pull writes each shard's checksums.json from the manifest: not one GET a shard
    assert dynrag(["index", "verify", "--index", uri, "--config", conf]) == 0  # pulls the rest, hashes all
    assert (shard / "vectors.npy").is_file()
    from indexing.versions.remote import remote_manifest

    files = next(s["files"] for s in remote_manifest(uri)["shards"] if s["key"] == shard.name)
    assert json.loads((shard / "checksums.json").read_text()) == files
    s3.rm(f"{BUCKET}/small-index/shards", recursive=True)
    s3.rm(f"{BUCKET}/small-index/versions/v000001/lucene", recursive=True)
    with open_index(uri, cfg.index_settings()) as idx:
        assert idx.search(["Kiss and Tell"], k=2) == first
    store = shard / "passages.arrow"
    store.write_bytes(b"0" * store.stat().st_size)
    capsys.readouterr()
    assert dynrag(["index", "verify", "--index", uri, "--config", conf]) == 2
    assert f"{store} is corrupt" in capsys.readouterr().err

    # a damaged object on the store is refused when pulled, and nothing of it lands in the cache
    from indexing.versions.remote import cache_root

    other = f"s3://{BUCKET}/other"
    build_index([f"s3://{BUCKET}/c.jsonl"], other, cfg.index_settings(), fmt="hotpotqa")
    obj = next(p for p in s3.find(f"{BUCKET}/other/shards") if p.endswith("/ids.npy"))
    s3.pipe(obj, b"\x00" * s3.size(obj))
    with pytest.raises(CorruptIndexError, match=f"{obj} is corrupt"):
        open_index(other, cfg.index_settings())
    assert not list(cache_root(other, cfg.index_settings()).glob("shards/*/*"))


def test_remote_garbage_includes_unused_templates(s3, data_dir, tmp_path, monkeypatch):
    """An IVF template no kept version uses is removed from the store, as shards are (and as locally)."""
    import indexing.versions.manifest
    from indexing import build_index
    from indexing.versions.manifest import used_by
    from indexing.versions.remote import remote_manifest
    from pipeline.config import load_config

    s3, BUCKET = s3
    monkeypatch.setattr(indexing.versions.manifest, "RETIRED_GRACE_S", 0)  # superseded versions go at once
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()
    s3.pipe(f"{BUCKET}/c.jsonl", ("\n".join(lines[:3]) + "\n").encode())
    settings = load_config(_config_file(tmp_path)).index_settings()
    settings.embedding.model = "hash"
    settings.index.faiss_factory, settings.index.faiss_train_size, settings.index.keep_versions = "IVF2,Flat", 20, 1
    uri = f"s3://{BUCKET}/ivf"
    build_index([f"s3://{BUCKET}/c.jsonl"], uri, settings, fmt="hotpotqa")
    first = remote_manifest(uri)["faiss_template"]["path"]
    assert s3.exists(f"{BUCKET}/ivf/{first}")
    settings.index.faiss_train_size = 15  # another template, every shard rebuilt
    build_index([f"s3://{BUCKET}/c.jsonl"], uri, settings, fmt="hotpotqa")
    m = remote_manifest(uri)
    assert m["version"] == 2 and m["faiss_template"]["path"] != first
    used = used_by([m])
    assert {p.rsplit("/", 1)[-1] for p in s3.ls(f"{BUCKET}/ivf/trained")} == used["trained"]
    assert {p.rsplit("/", 1)[-1] for p in s3.ls(f"{BUCKET}/ivf/shards")} == used["shards"]
    assert [p.rsplit("/", 1)[-1] for p in s3.ls(f"{BUCKET}/ivf/versions")] == ["v000002"]
