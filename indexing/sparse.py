"""Sparse shards: one pyserini Lucene index per shard, merged per version for BM25 batch search.

Documents are indexed through pyserini's `LuceneIndexer` (Anserini's JsonCollection documents:
`id` = passage id, `contents` = title + newline + text), one index per shard, so a rebuild
re-analyses only new shards. Each published version then gets one Lucene index that is the
segment-level union of its shards (`IndexWriter.addIndexes`: segment files are copied, nothing
is re-analysed), merged down to `index.bm25_segments` segments (Lucene's per-query cost grows with
the segment count), and searched with one pyserini `batch_search` over all queries. Unlike merging
per-shard results by score, BM25 then uses the corpus-wide term statistics, so results equal
those of one index built over all passages, and the per-query cost does not grow with the number
of shards. The price is a copy of the Lucene segments per version (disk and I/O, no CPU-heavy
analysis).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexing.java import ensure_java, quiet_java_logs

if TYPE_CHECKING:
    from indexing.settings import IndexConfig

log = logging.getLogger(__name__)


DEFAULT_ANALYZER = {"stemmer": "porter", "stopwords": True}  # Anserini's and pyserini's default English analyzer


def configured_analyzer(index_config: IndexConfig) -> dict:
    """The analyzer the `index` section asks for (index.bm25_stemmer, index.bm25_stopwords)."""
    return {"stemmer": index_config.bm25_stemmer, "stopwords": index_config.bm25_stopwords}


def index_analyzer(settings: dict) -> dict:
    """The analyzer an index was built with (its manifest's settings; indexes from before the setting: the default)."""
    return settings.get("lucene", {}).get("analyzer", DEFAULT_ANALYZER)


def build_lucene(docs: Iterable[tuple[str, str]], out: Path, threads: int, analyzer: dict = DEFAULT_ANALYZER) -> int:
    """Index (id, contents) pairs into a fresh Lucene index at `out` with `analyzer` (Anserini's English
    analyzer: `stemmer` porter, krovetz or none; `stopwords` dropped or kept); return the document count."""
    ensure_java()
    from pyserini.index.lucene import LuceneIndexer

    quiet_java_logs()
    if out.exists():
        shutil.rmtree(out)
    args = ["-index", str(out), "-stemmer", analyzer["stemmer"]] + ([] if analyzer["stopwords"] else ["-keepStopwords"])
    indexer = LuceneIndexer(str(out), args=args, threads=threads)
    n = 0
    batch: list[dict] = []
    for doc_id, contents in docs:
        batch.append({"id": doc_id, "contents": contents})
        if len(batch) >= 5000:
            indexer.add_batch_dict(batch)
            n += len(batch)
            batch = []
    if batch:
        indexer.add_batch_dict(batch)
        n += len(batch)
    indexer.close()
    lock = out / "write.lock"
    if lock.exists():
        lock.unlink()  # an empty marker Lucene leaves behind; not part of the index
    return n


class LuceneShard:
    """One Lucene index's searcher, opened on first use; queries are analysed as the index was built."""

    def __init__(self, path: Path, k1: float, b: float, analyzer: dict = DEFAULT_ANALYZER):
        self.path, self.k1, self.b, self.analyzer = path, k1, b, analyzer
        self._searcher: Any = None  # pyserini's LuceneSearcher

    @property
    def searcher(self) -> Any:
        if self._searcher is None:
            ensure_java()
            from pyserini.analysis import get_lucene_analyzer
            from pyserini.search.lucene import LuceneSearcher

            quiet_java_logs()
            self._searcher = LuceneSearcher(str(self.path))
            stemmer = self.analyzer["stemmer"]
            self._searcher.set_analyzer(
                get_lucene_analyzer(stemming=stemmer != "none", stemmer=stemmer, stopwords=self.analyzer["stopwords"])
            )
            self._searcher.set_bm25(self.k1, self.b)
        return self._searcher

    def batch_search(self, queries: list[str], k: int, threads: int) -> list[list[tuple[str, float]]]:
        qids = [str(i) for i in range(len(queries))]
        res = self.searcher.batch_search(queries, qids, k=k, threads=threads)
        return [[(h.docid, float(h.score)) for h in res.get(q, [])] for q in qids]

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None


def merge_lucene(shard_indexes: list[Path], out: Path, max_segments: int = 0) -> None:
    """One Lucene index holding the segments of `shard_indexes`, in order (docids follow shard order),
    then force-merged down to `max_segments` segments when that is > 0 (fewer segments, faster search)."""
    ensure_java()
    from pyserini.pyclass import autoclass  # configures the classpath; first: importing jnius starts the JVM

    # isort: split
    from jnius import cast

    fs = autoclass("org.apache.lucene.store.FSDirectory")
    paths = autoclass("java.nio.file.Paths")
    config = autoclass("org.apache.lucene.index.IndexWriterConfig")(
        autoclass("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
    )
    config.setOpenMode(autoclass("org.apache.lucene.index.IndexWriterConfig$OpenMode").CREATE)
    if out.exists():
        shutil.rmtree(out)
    out_dir = fs.open(paths.get(str(out)))
    writer = autoclass("org.apache.lucene.index.IndexWriter")(out_dir, config)
    sources = [cast("org.apache.lucene.store.Directory", fs.open(paths.get(str(d)))) for d in shard_indexes]
    try:
        writer.addIndexes(*sources)
        if max_segments > 0:
            writer.forceMerge(max_segments)
        writer.commit()
    finally:
        writer.close()
        for d in sources:
            d.close()
        out_dir.close()
    lock = out / "write.lock"
    if lock.exists():
        lock.unlink()


def batch_search(searcher: LuceneShard, queries: list[str], k: int, threads: int) -> list[list[tuple[str, float]]]:
    """One pyserini batch_search over all non-empty queries; an empty query gets no hits."""
    live = [i for i, q in enumerate(queries) if q.strip()]
    out: list[list[tuple[str, float]]] = [[] for _ in queries]
    if live:
        for i, hits in zip(live, searcher.batch_search([queries[i] for i in live], k, threads)):
            out[i] = hits
    return out
