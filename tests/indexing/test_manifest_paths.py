"""Hostile manifests (issue 47, item 7): a path a manifest names is confined to the index root. Opening an
index whose manifest names an absolute path or one with `..` fails with one IndexingError line, locally and
from S3 (the session's moto server), before anything is read or written outside the root."""

from __future__ import annotations

import copy
import json

import pytest

from indexing import open_index
from indexing.errors import IndexingError
from indexing.settings import IndexSettings
from indexing.versions.manifest import FORMAT_VERSION, check_manifest_paths
from indexing.versions.remote import cache_root

FILE = {"sha256": "0" * 64, "bytes": 4}
GOOD = {
    "format": FORMAT_VERSION,
    "version": 1,
    "shards": [{"key": "abc123", "files": {"passages.arrow": FILE, "ids.npy": FILE, "lucene/seg.cfs": FILE}}],
    "bm25": {"path": "lucene", "files": {"seg.cfs": FILE}},
    "id_shards": {"path": "id_shards", "files": {"map.npy": FILE}},
    "faiss_template": {"path": "trained/t.index", **FILE},
}


def _hostile(field: str, value: str) -> dict:
    m = copy.deepcopy(GOOD)
    if field == "shard key":
        m["shards"][0]["key"] = value
    elif field == "shard file":
        m["shards"][0]["files"] = {value: FILE}
    elif field == "bm25":
        m["bm25"]["path"] = value
    elif field == "bm25 file":
        m["bm25"]["files"] = {value: FILE}
    elif field == "id_shards":
        m["id_shards"]["path"] = value
    else:
        m["faiss_template"]["path"] = value
    return m


HOSTILE = [
    ("shard key", "../../outside"),
    ("shard key", "/tmp/outside"),
    ("shard key", "a/b"),
    ("shard file", "../../../outside.arrow"),
    ("shard file", "/etc/passwd"),
    ("bm25", "../../../outside"),
    ("bm25 file", "x/../../../../outside"),
    ("id_shards", "/abs"),
    ("faiss_template", "/etc/passwd"),
    ("faiss_template", "trained/../../outside.index"),
    ("faiss_template", "shards/abc123/faiss.index"),
    ("shard key", "s3://elsewhere/x"),
]


def test_a_built_manifest_passes():
    check_manifest_paths(GOOD, "idx")


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_hostile_manifest_refused_locally(tmp_path, field, value):
    root = tmp_path / "idx"
    (root / "versions" / "v000001").mkdir(parents=True)
    (root / "versions" / "v000001" / "manifest.json").write_text(json.dumps(_hostile(field, value)))
    (root / "CURRENT").write_text("v000001\n")
    with pytest.raises(
        IndexingError, match="is not a relative path inside the index|is not a file under trained/"
    ) as e:
        open_index(root, IndexSettings())
    assert "\n" not in str(e.value) and repr(value) in str(e.value)


def test_hostile_current_refused(tmp_path):
    root = tmp_path / "idx"
    root.mkdir()
    (tmp_path / "evil" / "manifest.json").parent.mkdir()
    (tmp_path / "evil" / "manifest.json").write_text(json.dumps(GOOD))
    (root / "CURRENT").write_text("../../evil\n")
    with pytest.raises(IndexingError, match="version name in CURRENT '../../evil' is not a relative path"):
        open_index(root, IndexSettings())


@pytest.mark.parametrize(("field", "value"), HOSTILE[:2] + HOSTILE[3:4] + HOSTILE[5:7] + HOSTILE[8:9])
def test_hostile_manifest_refused_from_s3(s3, tmp_path, field, value):
    """A remote manifest that would make the pull write (or read) outside the local cache: refused before any
    file is pulled; nothing lands in or beside the cache."""
    fs, bucket = s3
    uri = f"s3://{bucket}/idx"
    fs.pipe(f"{bucket}/idx/CURRENT", b"v000001\n")
    fs.pipe(f"{bucket}/idx/versions/v000001/manifest.json", json.dumps(_hostile(field, value)).encode())
    for obj in ("shards/../../outside/passages.arrow", "outside.arrow", "versions/v000001/lucene/seg.cfs"):
        fs.pipe(f"{bucket}/idx/{obj}", b"evil")
    cfg = IndexSettings()
    cfg.index.remote_cache_dir = str(tmp_path / "cache" / "index")
    with pytest.raises(IndexingError, match="is not a relative path inside the index|is not a file under trained/"):
        open_index(uri, cfg)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
    assert not cache_root(uri, cfg).exists() or not any(cache_root(uri, cfg).rglob("*.arrow"))
