"""`dynrag bench scale`: what an index of N passages costs, per passage, so that sizes can be compared.

1. corpus: N synthetic Wikipedia-like passages, each 100 words drawn (seeded) from the words of one
   of the 10,033 packaged lead sections (pipeline/assets/embedded.py), titled by that article.
2. build (this process, `runtime.mode` as configured): seconds per 1,000 passages by stage, and the
   published version's bytes per passage on disk by file.
3. search (a fresh process, so that its memory is the index's): the process first loads its
   libraries, the JVM and the encoder on a 1,000-passage warm-up index, then opens the index (timed),
   answers 1,000 BM25 and 1,000 dense queries (first sentence words of random lead sections, k=10,
   one batch each) and reports RSS after minus RSS before opening (its JVM has a fixed 512 MiB heap,
   committed before that first reading: see `_probe`). FAISS's share is the size of the
   `faiss.index` files (what FAISS holds in memory); `resident_bytes_per_passage` is the rest / N.

`--encoder hash` (indexing.embed.HashEncoder) is a deterministic feature-hashing test encoder, not
a language model: it measures everything but embedding at sizes a CPU cannot embed; the default is
the configured `embedding.model` (MiniLM).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARM_PASSAGES = 1000
QUERIES = 1000
JVM_HEAP_MB = 512


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = bsub.add_parser(
        "scale",
        help="build and search an index of N synthetic passages; costs per passage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--passages", type=int, required=True, metavar="N", help="passages in the index")
    p.add_argument(
        "--encoder",
        default=None,
        metavar="NAME",
        help="embedding model: 'hash' (a cheap deterministic test encoder) or a model name "
        "(default: the configured embedding.model)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--workdir", default=None, help="where to build (default: a temporary directory, removed after)")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.errors import DynragError

    if args.passages < 1:
        raise DynragError(f"--passages must be at least 1, got {args.passages}")
    cfg = config_from_args(args)
    if args.encoder:
        cfg.embedding.model = args.encoder
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        result = _run(args.passages, cfg, Path(args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="dynrag-bench-scale-") as tmp:
            result = _run(args.passages, cfg, Path(tmp))
    print(json.dumps(result) if args.json else _text(result))
    return 0


def _articles(cfg) -> list[tuple[str, list[str]]]:
    from pipeline.assets.embedded import wikipedia_lead_sections

    sections = json.loads(wikipedia_lead_sections(cfg.paths.cache_dir).read_text(encoding="utf-8"))
    return [(v["title"], v["extract"].split()) for _, v in sorted(sections.items()) if len(v["extract"].split()) >= 10]


def write_corpus(path: Path, n: int, articles, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            title, words = articles[rng.randrange(len(articles))]
            f.write(
                json.dumps({"id": f"syn{seed}-{i}", "title": title, "text": " ".join(rng.choices(words, k=100))}) + "\n"
            )


def _run(n: int, cfg, work: Path) -> dict:
    import shutil

    from indexing import build_index

    for old in ("index", "warm"):  # always a fresh build
        shutil.rmtree(work / old, ignore_errors=True)
    articles = _articles(cfg)
    write_corpus(work / "corpus.jsonl", n, articles)
    write_corpus(work / "warm.jsonl", WARM_PASSAGES, articles, seed=1)
    rng = random.Random(2)
    (work / "queries.json").write_text(json.dumps([" ".join(w[:12]) for _, w in rng.choices(articles, k=QUERIES)]))
    settings = cfg.index_settings()
    build_index([str(work / "warm.jsonl")], work / "warm", settings)  # loads the encoder and the JVM
    report = build_index([str(work / "corpus.jsonl")], work / "index", settings)
    stages = ("passages_s", "embed_s", "faiss_s", "lucene_s", "checksum_s", "bm25_merge_s", "id_map_s")
    build = {k.removesuffix("_s"): round(1000 * report.get(k, 0.0) / n, 4) for k in stages}
    build["other"] = round(1000 * report["seconds"] / n - sum(build.values()), 4)
    disk = _disk(work / "index")
    probe = subprocess.run(
        [sys.executable, "-m", "jobs.bench.scale", str(work), str(n)],
        check=True,
        input=json.dumps(cfg.model_dump(mode="json")),
        capture_output=True,
        text=True,
    )
    measured = json.loads(probe.stdout.strip().splitlines()[-1])
    return {
        "passages": n,
        "encoder": cfg.embedding.model,
        "shards": report["shards"],
        "build_s_per_1k": round(1000 * report["seconds"] / n, 4),
        "build_s_per_1k_by_stage": build,
        "disk_bytes_per_passage": round(sum(disk.values()) / n, 1),
        "disk_bytes_per_passage_by_file": {k: round(v / n, 1) for k, v in disk.items()},
        **measured,
        "resident_bytes_per_passage": round((measured["rss_delta_bytes"] - measured["faiss_bytes"]) / n, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _disk(root: Path) -> dict[str, int]:
    """Bytes of the published version by kind of file (what `index.keep_versions=1` would keep)."""
    from indexing.manifest import read_manifest, version_files

    out: dict[str, int] = {}
    for rel, files in version_files(read_manifest(root)):
        for name, meta in files.items():
            version_kind = "id map (version)" if rel.endswith("/id_shards") else "bm25 (version)"
            kind = version_kind if rel.startswith("versions") else name.split("/")[0]
            out[kind] = out.get(kind, 0) + meta["bytes"]
    return out


def _probe(work: Path, n: int, cfg_json: dict) -> dict:
    """Run in a fresh process: RSS of opening the index and answering the queries. The JVM gets a fixed
    heap, committed at its start (before the reading 'before'), as a long-lived holder's should have:
    by default its heap grows with each BM25 batch's garbage towards a quarter of the machine's RAM."""
    import gc

    from indexing import open_index
    from indexing.java import bound_jvm_memory, ensure_java
    from pipeline.config import DynragConfig

    ensure_java()
    bound_jvm_memory(JVM_HEAP_MB)
    settings = DynragConfig.model_validate(cfg_json).index_settings()
    queries = json.loads((work / "queries.json").read_text())
    with open_index(work / "warm", settings) as warm:
        for retriever in ("bm25", "dense"):
            warm.search(queries, k=10, retriever=retriever)
    gc.collect()
    before = _status()
    t0 = time.perf_counter()
    index = open_index(work / "index", settings)
    open_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    index.search(queries[:1], k=10, retriever="dense")  # reads the FAISS shards
    first_dense_s = time.perf_counter() - t1
    timings = {}
    for retriever in ("bm25", "dense"):
        t = time.perf_counter()
        index.search(queries, k=10, retriever=retriever)
        timings[retriever] = time.perf_counter() - t
    gc.collect()
    after = _status()
    from indexing.native_memory import release_free_memory

    release_free_memory()  # what of the growth malloc only kept as free pages (search scratch)
    trimmed = _status()
    faiss_bytes = sum(p.stat().st_size for p in (work / "index").glob("shards/*/faiss.index"))
    index.close()
    return {
        "open_s": round(open_s, 4),
        "first_dense_query_s": round(first_dense_s, 3),
        "bm25_s_per_1k_queries": round(timings["bm25"] * 1000 / len(queries), 3),
        "dense_s_per_1k_queries": round(timings["dense"] * 1000 / len(queries), 3),
        "rss_before_open_bytes": before["VmRSS"],
        "rss_delta_bytes": after["VmRSS"] - before["VmRSS"],
        "rss_delta_anon_bytes": after["RssAnon"] - before["RssAnon"],
        "rss_delta_file_bytes": after["RssFile"] - before["RssFile"],
        "rss_delta_after_malloc_trim_bytes": trimmed["VmRSS"] - before["VmRSS"],
        "faiss_bytes": faiss_bytes,
        "faiss_bytes_per_passage": round(faiss_bytes / n, 1),
    }


def _status() -> dict[str, int]:
    """This process's resident bytes: all, anonymous (heap), file-backed (mapped files)."""
    with open("/proc/self/status") as f:
        return {
            k: int(v.split()[0]) * 1024 for k, v in (x.split(":", 1) for x in f) if k in ("VmRSS", "RssAnon", "RssFile")
        }


