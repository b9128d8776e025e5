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

Search goes through retrievers (retrievers.py: BM25, dense, their fusion `rrf`, and any other registered), each
made once from this index on first use; `resources()` states what they hold (the GPU plan reads it), and
`place_faiss` tells the dense retriever where to load FAISS before it does.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexing.search.hits import Hit
from indexing.search.retrievers import Resources, Retriever, SearchError, make_retriever
from indexing.versions.manifest import read_version_manifest, verify_version
from platform_shims.java import cap_jvm_heap

if TYPE_CHECKING:
    from indexing.settings import IndexSettings
    from indexing.shards.embed import Encoder, HashEncoder
    from indexing.shards.faiss_gpu import IndexPlacement
    from indexing.shards.store import EveryShard, IdShards

log = logging.getLogger(__name__)

READ_THREADS = 32  # passage reads in flight in a large lookup: 10,000 cold hits at 21M took 341 us a hit one at a
# time, 225 us with 16 at once and 160 us with 64 (this machine's virtual disk)

__all__ = ["Index", "SearchError", "open_local_index"]


class Index:
    def __init__(self, root: Path, cfg: IndexSettings, manifest: dict):
        from indexing.shards.sparse import configured_analyzer, index_analyzer
        from indexing.shards.store import EveryShard, IdShards, PassageStore

        self.root, self.cfg, self.manifest = root, cfg, manifest
        self.version = manifest["version"]
        self.version_dir = root / "versions" / f"v{self.version:06d}"
        self.shard_dirs = [root / "shards" / s["key"] for s in manifest["shards"]]
        self._stores = [PassageStore(d) for d in self.shard_dirs]
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
        self._retrievers: dict[str, Retriever] = {}
        self.faiss_placement: IndexPlacement | None = None  # place_faiss: a replica's GPU plan
        self._encoder: Encoder | HashEncoder | None = None
        self._lock = threading.Lock()
        self._readers: ThreadPoolExecutor | None = None  # _read's threads, made on the first large lookup
        self._readers_lock = threading.Lock()  # not _lock: that one is held while the encoder loads
        self._retrievers_lock = threading.RLock()  # fusion makes its parts while making itself
        id_map = manifest.get("id_shards")
        self._id_shards: IdShards | EveryShard = (
            IdShards(self.version_dir / id_map["path"]) if id_map else EveryShard(len(self.shard_dirs))
        )
        if not id_map and len(self.shard_dirs) > 1:
            log.warning(
                "%s version %d has no id map (built by an older dynrag): each id lookup searches all %d shards; "
                "rerun `dynrag index build` to publish a version with one",
                root,
                self.version,
                len(self.shard_dirs),
            )

    # ---- retrievers ----
    @property
    def dense(self) -> bool:
        return self.manifest["settings"].get("dense") is not False

    def retriever(self, name: str) -> Retriever:
        """The retriever `name` over this version, made on first use (retrievers.py)."""
        with self._retrievers_lock:
            if name not in self._retrievers:
                self._retrievers[name] = make_retriever(name, self)
            return self._retrievers[name]

    def resources(self) -> Resources:
        """What searching this version may hold: BM25's, and dense's where the index has vectors."""
        return sum((self.retriever(n).resources() for n in ("bm25", "dense")[: 1 + self.dense]), Resources())

    def place_faiss(self, placement: IndexPlacement | None) -> None:
        """Where dense search loads FAISS (a replica's GPU plan); before its first search only."""
        self.faiss_placement = placement

    # ---- lookups ----
    def hit(self, shard: int, row: int, score: float) -> Hit:
        pid, title, text = self._stores[shard].get(row)
        return Hit(id=pid, title=title, text=text, score=float(score))

    def lookup(self, ids: list[str], score: list[float] | None = None) -> list[Hit | None]:
        """Hits for passage ids (None where this version has none): the id map names each id hash's shard
        (its candidates, in shard order, when ids share a hash), whose store is asked for the row, one call
        per shard for the batch; a candidate row counts once its stored id matches."""
        from indexing.shards.store import id_hashes

        out: list[Hit | None] = [None] * len(ids)
        hashes = id_hashes(ids)
        pos, end = self._id_shards.locate(hashes)
        todo = np.flatnonzero(pos < end)
        while len(todo):
            shards = self._id_shards.shard_at(pos[todo])
            found: list[tuple[int, int, int]] = []  # (id's index, shard, row) of each candidate row
            for si in np.unique(shards):
                group = todo[shards == si]
                rows = self._stores[si].find(hashes[group])
                found += [(int(i), int(si), int(row)) for i, row in zip(group[rows >= 0], rows[rows >= 0])]
            for (i, _, _), hit in zip(found, self._read(found, score)):
                if hit.id == ids[i]:
                    out[i] = hit
            pos[todo] += 1  # the next candidate, for an id not found at this one
            todo = np.array([i for i in todo if out[i] is None and pos[i] < end[i]], dtype=np.int64)
        return out

    def _read(self, found: list[tuple[int, int, int]], score: list[float] | None) -> list[Hit]:
        """The hit of each (id's index, shard, row), in order. A row whose batch is not in the page cache costs one
        random read (0.34 ms on this machine's disk, against 0.035 ms cached: most hits at 21M passages), so a
        large lookup reads in `READ_THREADS` slices at once, whose reads overlap (pyarrow releases the GIL)."""

        def read(part: list[tuple[int, int, int]]) -> list[Hit]:
            return [self.hit(si, row, score[i] if score else 0.0) for i, si, row in part]

        if len(found) < 2 * READ_THREADS:
            return read(found)
        with self._readers_lock:
            if self._readers is None:
                self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="dynrag-passages")
        step = -(-len(found) // READ_THREADS)
        return [
            h
            for part in self._readers.map(read, [found[a : a + step] for a in range(0, len(found), step)])
            for h in part
        ]

    def passages(self, ids: list[str]) -> list[Hit | None]:
        """Look passages up by id (score 0); None for an id this version does not hold."""
        return self.lookup([str(i) for i in ids])

    # ---- search ----
    def encode_queries(self, queries: list[str]) -> np.ndarray:
        with self._lock:
            if self._encoder is None:
                from indexing.shards.embed import EncoderSpec, get_encoder

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
        """Top-k hits per query, one batch, by the retriever `retriever` (retrievers.py)."""
        if k < 1:
            raise SearchError(f"k must be at least 1, got {k}")
        searcher = self.retriever(retriever)
        queries = [str(q) for q in queries]
        return searcher.search(queries, k) if queries else []

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
        with self._retrievers_lock:
            for searcher in self._retrievers.values():
                searcher.close()
            self._retrievers.clear()
        if self._readers is not None:
            self._readers.shutdown()
            self._readers = None

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_local_index(root: Path, cfg: IndexSettings, version: str | None = None) -> Index:
    """Open the published version of the local index at `root` (or a named older version, e.g. 'v000002')."""
    manifest = read_version_manifest(root, version)
    if cfg.index.verify == "size":
        verify_version(root, manifest, full=False, search_only=True)
    log.info(
        "opened %s version %s: %d passages in %d shards",
        root,
        manifest["version"],
        manifest["passages"],
        len(manifest["shards"]),
    )
    return Index(root, cfg, manifest)
