"""`dynrag index build|search|info|verify`: build or refresh an index, query it, describe it, check it."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)

FORMATS = (
    "auto",
    "dpr-tsv",
    "flashrag-jsonl",
    "jsonl",
    "parquet",
    "hotpotqa",
    "2wiki",
    "musique",
    "wiki-lead-sections",
)


def register(sub: argparse._SubParsersAction) -> None:
    from indexing.search.retrievers import retriever_names
    from jobs.cli import add_config_args, add_job_options

    p = sub.add_parser(
        "index",
        help="build, refresh, search and describe BM25 + FAISS indexes",
        description="Corpus files in, a versioned BM25 (pyserini) + dense (FAISS) index out.",
    )
    isub = p.add_subparsers(dest="index_command", required=True, metavar="ACTION")

    _register_build(isub)

    s = isub.add_parser("search", help="top-k passages for queries, with scores")
    s.add_argument("queries", nargs="+", metavar="QUERY")
    add_job_options(s, index={})
    s.add_argument(
        "--retriever",
        default="both",
        choices=["both", *retriever_names()],
        help="both (default): BM25, and dense where the index has vectors (not one built with index.dense=false); "
        "or one registered retriever (indexing/search/retrievers.py), e.g. rrf: BM25 and dense fused by reciprocal rank",
    )
    s.add_argument("-k", type=int, default=5, help="hits per query (default 5)")
    add_job_options(s, json={"help": "print one JSON list of {query, retriever, hits} instead of text"})
    add_config_args(s)
    s.set_defaults(func=_search)

    i = isub.add_parser("info", help="describe the published version of an index")
    add_job_options(
        i, index={}, json={"help": "print the manifest as JSON, with the search-time BM25 settings under bm25_search"}
    )
    add_config_args(i)
    i.set_defaults(func=_info)

    v = isub.add_parser(
        "verify",
        help="check every file of the published version against its sha256",
        description="The full check that opening skips: sha256 and size of every file of the published "
        "version (a remote index is pulled into the local cache first). Exit 2 names the first bad file.",
    )
    add_job_options(v, index={})
    add_config_args(v)
    v.set_defaults(func=_verify)


def _register_build(isub: argparse._SubParsersAction) -> None:
    """`dynrag index build` and its options."""
    from jobs.cli import add_config_args, add_job_options

    b = isub.add_parser(
        "build",
        help="build an index, or refresh it incrementally when --index already holds one",
        description="Read corpus files or URIs (local, memory://, s3://, gs://), split them into "
        "passages, embed and index them in shards, and publish a new version atomically. "
        "Rerunning on a changed corpus re-embeds only what changed; an interrupted build resumes.",
    )
    g = b.add_argument_group("input")
    g.add_argument("sources", nargs="+", metavar="SOURCE", help="corpus files or URIs, read in this order")
    g.add_argument("--format", default="auto", choices=FORMATS, help="corpus format (default: detect)")
    g.add_argument(
        "--id-field", default=None, help="jsonl/parquet: field holding the id (default id; absent: ids from content)"
    )
    g.add_argument("--title-field", default=None, help="jsonl/parquet: field holding the title (default title)")
    g.add_argument("--text-field", default=None, help="jsonl/parquet: field holding the text (default text)")
    g.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip malformed records (counted and reported) instead of stopping at the first one",
    )
    v = b.add_argument_group("given vectors (instead of embedding)")
    v.add_argument(
        "--vectors",
        metavar="FILE",
        help="take the passages' vectors from FILE, a .npy of shape (records, dim) (float32 or float16) or a "
        "FAISS Flat index, whose row i belongs to the corpus's i-th record (a bad line skipped keeps its row); "
        "nothing is embedded. In-process builds only",
    )
    v.add_argument(
        "--vectors-model",
        metavar="MODEL",
        help="the model that made the --vectors (required with them): it encodes the queries (sets embedding.model)",
    )
    v.add_argument(
        "--normalize-vectors",
        action="store_true",
        help="L2-normalise the --vectors (default: kept as given, so inner product is the model's own score)",
    )
    o = b.add_argument_group("output")
    add_job_options(o, index={"help": "index directory (created, or refreshed)"})
    add_config_args(b)
    b.set_defaults(func=_build)


def _quiet() -> None:
    for name in ("faiss", "faiss.loader", "jnius"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _build(args: argparse.Namespace) -> int:
    from indexing import build_index
    from jobs.cli import config_from_args
    from pipeline.errors import DynragError

    if (args.vectors is None) != (args.vectors_model is None) or (args.normalize_vectors and not args.vectors):
        raise DynragError(
            "--vectors FILE and --vectors-model MODEL go together (the model that made the vectors encodes "
            "the queries); --normalize-vectors needs them"
        )
    if args.vectors_model is not None:
        args.overrides = [*args.overrides, f"embedding.model={args.vectors_model}"]
    cfg = config_from_args(args)
    _quiet()
    fields = {k: v for k, v in (("id", args.id_field), ("title", args.title_field), ("text", args.text_field)) if v}
    report = build_index(
        args.sources,
        args.index,
        cfg.index_settings(),
        fmt=args.format,
        fields=fields or None,
        on_bad_line="skip" if args.skip_bad_lines else "error",
        **({"vectors": args.vectors, "normalize_vectors": args.normalize_vectors} if args.vectors else {}),
    )
    state = "published" if report["published"] else "unchanged, still"
    print(
        f"{args.index}: {state} version {report['version']}: {report['passages']} passages in {report['shards']} shards "
        f"({report['shards_reused']} reused, {report['shards_built']} built, {report['shards_reembedded']} re-embedded); "
        f"{report['passages_embedded']} passages embedded, {report['vectors_reused']} vectors reused; "
        f"{report['duplicates_merged']} duplicates merged; {report['bad_lines_skipped']} bad lines skipped; "
        f"{report['seconds']:.1f}s"
    )
    if "vectors" in report:
        v = report["vectors"]
        print(f"  vectors from {v['file']} ({v['rows']} rows of {v['dim']} {v['dtype']}): {v['taken']} taken")
    for where in report["skipped_examples"]:
        print(f"  skipped {where}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from indexing import open_index
    from jobs.cli import config_from_args
    from pipeline.errors import DynragError, first_line

    cfg = config_from_args(args)
    _quiet()
    found: list[dict] = []  # with --json: one list of {query, retriever, hits}
    with open_index(args.index, cfg.index_settings()) as index:
        dense = index.manifest["settings"].get("dense", True)
        retrievers = ["bm25", "dense"][: 1 + dense] if args.retriever == "both" else [args.retriever]
        for retriever in retrievers:
            try:
                results = index.search(args.queries, k=args.k, retriever=retriever)
            except RuntimeError as exc:  # e.g. FAISS reading a damaged file that has the right size
                raise DynragError(f"cannot search {args.index} ({retriever}): {first_line(exc)}") from exc
            for query, hits in zip(args.queries, results):
                if args.json:
                    found.append({"query": query, "retriever": retriever, "hits": [h.__dict__ for h in hits]})
                    continue
                print(f"[{retriever}] {query}")
                for rank, h in enumerate(hits, 1):
                    text = h.text if len(h.text) <= 160 else h.text[:157] + "..."
                    print(f"  {rank:2d}. {h.score:8.4f}  {h.id}  {h.title}: {text}")
    if args.json:
        from jobs.jsonout import emit

        emit(found, ensure_ascii=False)
    return 0


def bm25_settings(cfg, manifest: dict) -> dict:
    """What BM25 scores with: k1 and b from the configuration (Anserini's defaults 0.9, 0.4), and the analyzer
    the index was built with (index.bm25_stemmer, index.bm25_stopwords at build time)."""
    from indexing.shards.sparse import index_analyzer

    return {"k1": cfg.index.bm25_k1, "b": cfg.index.bm25_b, **index_analyzer(manifest["settings"])}


def _info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from indexing.versions.manifest import read_manifest
    from indexing.versions.remote import is_remote, remote_manifest
    from jobs.cli import config_from_args

    m = remote_manifest(args.index) if is_remote(args.index) else read_manifest(Path(args.index))  # pinned too
    bm25 = bm25_settings(config_from_args(args), m)
    if args.json:
        from jobs.jsonout import emit

        emit({**m, "bm25_search": bm25}, indent=1)  # the manifest's own "bm25" is its BM25 index
        return 0
    sizes = [s["passages"] for s in m["shards"]]
    st, b = m["settings"], m["build"]
    print(f"index {args.index}, version {m['version']} ({m['created']})")
    print(f"  passages   {m['passages']} in {len(sizes)} shards (min {min(sizes)}, max {max(sizes)})")
    given = " (vectors given" + (", L2-normalised)" if st["embedding"].get("normalize") else ")")
    print(
        f"  embedding  {st['embedding']['model']}{given if st['embedding'].get('given') else ''} "
        f"({st['embedding']['dtype']}, dim {m['dim']}); "
        f"FAISS {st['faiss_factory']}; BM25 Lucene per shard, merged per version"
    )
    print(f"  passages   {st['passage_words']} words max; shard_size {st['shard_size']}")
    print(f"  sources    {', '.join(m['sources'])}")
    stop = "English stop words dropped" if bm25["stopwords"] else "stop words kept"
    print(
        f"  BM25       k1 {bm25['k1']}, b {bm25['b']} (search time: index.bm25_k1, index.bm25_b); analyzer: Lucene "
        f"English, stemmer {bm25['stemmer']}, {stop} (built with index.bm25_stemmer, index.bm25_stopwords)"
    )
    print(
        f"  last build {b['shards_built']} shards built ({b['shards_reembedded']} re-embedded), "
        f"{b['shards_reused']} reused; {b['passages_embedded']} passages embedded, {b['vectors_reused']} vectors reused"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from indexing.versions.manifest import read_manifest, verify_version
    from indexing.versions.remote import is_remote, pull_version
    from jobs.cli import config_from_args

    if is_remote(args.index):
        root, manifest = pull_version(args.index, config_from_args(args).index_settings())
    else:  # a folder, or a version of it (`DIR@v000003`)
        from indexing.versions.pinning import split_pin

        root = Path(split_pin(args.index)[0])
        manifest = read_manifest(Path(args.index))
    files, size = verify_version(root, manifest, full=True)
    print(f"{args.index}: version {manifest['version']}: {files} files ({size / 2**20:.1f} MiB) match their sha256")
    return 0
