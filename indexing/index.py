"""`open_index`: a consistent, read-only view of one published version, searched in batches.

The version is resolved from `CURRENT` once, at open; everything read afterwards is immutable, so
a build publishing a newer version meanwhile does not change what this object returns.

Opening reads the manifest and checks that the files search reads exist at their recorded sizes
(`index.verify`; sha256 is checked at write and pull, and by `dynrag index verify`): its cost does
not depend on the number of passages. FAISS shards, Lucene and the query encoder load on first use;
passage text is never held: each hit's row is read from its shard's store (store.py). FAISS row ->
passage is (shard, row) arithmetic (dense.ShardSet); a Lucene hit or a looked-up id is found by its id
hash: the version's memory-mapped id map names its shard, whose sorted `ids.npy` gives the row, so a
lookup touches one shard whatever their number. A version published before id maps existed has none:
every shard is then searched in turn, as before (a rebuild publishes a version with one).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from indexing.errors import IndexingError
from indexing.hits import Hit
from indexing.java import cap_jvm_heap
from indexing.manifest import read_manifest, verify_version

if TYPE_CHECKING:
    from indexing.dense import ShardSet
    from indexing.embed import Encoder, HashEncoder
    from indexing.settings import IndexSettings
    from indexing.store import EveryShard, IdShards

log = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")


class SearchError(IndexingError, ValueError):
    """A bad search request (unknown retriever, k < 1)."""


class Index:
    def __init__(self, root: Path, cfg: IndexSettings, manifest: dict):
        from indexing.sparse import LuceneShard, configured_analyzer, index_analyzer
        from indexing.store import EveryShard, IdShards, PassageStore

        self.root, self.cfg, self.manifest = root, cfg, manifest
        self.version = manifest["version"]
        if cfg.index.verify == "size":
            verify_version(root, manifest, full=False, search_only=True)
        self._dirs = [root / "shards" / s["key"] for s in manifest["shards"]]
        self._stores = [PassageStore(d) for d in self._dirs]
        id_map = manifest.get("id_shards")
        self._id_shards: IdShards | EveryShard = (
            IdShards(root / "versions" / f"v{self.version:06d}" / id_map["path"])
            if id_map
            else EveryShard(len(self._dirs))
        )
        if not id_map and len(self._dirs) > 1:
            log.warning(
                "%s version %d has no id map (built by an older dynrag): each id lookup searches all %d shards; "
                "rerun `dynrag index build` to publish a version with one",
                root,
                self.version,
                len(self._dirs),
            )
        self._faiss: ShardSet | None = None
        bm25 = root / "versions" / f"v{self.version:06d}" / manifest["bm25"]["path"]
        self.analyzer = index_analyzer(manifest["settings"])
        wanted = configured_analyzer(cfg.index)
        if wanted != self.analyzer:
            log.warning(
                "the BM25 index was built with analyzer %s, the configuration asks for %s; searching with "
                "the index's (rebuild it to change)",
                self.analyzer,
                wanted,
            )
        cap_jvm_heap(cfg.index.jvm_heap_mb)  # before this process's JVM starts (the searcher starts it)
        self._lucene = LuceneShard(bm25, cfg.index.bm25_k1, cfg.index.bm25_b, self.analyzer)
        self._encoder: Encoder | HashEncoder | None = None
        self._lock = threading.Lock()

    # ---- lookups ----
    def _hit(self, shard: int, row: int, score: float) -> Hit:
        pid, title, text = self._stores[shard].get(row)
        return Hit(id=pid, title=title, text=text, score=float(score))

    def _lookup(self, ids: list[str], score: list[float] | None = None) -> list[Hit | None]:
        """Hits for passage ids (None where this version has none): the id map names each id hash's shard
        (its candidates, in shard order, when ids share a hash), whose store is asked for the row, one call
        per shard for the batch; a candidate row counts once its stored id matches."""
        from indexing.store import id_hashes

        out: list[Hit | None] = [None] * len(ids)
        hashes = id_hashes(ids)
        pos, end = self._id_shards.locate(hashes)
        todo = np.flatnonzero(pos < end)
        while len(todo):
            shards = self._id_shards.shard_at(pos[todo])
            for si in np.unique(shards):
                group = todo[shards == si]
                rows = self._stores[si].find(hashes[group])
                for i, row in zip(group[rows >= 0], rows[rows >= 0]):
                    hit = self._hit(int(si), int(row), score[i] if score else 0.0)
                    if hit.id == ids[i]:
                        out[i] = hit
            pos[todo] += 1  # the next candidate, for an id not found at this one
            todo = np.array([i for i in todo if out[i] is None and pos[i] < end[i]], dtype=np.int64)
        return out

    def passages(self, ids: list[str]) -> list[Hit | None]:
        """Look passages up by id (score 0); None for an id this version does not hold."""
        return self._lookup([str(i) for i in ids])

    # ---- search ----
    def encode_queries(self, queries: list[str]) -> np.ndarray:
        with self._lock:
            if self._encoder is None:
                from indexing.embed import EncoderSpec, get_encoder

                spec = EncoderSpec.from_config(self.cfg)
                want = self.manifest["settings"]["embedding"]
                if spec.model_name != want["model"]:
                    log.warning(
                        "index was embedded with %s but embedding.model is %s; using %s",
                        want["model"],
                        spec.model_name,
                        want["model"],
                    )
                    spec = EncoderSpec(
                        self.cfg.model_path(want["model"]),
                        want["model"],
                        self.cfg.embedding.device,
                        want["dtype"],
                        self.cfg.embedding.batch_size,
                        want["max_seq_length"],
                    )
                self._encoder = get_encoder(spec)
        return self._encoder.encode(queries)

    def search(self, queries: list[str], k: int, retriever: str = "bm25") -> list[list[Hit]]:
        """Top-k hits per query: one FAISS search over all shards (dense), or one pyserini batch_search
        over the version's Lucene index (bm25)."""
        if retriever not in RETRIEVERS:
            raise SearchError(f"unknown retriever {retriever!r}; choose from {', '.join(RETRIEVERS)}")
        if k < 1:
            raise SearchError(f"k must be at least 1, got {k}")
        queries = [str(q) for q in queries]
        if not queries:
            return []
        if retriever == "dense":
            if self.manifest["settings"].get("dense") is False:
                raise SearchError(
                    f"{self.root} is a BM25-only index (built with index.dense=false): search it with "
                    "bm25, or rebuild it with --set index.dense=true"
                )
            S, SH, R = self._shards().search(self.encode_queries(queries), k)
            return [
                [self._hit(int(sh), int(r), s) for s, sh, r in zip(S[i], SH[i], R[i]) if sh >= 0]
                for i in range(len(queries))
            ]
        from indexing.sparse import batch_search

        results = batch_search(self._lucene, queries, k, self.cfg.index.threads)
        flat = [h for hits in results for h in hits]
        found = self._lookup([d for d, _ in flat], [s for _, s in flat])  # one call per shard hit
        if None in found:
            missing = flat[found.index(None)][0]
            raise IndexingError(f"Lucene index {self._lucene.path} returned id {missing!r} missing from the passages")
        ends = np.cumsum([len(hits) for hits in results])
        hits_found = cast("list[Hit]", found)  # no None left: checked above
        return [hits_found[end - len(hits) : end] for hits, end in zip(results, ends)]

    def _shards(self) -> ShardSet:
        """All shards' FAISS indexes (dense.ShardSet), read on first use."""
        with self._lock:
            if self._faiss is None:
                from indexing.dense import load_shards, load_template_quantizer

                i = self.cfg.index
                template = self.manifest.get("faiss_template")
                quantizer = load_template_quantizer(self.root / template["path"]) if template else None
                self._faiss = load_shards(
                    [d / "faiss.index" for d in self._dirs],
                    i.faiss_nprobe,
                    i.faiss_ef_search,
                    quantizer,
                    gpu=self.cfg.faiss_placement,
                )
        return self._faiss

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

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_local_index(index_dir: str | os.PathLike, cfg: IndexSettings, version: str | None = None) -> Index:
    """Open the published version of the local index at `index_dir` (or a named older version, e.g. 'v000002')."""
    from indexing.pinning import resolve_version

    base, version = resolve_version(index_dir, version)
    root = Path(base)
    manifest = read_manifest(root, version)
    log.info(
        "opened %s version %s: %d passages in %d shards",
        root,
        manifest["version"],
        manifest["passages"],
        len(manifest["shards"]),
    )
    return Index(root, cfg, manifest)
