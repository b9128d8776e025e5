"""`open_index`: a consistent, read-only view of one published version, searched in batches.

The version is resolved from `CURRENT` once, at open; everything read afterwards is immutable, so
a build publishing a newer version meanwhile does not change what this object returns. Shard files
are checked against the manifest's checksums at open (`index.verify`), and a mismatch raises
`CorruptIndexError` naming the file. FAISS indexes and passage tables are loaded at open; Lucene
searchers and the query encoder are opened on first use.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from indexing.hits import Hit
from indexing.manifest import read_manifest, verify_shard
from indexing.errors import IndexingError

log = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")


class SearchError(IndexingError, ValueError):
    """A bad search request (unknown retriever, k < 1)."""


class Index:
    def __init__(self, root: Path, cfg, manifest: dict):
        from indexing.dense import ShardSet, load_faiss
        from indexing.shards import read_passages
        from indexing.sparse import LuceneShard

        self.root, self.cfg, self.manifest = root, cfg, manifest
        self.version = manifest["version"]
        self._dirs = [root / "shards" / s["key"] for s in manifest["shards"]]
        full = cfg.index.verify == "checksum"
        for s, d in zip(manifest["shards"], self._dirs):
            verify_shard(d, s["files"], full=full)
        version_dir = root / "versions" / f"v{self.version:06d}"
        verify_shard(version_dir / manifest["bm25"]["path"], manifest["bm25"]["files"], full=full)
        self._tables = [read_passages(d / "passages.parquet") for d in self._dirs]
        self._faiss = ShardSet([load_faiss(d / "faiss.index", cfg.index.faiss_nprobe, cfg.index.faiss_ef_search)
                                for d in self._dirs])
        self._lucene = LuceneShard(version_dir / manifest["bm25"]["path"], cfg.index.bm25_k1, cfg.index.bm25_b)
        self._where: dict[str, tuple[int, int]] | None = None
        self._encoder = None
        self._lock = threading.Lock()

    # ---- lookups ----
    def _hit(self, shard: int, row: int, score: float) -> Hit:
        t = self._tables[shard]
        return Hit(id=t.column("id")[row].as_py(), title=t.column("title")[row].as_py(),
                   text=t.column("text")[row].as_py(), score=float(score))

    def _locate(self, pid: str) -> tuple[int, int] | None:
        """Passage id -> (shard, row); the map is built on first use."""
        if self._where is None:
            with self._lock:
                if self._where is None:
                    self._where = {pid: (si, row) for si, t in enumerate(self._tables)
                                   for row, pid in enumerate(t.column("id").to_pylist())}
        return self._where.get(pid)

    def passages(self, ids: list[str]) -> list[Hit | None]:
        """Look passages up by id (score 0); None for an id this version does not hold."""
        out: list[Hit | None] = []
        for pid in ids:
            where = self._locate(pid)
            out.append(None if where is None else self._hit(where[0], where[1], 0.0))
        return out

    # ---- search ----
    def encode_queries(self, queries: list[str]) -> np.ndarray:
        with self._lock:
            if self._encoder is None:
                from indexing.embed import EncoderSpec, get_encoder

                spec = EncoderSpec.from_config(self.cfg)
                want = self.manifest["settings"]["embedding"]
                if spec.model_name != want["model"]:
                    log.warning("index was embedded with %s but embedding.model is %s; using %s",
                                want["model"], spec.model_name, want["model"])
                    spec = EncoderSpec(self.cfg.model_path(want["model"]), want["model"],
                                       self.cfg.embedding.device, want["dtype"], self.cfg.embedding.batch_size,
                                       want["max_seq_length"])
                self._encoder = get_encoder(spec)
        return self._encoder.encode(queries)

    def search(self, queries: list[str], k: int, retriever: str = "bm25") -> list[list[Hit]]:
        """Top-k hits per query: one FAISS search per shard over all queries, merged exactly by score
        (dense), or one pyserini batch_search over the version's Lucene index (bm25)."""
        if retriever not in RETRIEVERS:
            raise SearchError(f"unknown retriever {retriever!r}; choose from {', '.join(RETRIEVERS)}")
        if k < 1:
            raise SearchError(f"k must be at least 1, got {k}")
        queries = [str(q) for q in queries]
        if not queries:
            return []
        if retriever == "dense":
            S, SH, R = self._faiss.search(self.encode_queries(queries), k)
            return [[self._hit(int(sh), int(r), s) for s, sh, r in zip(S[i], SH[i], R[i]) if sh >= 0]
                    for i in range(len(queries))]
        from indexing.sparse import batch_search

        out = []
        for hits in batch_search(self._lucene, queries, k, self.cfg.index.threads):
            row_hits = []
            for docid, score in hits:
                where = self._locate(docid)
                if where is None:
                    raise IndexingError(f"Lucene index {self._lucene.path} returned id {docid!r} missing from the passages")
                row_hits.append(self._hit(where[0], where[1], score))
            out.append(row_hits)
        return out

    def info(self) -> dict:
        m = self.manifest
        return {
            "index_dir": str(self.root),
            "version": m["version"],
            "created": m["created"],
            "passages": m["passages"],
            "shards": len(m["shards"]),
            "dim": m["dim"],
            "settings": m["settings"],
            "sources": m["sources"],
            "build": m["build"],
            "shard_sizes": [s["passages"] for s in m["shards"]],
        }

    def close(self) -> None:
        self._lucene.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_local_index(index_dir, cfg, version: str | None = None) -> Index:
    """Open the published version of the local index at `index_dir` (or a named older version, e.g. 'v000002')."""
    root = Path(index_dir)
    manifest = read_manifest(root, version)
    log.info("opened %s version %s: %d passages in %d shards", root, manifest["version"], manifest["passages"],
             len(manifest["shards"]))
    return Index(root, cfg, manifest)
