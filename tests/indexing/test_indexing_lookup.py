"""The version's id map (store.write_id_shards): an id lookup, or a BM25 hit, asks one shard's store.

Indexes here are BM25-only (no FAISS: lookups do not need it) over short synthetic passages, with small
shards so that one version has about ten."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import indexing.shards.store as store_module
from indexing import IndexSettings, build_index, open_index
from indexing.corpus.passages import Passage, id_hash
from indexing.shards.store import PassageStore, read_table, write_id_shards, write_store
from indexing.versions.manifest import read_manifest

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
SETTINGS = IndexSettings(embedding={"model": "hash"}, index={"shard_size": 40, "dense": False})


def rows(ids: range | list[int], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"p{i}", "title": f"T{i}", "text": f"passage {i} " + " ".join(rng.choices(WORDS, k=12))} for i in ids
    ]


def write_corpus(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def shard_of(root: Path) -> dict[str, int]:
    """Passage id -> ordinal of the shard holding it in the published version, read from the stores."""
    m = read_manifest(root)
    return {
        pid: si
        for si, s in enumerate(m["shards"])
        for pid in read_table(root / "shards" / s["key"]).column("id").to_pylist()
    }


@pytest.fixture
def finds(monkeypatch) -> list[tuple[str, int]]:
    """Every PassageStore.find call: (shard key, number of hashes asked)."""
    calls: list[tuple[str, int]] = []
    real = PassageStore.find

    def find(self, hashes):
        calls.append((self.dir.name, len(hashes)))
        return real(self, hashes)

    monkeypatch.setattr(PassageStore, "find", find)
    return calls


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[dict]]:
    d = tmp_path_factory.mktemp("lookup")
    records = rows(range(400))
    report = build_index([write_corpus(d / "c.jsonl", records)], d / "idx", SETTINGS)
    assert report["shards"] >= 6
    return d / "idx", records


def test_id_map_lists_every_hash_in_order_with_its_shard(tmp_path):
    """Merged a few hashes at a time (many hash ranges) or at once: the same files, every id hash sorted,
    each with the ordinal of the shard that stores it."""
    dirs = []
    for si, n in enumerate((30, 1, 57, 12)):
        d = tmp_path / f"s{si}"
        d.mkdir()
        write_store([Passage(f"{si}-{i}", "t", "x") for i in range(n)], d)
        dirs.append(d)
    write_id_shards(dirs, tmp_path / "small", bucket=7)
    write_id_shards(dirs, tmp_path / "one")
    hashes = np.load(tmp_path / "small" / "hashes.npy", mmap_mode="r")
    shards = np.load(tmp_path / "small" / "shards.npy", mmap_mode="r")
    expected = sorted((id_hash(f"{si}-{i}"), si) for si, n in enumerate((30, 1, 57, 12)) for i in range(n))
    assert list(zip(hashes.tolist(), shards.tolist())) == expected
    assert hashes.dtype == np.uint64 and shards.dtype == np.uint32
    for name in ("hashes.npy", "shards.npy"):
        assert (tmp_path / "small" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert not list((tmp_path / "small").glob(".*"))  # no temporary file left


def test_a_lookup_asks_only_the_shard_that_holds_the_id(built, finds):
    root, records = built
    where = shard_of(root)
    keys = [s["key"] for s in read_manifest(root)["shards"]]
    text = {r["id"]: r["text"] for r in records}
    with open_index(root, SETTINGS) as index:
        for pid in ("p0", "p157", "p399"):
            finds.clear()
            assert index.passages([pid])[0].text == text[pid]
            assert finds == [(keys[where[pid]], 1)]
        # a batch: one call per shard it touches; ids this version does not hold ask no shard
        batch = ["p3", "p4", "p250", "nope", "p3", "p5"]
        finds.clear()
        found = index.passages(batch)
        assert [h.text if h else None for h in found] == [text.get(i) for i in batch]
        assert sorted(finds) == sorted(
            (keys[s], sum(where.get(i) == s for i in batch)) for s in {where[i] for i in batch if i in where}
        )
        finds.clear()
        assert index.passages(["nope", "p400"]) == [None, None] and finds == []
        # a BM25 batch's hits: each shard holding hits is asked once, no other shard
        finds.clear()
        hits = index.search([r["text"] for r in records[::37]], k=5, retriever="bm25")
        asked = [key for key, _ in finds]
        assert sorted(asked) == sorted({keys[where[h.id]] for hs in hits for h in hs})
        assert sum(n for _, n in finds) == sum(len(hs) for hs in hits)
        assert [hs[0].id for hs in hits] == [r["id"] for r in records[::37]]


def test_a_large_lookup_reads_on_several_threads_and_answers_in_order(built, monkeypatch):
    """A lookup of more rows than READ_THREADS x 2 reads them in slices on the index's threads: the same hits, in
    the ids' order (repeats, misses and all), as the same ids looked up one at a time."""
    import threading

    import indexing.search.index as index_module

    root, records = built
    text = {r["id"]: r["text"] for r in records}
    ids = [f"p{i}" for i in random.Random(3).choices(range(420), k=5 * index_module.READ_THREADS)]
    readers: set[str] = set()
    real_get = PassageStore.get

    def get(self, row):
        readers.add(threading.current_thread().name)
        return real_get(self, row)

    monkeypatch.setattr(PassageStore, "get", get)
    with open_index(root, SETTINGS) as index:
        one_by_one = [index.passages([pid])[0] for pid in ids]
        assert readers == {threading.current_thread().name}  # a lookup of one id reads on the caller's thread
        readers.clear()
        found = index.passages(ids)
    assert len(readers) > 1 and all(name.startswith("dynrag-passages") for name in readers)
    assert [h.text if h else None for h in found] == [text.get(pid) for pid in ids]
    assert found == one_by_one and None in found


