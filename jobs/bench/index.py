"""`dynrag bench index`: the indexing figures of the "Indexing" issue, measured in one run.

1. incremental rebuild time after appending 1% of passages / full build time (the full build is of
   the first 99%, so the ratio slightly overstates the incremental cost; the builds' embedding is in their
   `embed_s`).
2. BM25 batch search q/s through `Index.search` (which returns `Hit`s with text) / pyserini's own
   `LuceneSearcher.batch_search` over one Lucene index of the same passages built by pyserini's
   indexer, same threads and k, alternated; pyserini timed bare, and again with reading each hit's
   docid and score (which any caller must do).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from jobs.bench.rig.rss import GIB, TreeRss

log = logging.getLogger(__name__)


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = bsub.add_parser(
        "index",
        help="incremental rebuild and BM25 search figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sources", nargs="*", metavar="SOURCE", help="corpus files (default: <data_dir>/hotpotqa/dev_400.jsonl)"
    )
    p.add_argument("--passages", type=int, default=2000, help="use the first N passages of the sources (default 2000)")
    p.add_argument("--shard-size", type=int, default=500, help="index.shard_size for the builds (default 500)")
    p.add_argument("--queries", type=int, default=400, help="BM25 queries (HotpotQA dev questions; default 400)")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--search-repeats", type=int, default=5, help="alternated repeats of the BM25 timings")
    p.add_argument("--workdir", default=None, help="where to build (default: a temporary directory, removed after)")
    add_config_args(p)
    p.set_defaults(func=run)


def _bm25_rates(args, cfg, work: Path, passages: list, index_dir: Path, mem: TreeRss):
    """Queries a second of each repeat: Index.search, pyserini over one Lucene index of the same passages, and
    pyserini reading its hits."""
    from pyserini.search.lucene import LuceneSearcher

    from indexing import open_index
    from indexing.shards.embed import embed_input
    from indexing.shards.sparse import build_lucene

    queries = _queries(cfg, args.queries)
    single = work / "lucene_single"
    build_lucene(((p.id, embed_input(p.title, p.text)) for p in passages), single, cfg.index.threads)
    searcher = LuceneSearcher(str(single))
    searcher.set_bm25(cfg.index.bm25_k1, cfg.index.bm25_b)
    qids = [str(i) for i in range(len(queries))]
    ours_rates, theirs_rates, read_rates = [], [], []
    with open_index(index_dir, cfg.index_settings()) as index:
        index.search(queries, k=args.k, retriever="bm25")  # warm up both (JVM JIT, OS caches)
        searcher.batch_search(queries, qids, k=args.k, threads=cfg.index.threads)
        for _ in range(args.search_repeats):
            mem.phase = "bm25_dynrag"
            t = time.perf_counter()
            index.search(queries, k=args.k, retriever="bm25")
            ours_rates.append(len(queries) / (time.perf_counter() - t))
            mem.phase = "bm25_pyserini"
            t = time.perf_counter()
            searcher.batch_search(queries, qids, k=args.k, threads=cfg.index.threads)
            theirs_rates.append(len(queries) / (time.perf_counter() - t))
            t = time.perf_counter()
            res = searcher.batch_search(queries, qids, k=args.k, threads=cfg.index.threads)
            _ = [[(h.docid, h.score) for h in res[q]] for q in qids]
            read_rates.append(len(queries) / (time.perf_counter() - t))
            print(
                f"  bm25: dynrag {ours_rates[-1]:.0f} q/s ({index.info()['shards']} shards), pyserini "
                f"{theirs_rates[-1]:.0f} q/s bare, {read_rates[-1]:.0f} q/s reading hits (1 index)",
                flush=True,
            )
    searcher.close()
    return ours_rates, theirs_rates, read_rates


def _queries(cfg, n: int) -> list[str]:
    path = Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl"
    qs = [json.loads(line)["question_text"] for line in path.read_text(encoding="utf-8").splitlines()]
    return (qs * (n // len(qs) + 1))[:n]


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    cfg.index.shard_size = args.shard_size
    for name in ("faiss", "faiss.loader", "sentence_transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    sources = args.sources or [str(Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl")]
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return _run(args, cfg, sources, Path(args.workdir))
    with tempfile.TemporaryDirectory(prefix="dynrag-bench-index-") as tmp:
        return _run(args, cfg, sources, Path(tmp))


def _run(args, cfg, sources: list[str], work: Path) -> int:
    import itertools

    from indexing import build_index
    from indexing.corpus.passages import passages_of
    from indexing.corpus.readers import read_corpus
    from platform_shims.java import ensure_java

    # corpus: the first N passages, as generic JSONL (99% and 100%)
    records = itertools.chain.from_iterable(read_corpus(s) for s in sources)
    passages = list(itertools.islice(passages_of(records, cfg.index.passage_words), args.passages))
    n, n99 = len(passages), int(round(len(passages) * 0.99))
    rows = [{"id": p.id, "title": p.title, "text": p.text} for p in passages]
    for name, part in (("corpus_99.jsonl", rows[:n99]), ("corpus_100.jsonl", rows)):
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    print(
        f"corpus: {n} passages from {', '.join(sources)}; mode={cfg.runtime.mode}, model={cfg.embedding.model}, "
        f"dtype={cfg.embedding.dtype}, batch={cfg.embedding.batch_size}, shard_size={cfg.index.shard_size}, "
        f"threads={cfg.index.threads}",
        flush=True,
    )

    mem = TreeRss().start()  # peak RSS of this process tree per phase (one process: later phases include earlier)

    # 1. full build (99%) then incremental (+1%)
    ensure_java()
    from pyserini.search.lucene import LuceneSearcher  # noqa: F401  (starts the JVM before timing either build)

    index_dir = work / "index"
    t = time.perf_counter()
    full = build_index([str(work / "corpus_99.jsonl")], str(index_dir), cfg.index_settings())
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    inc = build_index([str(work / "corpus_100.jsonl")], str(index_dir), cfg.index_settings())
    t_inc = time.perf_counter() - t
    print(
        f"  full build ({n99} passages, {full['shards']} shards): {t_full:.1f}s; incremental (+{n - n99} passages): "
        f"{t_inc:.2f}s, {inc['shards_reused']}/{inc['shards']} shards reused, {inc['shards_reembedded']} re-embedded, "
        f"{inc['passages_embedded']} passages embedded",
        flush=True,
    )
    stages = ("passages_s", "embed_s", "embed_and_index_s", "bm25_merge_s")
    print(
        "    full stages: "
        + ", ".join(f"{k} {full.get(k, 0):.2f}" for k in stages)
        + "; incremental stages: "
        + ", ".join(f"{k} {inc.get(k, 0):.2f}" for k in stages),
        flush=True,
    )

    # 2. BM25 batch search: Index.search vs pyserini over one Lucene index of the same passages
    ours_rates, theirs_rates, read_rates = _bm25_rates(args, cfg, work, passages, index_dir, mem)
    mem.stop()
    rss = {k: f"{v / GIB:.2f}" for k, v in mem.peaks.items()}
    bm25_ratio = statistics.median(ours_rates) / statistics.median(theirs_rates)
    bm25_read_ratio = statistics.median(ours_rates) / statistics.median(read_rates)

    print(f"incremental (+1%) / full build time:    {t_inc / t_full:.3f}  (goal <= 0.05; {t_inc:.2f}s / {t_full:.1f}s)")
    print(
        f"BM25 batch search / pyserini, {cfg.index.threads} thr:  {bm25_ratio:.3f}  (medians "
        f"{statistics.median(ours_rates):.0f} / {statistics.median(theirs_rates):.0f} q/s, k={args.k}); "
        f"/ pyserini reading hits: {bm25_read_ratio:.3f}"
    )
    print(
        f"peak RSS GiB (this process tree, one process for both sides, so a later phase includes what earlier "
        f"ones loaded): BM25 dynrag "
        f"{rss.get('bm25_dynrag')}, pyserini {rss.get('bm25_pyserini')}"
    )
    return 0
