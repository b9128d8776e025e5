"""Corpus in, indexes out: readers, 100-word passages, shards, FAISS + Lucene, manifests.

    from indexing import IndexSettings, build_index, open_index
    cfg = IndexSettings(embedding={"model": "/models/all-MiniLM-L6-v2"})  # or DynragConfig.index_settings()
    report = build_index(["psgs_w100.tsv"], "idx", cfg)          # incremental when idx holds an index
    index = open_index("idx", cfg)                               # a consistent view of the published version
    open_index(pin_index("s3://b/idx"), cfg)                     # "s3://b/idx@v000003": that version, always
    index.search(["who wrote Hamlet?"], k=10, retriever="bm25")  # -> list[list[Hit]]; or retriever="dense"
    index.passages(["123"]); index.info()

`indexing` imports nothing of `pipeline` or `jobs`: it takes `IndexSettings`, raises `IndexingError`s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from indexing.errors import IndexingError
from indexing.search import Hit
from indexing.settings import IndexSettings

if TYPE_CHECKING:
    from indexing.search.index import Index


def build_index(
    sources: str | os.PathLike | Iterable[str | os.PathLike],
    index_dir: str | os.PathLike,
    cfg: IndexSettings,
    **options: Any,
) -> dict:
    """Build or incrementally refresh the index at `index_dir` (a folder, or an s3://, gs://, az:// URI) from
    `sources` (files, URIs or globs); return a report. In-process, a remote index is built locally and uploaded
    (remote.py); with `cfg.ray.enabled`, Ray workers build and write the shards (cluster_build.py). `options`:
    fmt, fields, on_bad_line, vectors, normalize_vectors (see indexing.builder.local.build_local_index; on a cluster
    the vectors file is read by the workers, at the same path on every node)."""
    from indexing.versions.remote import is_remote

    names = [str(sources)] if isinstance(sources, (str, os.PathLike)) else [str(s) for s in sources]
    if cfg.ray.enabled:  # reading, splitting, embedding and shard indexes on the Ray workers (cluster_build.py)
        from indexing.builder.cluster import build_cluster_index, build_remote_cluster_index

        if is_remote(index_dir):
            return build_remote_cluster_index(names, str(index_dir), cfg, **options)
        return build_cluster_index(names, index_dir, cfg, **options)
    from indexing.builder.local import build_local_index, build_remote_index

    if is_remote(index_dir):
        return build_remote_index(names, str(index_dir), cfg, **options)

    return build_local_index(names, index_dir, cfg, **options)


def open_index(index_dir: str | os.PathLike, cfg: IndexSettings, version: str | None = None) -> Index:
    """Open the published version of the index at `index_dir` (or a named older version, e.g. 'v000002', also
    given as `index_dir@v000002`: `pin_index`). A remote `index_dir` is pulled into a local cache first
    (remote.py)."""
    from pathlib import Path

    from indexing.search.index import open_local_index
    from indexing.versions.pinning import resolve_version
    from indexing.versions.remote import is_remote, pull_searchable

    index_dir, version = resolve_version(index_dir, version)
    if is_remote(index_dir):  # its search files pulled into the local cache, opened there
        index_dir, version = pull_searchable(str(index_dir), cfg, version)
    return open_local_index(Path(index_dir), cfg, version)


def pin_index(index_dir: str | os.PathLike) -> str:
    """`index_dir` pinned to the version its CURRENT names now, e.g. "s3://b/idx@v000003" (remote.pin_index):
    hand it to every replica, and each opens that version whatever is published meanwhile."""
    from indexing.versions.remote import pin_index as pin

    return pin(index_dir)


# the library's names, and the rooms that code outside indexing/ may enter (each by its own __all__); builder/ is
# entered only through build_index
__all__ = [
    "Hit",
    "IndexSettings",
    "IndexingError",
    "build_index",
    "open_index",
    "pin_index",
    "corpus",
    "search",
    "settings",
    "shards",
    "versions",
]