def test_incremental_rebuild_writes_the_new_versions_map(built, tmp_path):
    """A version that drops passages and adds some (in the middle and at the end of the corpus) gets its own
    map, equal to a full build's of the same corpus; the old version keeps answering with its own."""
    root, records = built
    work = tmp_path / "idx"
    shutil.copytree(root, work)
    removed = {"p10", "p11", "p200", "p399"}
    final = [r for r in records if r["id"] not in removed]
    final[100:100] = rows([1000, 1001, 1002], seed=1)
    final += rows(range(400, 430), seed=2)
    corpus = write_corpus(tmp_path / "final.jsonl", final)
    report = build_index([corpus], work, SETTINGS)
    assert report["version"] == 2 and 0 < report["shards_reused"] < report["shards"]
    full = tmp_path / "full"
    build_index([corpus], full, SETTINGS)
    for name in ("hashes.npy", "shards.npy"):
        assert (work / "versions/v000002/id_shards" / name).read_bytes() == (
            full / "versions/v000001/id_shards" / name
        ).read_bytes()
    text = {r["id"]: r["text"] for r in final}
    with open_index(work, SETTINGS) as index:
        looked = index.passages(list(text) + sorted(removed))
        assert [h.text if h else None for h in looked] == list(text.values()) + [None] * len(removed)
    with open_index(work, SETTINGS, version="v000001") as old:
        assert [h.id for h in old.passages(sorted(removed))] == sorted(removed)
        assert old.passages(["p1000"]) == [None]


def test_ids_sharing_a_hash_in_two_shards_are_both_found(tmp_path, monkeypatch, finds):
    """Two ids of one version with one 64-bit hash (forced here), in different shards: the map lists both
    shards, and each lookup returns the passage whose stored id matches, as the every-shard search did."""
    real = store_module.id_hash
    monkeypatch.setattr(store_module, "id_hash", lambda pid: real("p5") if pid == "p300" else real(pid))
    records = rows(range(400))
    root = tmp_path / "idx"
    build_index([write_corpus(tmp_path / "c.jsonl", records)], root, SETTINGS)
    where = shard_of(root)
    assert where["p5"] < where["p300"]
    shards = np.load(root / "versions/v000001/id_shards/shards.npy")
    hashes = np.load(root / "versions/v000001/id_shards/hashes.npy")
    assert shards[hashes == real("p5")].tolist() == [where["p5"], where["p300"]]
    with open_index(root, SETTINGS) as index:
        finds.clear()
        found = index.passages(["p300", "p5", "p6"])
        assert [h.text for h in found] == [records[300]["text"], records[5]["text"], records[6]["text"]]
        # p300 is asked of p5's shard first (same hash, wrong id), then of its own
        assert len(finds) == len({where["p5"], where["p6"]}) + 1
        many = ["p300", "p5", *(f"p{i}" for i in range(100, 200))]  # the same, read on the lookup threads
        assert [h.text for h in index.passages(many)] == [records[int(pid[1:])]["text"] for pid in many]


def test_a_version_without_an_id_map_searches_every_shard_until_rebuilt(built, tmp_path, finds, caplog):
    """An index published before id maps: lookups still answer (each shard asked in turn, with a warning at
    open), and a build over the same corpus publishes a version with a map (reusing every shard)."""
    root, records = built
    work = tmp_path / "idx"
    shutil.copytree(root, work)
    path = work / "versions/v000001/manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["id_shards"]
    path.write_text(json.dumps(manifest))
    shutil.rmtree(work / "versions/v000001/id_shards")
    where = shard_of(work)
    with caplog.at_level(logging.WARNING, logger="indexing.search.index"), open_index(work, SETTINGS) as index:
        assert "has no id map" in caplog.text
        finds.clear()
        assert [h.text for h in index.passages(["p399", "p0"])] == [records[399]["text"], records[0]["text"]]
        assert len(finds) == max(where["p399"], where["p0"]) + 1  # shard after shard until both are found
    report = build_index([str(built[0].parent / "c.jsonl")], work, SETTINGS)
    assert report["published"] and report["version"] == 2 and report["shards_built"] == 0
    with open_index(work, SETTINGS) as index:
        finds.clear()
        assert index.passages(["p399"])[0].text == records[399]["text"] and len(finds) == 1
