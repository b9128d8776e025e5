"""A remote index a cluster can trust (issue 47, item 5), on a real S3 API (the session's moto server):
the version pinned by the driver is the one every open reads, also after a republish; the Ray-mode
preflight reads manifests only; the processes of one node download each file once."""

from __future__ import annotations

import contextlib
import multiprocessing

import pytest
from engine_fixtures import HOTPOT

from indexing import build_index, open_index, pin_index
from indexing.versions.manifest import SEARCH_FILES
from indexing.versions.pinning import split_pin
from indexing.versions.remote import index_manifest, pull_version, remote_manifest
from pipeline.config import DynragConfig


def _settings(cache):
    cfg = DynragConfig()
    cfg.index.shard_size = 40
    cfg.index.remote_cache_dir = str(cache)
    settings = cfg.index_settings()
    settings.embedding.model = "hash"
    return settings


@pytest.fixture
def remote_index(s3, data_dir, tmp_path):
    """A small index published to S3 (v000001); returns (uri, bucket, settings, corpus lines)."""
    fs, bucket = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()
    fs.pipe(f"{bucket}/c1.jsonl", ("\n".join(lines[:3]) + "\n").encode())
    uri = f"s3://{bucket}/idx"
    settings = _settings(tmp_path / "build-cache")
    build_index([f"s3://{bucket}/c1.jsonl"], uri, settings, fmt="hotpotqa")
    return uri, bucket, settings, lines


def test_pin_spec_round_trip(tmp_path):
    assert split_pin("s3://b/idx@v3") == ("s3://b/idx", "v000003")
    assert split_pin("s3://b/idx") == ("s3://b/idx", None)
    odd = tmp_path / "folder@v2"  # a folder whose own name looks pinned is a folder
    odd.mkdir()
    assert split_pin(odd) == (str(odd), None)


def test_pinned_version_survives_a_republish(remote_index, tmp_path):
    uri, bucket, settings, lines = remote_index
    pinned = pin_index(uri)
    assert pinned == f"{uri}@v000001" and pin_index(pinned) == pinned
    reader = _settings(tmp_path / "replica-cache")  # a replica on another node: its own cache
    query = ["Kiss and Tell"]
    with open_index(pinned, reader) as idx:
        before = idx.search(query, k=3)
    # a build publishes v2 mid-run
    from s3fs import S3FileSystem

    S3FileSystem().pipe(f"{bucket}/c2.jsonl", ("\n".join(lines[:6]) + "\n").encode())
    build_index([f"s3://{bucket}/c2.jsonl"], uri, settings, fmt="hotpotqa")
    assert remote_manifest(uri)["version"] == 2
    for cache in ("replica-cache", "late-replica-cache"):  # a replica that opened before, and one that opens now
        with open_index(pinned, _settings(tmp_path / cache)) as idx:
            assert idx.version == 1
            assert idx.manifest == remote_manifest(uri, "v000001")
            assert idx.search(query, k=3) == before
    assert index_manifest(pinned)["version"] == 1 and index_manifest(uri)["version"] == 2
    with open_index(uri, reader) as idx:
        assert idx.version == 2


def test_pinned_local_index(remote_index, tmp_path, capsys):
    """The same spec for a local folder: `idx@v000001` opens v1 after v2 is published."""
    _, bucket, settings, lines = remote_index
    local = tmp_path / "local-idx"
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(lines[:3]) + "\n")
    build_index([str(src)], local, settings, fmt="hotpotqa")
    pinned = pin_index(local)
    src.write_text("\n".join(lines[:6]) + "\n")
    build_index([str(src)], local, settings, fmt="hotpotqa")
    with open_index(pinned, settings) as idx:
        assert idx.version == 1 and pinned == f"{local}@v000001"
    with pytest.raises(Exception, match="pinned to v000001, but version v000002"):
        open_index(pinned, settings, "v000002")
    from jobs.cli import main as dynrag

    capsys.readouterr()
    assert dynrag(["index", "verify", "--index", pinned]) == 0
    assert "version 1:" in capsys.readouterr().out


def test_ray_preflight_reads_manifests_only(remote_index, s3_server, tmp_path):
    """The Ray-mode preflight on the head: the manifest is read, no shard nor BM25 file is pulled, nothing is
    written to the index cache, and the model (a hub name, offline here) is not downloaded."""
    from pipeline.runtime.answer import preflight

    uri, bucket, _, _ = remote_index
    cfg = DynragConfig()
    cfg.runtime.mode = "ray"
    cfg.index.remote_cache_dir = str(tmp_path / "head-cache")
    cfg.generation.model = "some-org/not-on-this-machine"
    cfg.index.bm25_stemmer = "none"  # not the index's
    gets = s3_server.count("GET", f"/{bucket}/idx/")
    with contextlib.ExitStack() as stack:
        run_cfg, backends = preflight(cfg, pin_index(uri), stack)
        assert backends is None
    assert s3_server.count("GET", f"/{bucket}/idx/shards/") == 0
    assert s3_server.count("GET", f"/{bucket}/idx/") - gets == 2  # CURRENT (the pin) and the manifest
    assert not (tmp_path / "head-cache").exists()
    assert run_cfg.index.bm25_stemmer == "porter"  # the index's analyzer, read from its manifest, in the run's copy
    assert cfg.index.bm25_stemmer == "none"  # the configuration given is left as it is


def _pull(uri: str, cache: str, barrier) -> None:
    settings = _settings(cache)
    barrier.wait(timeout=60)  # all at once, as the replicas of one node start together
    pull_version(uri, settings, search_only=True)


def test_one_download_per_node(remote_index, s3_server, tmp_path):
    """Three processes of one node open the same pinned version at once: each file is downloaded once."""
    uri, bucket, _, _ = remote_index
    pinned = pin_index(uri)
    manifest = index_manifest(pinned)
    files = sum(len([f for f in s["files"] if f in SEARCH_FILES]) for s in manifest["shards"])
    before = s3_server.count("GET", f"/{bucket}/idx/shards/")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_pull, args=(pinned, str(tmp_path / "node-cache"), barrier)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert s3_server.count("GET", f"/{bucket}/idx/shards/") - before == files
