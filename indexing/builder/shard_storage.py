"""Where a unit task puts the shards it builds (`ShardStorage`), and the last step of every shard
(`finalize_shard`: FAISS, Lucene, checksums, the atomic rename into `shards/<key>/`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from indexing.shards.embed import embed_input
from indexing.shards.store import read_table
from indexing.versions.manifest import write_checksums
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)


class ShardStorage:
    """Where unit tasks put what they build. A local index directory (the same path on every node) is used in
    place: shards are staged under `staging/` and renamed into `shards/` (build.finalize_shard). For an fsspec
    URI, a scratch directory on the worker's node takes the staging, and each finished shard is uploaded to
    `shards/<key>/` with its `checksums.json` last (the marker of a complete shard, as remote.py uploads)."""

    def __init__(self, root: str, scratch: str | None = None):
        from indexing.versions.remote import is_remote

        self.root, self.remote = root, is_remote(root)
        self.local = Path(cast(str, scratch) if self.remote else root)  # a remote root always comes with a scratch

    def _fs(self) -> tuple[Any, str]:
        from indexing.versions.remote import filesystem_of

        return filesystem_of(self.root)

    def has(self, key: str) -> bool:
        if not self.remote:
            return (self.local / "shards" / key / "checksums.json").is_file()
        fs, base = self._fs()
        return fs.exists(f"{base}/shards/{key}/checksums.json")

    def files(self, key: str) -> dict:
        """A complete shard's {file: {sha256, bytes}} (its checksums.json)."""
        if not self.remote:
            return json.loads((self.local / "shards" / key / "checksums.json").read_text(encoding="utf-8"))
        fs, base = self._fs()
        return json.loads(fs.cat_file(f"{base}/shards/{key}/checksums.json"))

    def dim(self, key: str) -> int:
        """The vectors' dimension of a complete shard, from the header of its faiss.index."""
        import fsspec

        from indexing.shards.dense import faiss_dim

        path = (
            f"{self.root}/shards/{key}/faiss.index" if self.remote else str(self.local / "shards" / key / "faiss.index")
        )
        with fsspec.open(path, "rb") as f:
            return faiss_dim(f)

    def drop_pulled(self, rel: str) -> None:
        """Remove what `fetch` pulled under `rel` (a remote index's; a local one is never copied)."""
        if self.remote:
            shutil.rmtree(self.local / "pulled" / rel, ignore_errors=True)

    def fetch(self, rel: str, want: dict) -> Path:
        """A local copy of the index file `rel` (a remote one pulled once into the scratch, checked)."""
        if not self.remote:
            return self.local / rel
        from indexing.versions.remote import pull_files

        fs, base = self._fs()
        local = self.local / "pulled" / rel
        pull_files(fs, [(f"{base}/{rel}", local, want)])
        return local

    def put(self, path: Path, rel: str) -> None:
        """A file written in the scratch goes to `rel` of a remote index (a local one is written in place)."""
        if self.remote:
            fs, base = self._fs()
            fs.put_file(str(path), f"{base}/{rel}")

    def finish(self, stage: Path, key: str, *index_args: Any) -> dict[str, float]:
        """FAISS, Lucene and checksums of a staged shard, then into `shards/<key>/`; returns seconds."""
        done = self.local / ("shards" if not self.remote else "uploading") / key
        done.parent.mkdir(parents=True, exist_ok=True)
        seconds = finalize_shard(str(stage), str(done), *index_args)
        if self.remote:
            t = time.perf_counter()
            self.upload_finished(key)
            seconds["upload_s"] = time.perf_counter() - t
        return seconds

    def upload_finished(self, key: str) -> bool:
        """Remote: upload a shard finished in the scratch (checksums.json last) and drop it; False if none."""
        from indexing.versions.remote import upload_dir

        done = self.local / "uploading" / key
        if not self.remote or not (done / "checksums.json").is_file():
            return False
        fs, base = self._fs()
        upload_dir(fs, done, f"{base}/shards/{key}", "checksums.json")
        shutil.rmtree(done, ignore_errors=True)
        return True


def finalize_shard(
    staging_dir: str,
    final_dir: str,
    factory: str | None,
    threads: int,
    template: str | None,
    analyzer: dict,
    keep_vectors: bool = True,
) -> dict[str, float]:
    """Build one shard's FAISS (unless `factory` is None: a BM25-only index) and Lucene indexes in staging,
    checksum, and move it into place; returns the seconds of each step. Without `keep_vectors` the staged
    `vectors.npy` is deleted once FAISS has them (a crash after that re-embeds the shard on rerun)."""
    from indexing.shards.dense import build_faiss
    from indexing.shards.sparse import build_lucene

    src, dst = Path(staging_dir), Path(final_dir)
    if (dst / "checksums.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        return {}
    t0 = time.perf_counter()
    if factory:
        build_faiss(np.load(src / "vectors.npy"), factory, src / "faiss.index", Path(template) if template else None)
        if not keep_vectors:
            (src / "vectors.npy").unlink()
    fault_point("shard.faiss_written")
    t1 = time.perf_counter()
    t = read_table(src)
    docs = (
        (i, embed_input(ti, tx))
        for i, ti, tx in zip(t.column("id").to_pylist(), t.column("title").to_pylist(), t.column("text").to_pylist())
    )
    build_lucene(docs, src / "lucene", threads, analyzer)
    fault_point("shard.lucene_written")
    t2 = time.perf_counter()
    for leftover in src.glob("*.tmp"):
        leftover.unlink()
    write_checksums(src)
    fault_point("shard.before_rename")
    if dst.exists():  # a half-moved directory cannot exist (rename is atomic); an incomplete one is stale
        shutil.rmtree(dst)
    os.rename(src, dst)
    log.debug("shard %s ready", dst.name)
    return {"faiss_s": t1 - t0, "lucene_s": t2 - t1, "checksum_s": time.perf_counter() - t2}
