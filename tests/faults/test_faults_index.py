"""Fault injection, index builds: a real `dynrag index build` is killed with SIGKILL at every stage
(passages staged, a shard embedded, FAISS written, Lucene written, before a shard's rename, BM25
merged, manifest written, before and after CURRENT moves). Each rerun resumes; the final index
equals an uninterrupted build, and a reader polling all along never sees a partial version."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
from fault_tools import IndexReader, cli, kill_at, run

from indexing import open_index
from indexing.versions.manifest import RETIRED_GRACE_S, collect_garbage, read_manifest, verify_version
from jobs.cli import main
from pipeline.config import load_config

pytestmark = [pytest.mark.faults, pytest.mark.timeout(2400)]

FIRST_BUILD = [
    "build.passages_staged",
    "build.shard_embedded",
    "shard.faiss_written",
    "shard.lucene_written",
    "shard.before_rename",
    "build.bm25_merged",
    "publish.manifest_written",
    "publish.before_current",
    "publish.after_current",
]
REFRESH = ["build.shard_embedded", "publish.before_current"]
# the test encoder (indexing/shards/embed.py's HashEncoder): what is killed is the build's staging and publishing (FAISS and
# Lucene are real); a language model would only add its 6 s import to each of the 15 builds
HASH = "embedding.model=hash"
SETTINGS = ["--set", "runtime.mode=local", "--set", "index.shard_size=30", "--set", HASH]
QUERIES = ["lobbyist for Genentech", "American football player", "a river in Europe"]


@pytest.fixture(scope="module")
def corpora(data_dir, tmp_path_factory):
    lines = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").splitlines()
    d = tmp_path_factory.mktemp("corpus")
    first, second = d / "first.jsonl", d / "second.jsonl"
    n = min(150, len(lines))  # 120 then 150 passages: 4 shards, then 5; the fixture kit's 36 and 45: 2, then 2
    first.write_text("\n".join(lines[: n * 4 // 5]) + "\n", encoding="utf-8")
    edited = [json.loads(x) for x in lines[:n]]
    edited[n // 4]["contents"] += " An edited sentence."  # one changed shard, new passages at the end
    second.write_text("".join(json.dumps(r) + "\n" for r in edited), encoding="utf-8")
    return first, second


def build_cmd(corpus, root):
    return cli("index", "build", str(corpus), "--index", str(root), *SETTINGS)


def assert_same_index(a, b):
    ma, mb = read_manifest(a), read_manifest(b)
    assert [(s["key"], s["passages"]) for s in ma["shards"]] == [(s["key"], s["passages"]) for s in mb["shards"]]
    for s in ma["shards"]:
        for name in ("passages.arrow", "ids.npy"):
            assert s["files"][name] == next(t for t in mb["shards"] if t["key"] == s["key"])["files"][name]
        va, vb = (np.load(r / "shards" / s["key"] / "vectors.npy") for r in (a, b))
        np.testing.assert_allclose(va, vb, atol=1e-5)
    for root in (a, b):
        verify_version(root, read_manifest(root), full=True)
    cfg = load_config(None, [HASH])
    with open_index(a, cfg.index_settings()) as ia, open_index(b, cfg.index_settings()) as ib:
        for retriever in ("bm25", "dense"):
            ha, hb = ia.search(QUERIES, 5, retriever), ib.search(QUERIES, 5, retriever)
            assert [[h.id for h in q] for q in ha] == [[h.id for h in q] for q in hb]
            np.testing.assert_allclose([h.score for q in ha for h in q], [h.score for q in hb for h in q], rtol=1e-4)


def test_build_killed_at_every_stage_resumes_to_the_same_index(corpora, tmp_path):
    first, second = corpora
    root, pauses = tmp_path / "idx", tmp_path / "pauses"
    reader = IndexReader(root)
    reader.start()
    try:
        for point in FIRST_BUILD:
            killed = kill_at(build_cmd(first, root), point, pauses)
            assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        done = run(build_cmd(first, root))
        assert done.returncode == 0, done.stderr[-3000:]
        assert read_manifest(root)["version"] == 1
        for point in REFRESH:
            killed = kill_at(build_cmd(second, root), point, pauses)
            assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
            assert read_manifest(root)["version"] == 1  # the killed refresh published nothing
        done = run(build_cmd(second, root))
        assert done.returncode == 0, done.stderr[-3000:]
        assert "published version 2" in done.stdout
    finally:
        reader.stop()
    assert not reader.failures, reader.failures[:5]
    assert reader.seen >= {None, 1, 2} and reader.polls > 100
    assert not (root / "staging").exists()  # emptied, then removed

    clean = tmp_path / "clean"
    assert run(build_cmd(second, clean)).returncode == 0
    assert_same_index(root, clean)


def test_a_reader_keeps_its_version_through_rebuilds_for_a_day(corpora, tmp_path):
    root = tmp_path / "idx"

    def build(corpus):  # in this process: a reader here and the builder share nothing but the files
        assert (
            main(
                [
                    "--log-level",
                    "ERROR",
                    "index",
                    "build",
                    str(corpus),
                    "--index",
                    str(root),
                    *SETTINGS,
                    "--set",
                    "index.keep_versions=1",
                ]
            )
            == 0
        )

    build(corpora[0])
    with open_index(root, load_config(None, [HASH]).index_settings()) as reader:  # opened version 1, not searched yet
        build(corpora[1])
        assert read_manifest(root)["version"] == 2
        hits = reader.search(QUERIES, 3, "bm25")
        assert reader.version == 1 and all(hits)
    a_day_ago = time.time() - RETIRED_GRACE_S - 60
    os.utime(root / "versions" / "v000002" / "manifest.json", (a_day_ago, a_day_ago))
    collect_garbage(root, 1)  # what the next publish does a day later
    assert [p.name for p in (root / "versions").iterdir()] == ["v000002"]
    assert {p.name for p in (root / "shards").iterdir()} == {s["key"] for s in read_manifest(root)["shards"]}
