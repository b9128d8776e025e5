"""Sparse shards: one pyserini Lucene index per shard, merged per version for BM25 batch search.

Documents are indexed through Anserini's `SimpleIndexer` (pyserini's jars; JsonCollection documents:
`id` = passage id, `contents` = title + newline + text), one index per shard, so a rebuild
re-analyses only new shards. Each published version then gets one Lucene index that is the
segment-level union of its shards (`IndexWriter.addIndexes`: segment files are copied, nothing
is re-analysed), merged down to `index.bm25_segments` segments (Lucene's per-query cost grows with
the segment count), and searched with one Anserini `batch_search` over all queries. Unlike merging
per-shard results by score, BM25 then uses the corpus-wide term statistics, so results equal
those of one index built over all passages, and the per-query cost does not grow with the number
of shards. The price is a copy of the Lucene segments per version (disk and I/O, no CPU-heavy
analysis). A refresh avoids even that (`update_lucene`): the new version's index links the previous one's
files, deletes the documents of the shards it drops and adds the new shards' segments; the deleted documents
count in BM25's statistics until a merge rewrites their segment, so build.py bounds their share.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platform_shims.java import ensure_java, quiet_java_logs

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
    from pyserini.pyclass import autoclass  # Anserini's SimpleIndexer (pyserini's LuceneIndexer wraps it): importing
    # pyserini.index.lucene costs 2 s (pandas and its table of prebuilt indexes)

    quiet_java_logs()
    if out.exists():
        shutil.rmtree(out)
    args = ["-index", str(out), "-stemmer", analyzer["stemmer"]] + ([] if analyzer["stopwords"] else ["-keepStopwords"])
    args += ["-input", "", "-collection", "JsonCollection", "-threads", str(threads)]
    indexer = autoclass("io.anserini.index.SimpleIndexer")(args)
    n = 0
    batch: list[str] = []  # JSON documents: one JNI call a batch (a dict each took a JNI object per document)
    for doc_id, contents in docs:
        batch.append(json.dumps({"id": doc_id, "contents": contents}))
        if len(batch) >= 5000:
            indexer.addRawDocuments(batch)
            n += len(batch)
            batch = []
    if batch:
        indexer.addRawDocuments(batch)
        n += len(batch)
    indexer.close()
    # one segment: each of `threads` indexing threads writes its own, so their number followed thread timing, and
    # with it which segments a refresh's merge policy merged (and so the deleted documents left in BM25's statistics)
    _write(out, "APPEND", lambda writer, lucene: writer.forceMerge(1))
    return n


class LuceneShard:
    """One Lucene index's searcher (Anserini's SimpleSearcher, the class pyserini's LuceneSearcher wraps), opened on
    first use; queries are analysed as the index was built. Through jnius, not `pyserini.search.lucene`, whose
    import loads transformers and torch for its neural encoders (10 s of every searching process's start)."""

    def __init__(self, path: Path, k1: float, b: float, analyzer: dict = DEFAULT_ANALYZER):
        self.path, self.k1, self.b, self.analyzer = path, k1, b, analyzer
        self._searcher: Any = None  # io.anserini.search.SimpleSearcher

    @property
    def searcher(self) -> Any:
        if self._searcher is None:
            ensure_java()
            from pyserini.analysis import get_lucene_analyzer
            from pyserini.pyclass import autoclass

            quiet_java_logs()
            searcher = autoclass("io.anserini.search.SimpleSearcher")(str(self.path))
            stemmer = self.analyzer["stemmer"]
            searcher.set_analyzer(
                get_lucene_analyzer(stemming=stemmer != "none", stemmer=stemmer, stopwords=self.analyzer["stopwords"])
            )
            searcher.set_bm25(float(self.k1), float(self.b))
            self._searcher = searcher
        return self._searcher

    def batch_search(self, queries: list[str], k: int, threads: int) -> list[list[tuple[str, float]]]:
        searcher = self.searcher  # first: it prepares Java before jnius is imported
        from pyserini.pyclass import JArrayList

        qids = [str(i) for i in range(len(queries))]
        jqueries, jqids = JArrayList(), JArrayList()
        for query, qid in zip(queries, qids):
            jqueries.add(query)
            jqids.add(qid)
        found = searcher.batch_search(jqueries, jqids, int(k), int(threads))
        res = {entry.getKey(): entry.getValue() for entry in found.entrySet().toArray()}
        return [[(h.docid, float(h.score)) for h in res.get(q, [])] for q in qids]

    def close(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None


class _Lucene:
    """Lucene's classes through pyserini's JVM, for writing a version's BM25 index."""

    def __init__(self) -> None:
        ensure_java()
        from pyserini.pyclass import autoclass  # configures the classpath; first: importing jnius starts the JVM

        # isort: split
        from jnius import cast

        self.autoclass, self.cast = autoclass, cast
        self.fs, self.paths = autoclass("org.apache.lucene.store.FSDirectory"), autoclass("java.nio.file.Paths")

    def directory(self, path: Path) -> Any:
        return self.cast("org.apache.lucene.store.Directory", self.fs.open(self.paths.get(str(path))))

    def writer(self, out: Any, mode: str) -> Any:
        """An IndexWriter on the directory `out`, `mode` CREATE or APPEND. Its merges run in the calling thread
        (SerialMergeScheduler): with Lucene's default concurrent scheduler, which segments a refresh merged (and
        so how many deleted documents stay in BM25's statistics, and the scores) depended on thread timing."""
        config = self.autoclass("org.apache.lucene.index.IndexWriterConfig")(
            self.autoclass("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
        )
        config.setOpenMode(getattr(self.autoclass("org.apache.lucene.index.IndexWriterConfig$OpenMode"), mode))
        config.setMergeScheduler(self.autoclass("org.apache.lucene.index.SerialMergeScheduler")())
        return self.autoclass("org.apache.lucene.index.IndexWriter")(out, config)

    def stats(self, directory: Any) -> dict:
        """{"segments", "documents" (live), "deleted"} of the index in `directory`."""
        reader = self.autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        try:
            return {
                "segments": reader.leaves().size(),
                "documents": reader.numDocs(),
                "deleted": reader.numDeletedDocs(),
            }
        finally:
            reader.close()


def start_lucene() -> None:
    """Start the JVM and load Lucene's writer class (what a build's first BM25 step would do)."""
    _Lucene().autoclass("org.apache.lucene.index.IndexWriter")


def _write(out: Path, mode: str, edit: Any) -> dict:
    """Open a writer on `out`, run `edit(writer, lucene)`, commit, close; returns the index's stats."""
    lucene = _Lucene()
    out_dir = lucene.directory(out)
    writer = lucene.writer(out_dir, mode)
    try:
        edit(writer, lucene)
        writer.commit()
    finally:
        writer.close()
    try:
        return lucene.stats(out_dir)
    finally:
        out_dir.close()
        (out / "write.lock").unlink(missing_ok=True)  # an empty marker Lucene leaves behind; not part of the index


def _add_indexes(writer: Any, lucene: _Lucene, shard_indexes: list[Path]) -> None:
    sources = [lucene.directory(d) for d in shard_indexes]
    try:
        if sources:
            writer.addIndexes(*sources)
    finally:
        for d in sources:
            d.close()


def merge_lucene(shard_indexes: list[Path], out: Path, max_segments: int = 0) -> dict:
    """One Lucene index holding the segments of `shard_indexes`, in order (docids follow shard order),
    then force-merged down to `max_segments` segments when that is > 0 (fewer segments, faster search);
    returns its stats (`_Lucene.stats`)."""

    def edit(writer: Any, lucene: _Lucene) -> None:
        _add_indexes(writer, lucene, shard_indexes)
        if max_segments > 0:
            writer.forceMerge(max_segments)

    if out.exists():
        shutil.rmtree(out)
    return _write(out, "CREATE", edit)


def update_lucene(previous: Path, out: Path, delete_ids: Iterable[str], shard_indexes: list[Path]) -> dict:
    """A version's BM25 index made from the previous version's without copying it: `out` gets hard links to
    `previous`'s files (Lucene never rewrites a file), the documents of `delete_ids` are deleted, the segments
    of `shard_indexes` appended, and Lucene's merge policy merges what it finds worth merging. A deleted
    document stays in its segment, and in BM25's document count and mean length, until a merge rewrites
    the segment (build.py bounds their share). Returns the stats (`_Lucene.stats`)."""
    import os

    def edit(writer: Any, lucene: _Lucene) -> None:
        bytes_ref, terms = (
            lucene.autoclass("org.apache.lucene.util.BytesRef"),
            lucene.autoclass("java.util.ArrayList")(),
        )
        for doc_id in delete_ids:
            terms.add(bytes_ref(doc_id.encode("utf-8")))
        if terms.size():
            query = lucene.autoclass("org.apache.lucene.search.TermInSetQuery")("id", terms)
            writer.deleteDocuments(lucene.cast("org.apache.lucene.search.Query", query))
        writer.commit()  # the deletes reach the previous segments only, not the ones added next
        _add_indexes(writer, lucene, shard_indexes)
        writer.maybeMerge()

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in previous.iterdir():
        if f.is_file() and f.name not in ("write.lock", "checksums.json"):
            os.link(f, out / f.name)
    return _write(out, "APPEND", edit)


def batch_search(searcher: LuceneShard, queries: list[str], k: int, threads: int) -> list[list[tuple[str, float]]]:
    """One pyserini batch_search over all non-empty queries; an empty query gets no hits."""
    live = [i for i, q in enumerate(queries) if q.strip()]
    out: list[list[tuple[str, float]]] = [[] for _ in queries]
    if live:
        for i, hits in zip(live, searcher.batch_search([queries[i] for i in live], k, threads)):
            out[i] = hits
    return out