def _text(r: dict) -> str:
    stages = ", ".join(f"{k} {v:.3f}" for k, v in r["build_s_per_1k_by_stage"].items())
    files = ", ".join(f"{k} {v:.0f}" for k, v in r["disk_bytes_per_passage_by_file"].items())
    return "\n".join(
        [
            f"passages {r['passages']} ({r['shards']} shards), encoder {r['encoder']}, load average {r['load_average']}",
            f"build       {r['build_s_per_1k']:.3f} s per 1,000 passages ({stages})",
            f"disk        {r['disk_bytes_per_passage']:.0f} bytes per passage ({files})",
            f"open        {r['open_s']:.3f} s; first dense query (reads FAISS) {r['first_dense_query_s']:.2f} s",
            f"search      BM25 {r['bm25_s_per_1k_queries']:.2f} s, dense {r['dense_s_per_1k_queries']:.2f} s per 1,000 queries (k=10)",
            f"resident    {r['resident_bytes_per_passage']:.1f} bytes per passage beyond FAISS "
            f"(RSS +{r['rss_delta_bytes'] / 2**20:.1f} MiB after open + 2,000 queries: anonymous "
            f"+{r['rss_delta_anon_bytes'] / 2**20:.1f}, mapped files +{r['rss_delta_file_bytes'] / 2**20:.1f}; "
            f"FAISS {r['faiss_bytes'] / 2**20:.1f} MiB = {r['faiss_bytes_per_passage']:.0f} bytes per passage; "
            f"+{r['rss_delta_after_malloc_trim_bytes'] / 2**20:.1f} MiB once malloc returned its free pages)",
        ]
    )


if __name__ == "__main__":  # the measuring process: python -m jobs.bench.scale WORKDIR N < config.json
    print(json.dumps(_probe(Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.stdin.read()))))
