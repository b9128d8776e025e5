"""The processes `dynrag bench scale` measures, each started fresh so that only its own work is in its
figures: `python -m jobs.bench.rig.scale_child build|probe SPEC.json` prints one JSON line (its result).

- build: builds each (sources, index) of the spec in turn (the first, a small warm-up index, loads the
  encoder and the JVM; without one, as for the incremental build, the JVM is started first) and prints the
  builds' reports; the bench samples this process tree's RSS.
- probe: an index holder. It loads its libraries, the JVM (fixed 512 MiB heap, committed at its start,
  as a long-lived holder's should be: by default the heap grows with each BM25 batch's garbage towards a
  quarter of the machine's RAM) and the encoder on the warm-up index, reads its memory, opens the index
  (timed), answers the queries in batches with BM25 and then dense, and reads its memory again
  (/proc/self/smaps_rollup: Rss, of it Anonymous; file-backed = the rest, mapped index files).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

JVM_HEAP_MB = 512
K = 10


def _settings(spec: dict, **index: object):
    from pipeline.config import DynragConfig

    settings = DynragConfig.model_validate(spec["config"]).index_settings()
    for name, value in index.items():
        setattr(settings.index, name, value)
    return settings


def build(spec: dict) -> list[dict]:
    from indexing import build_index

    settings = _settings(spec)
    warm = _settings(spec, faiss_factory="Flat")  # an IVF factory cannot train on the warm-up's few passages
    if not spec.get("warm_first"):  # no warm-up build: the JVM starts before the timed one, as it would there
        from indexing.shards.sparse import start_lucene

        start_lucene()
    return [
        build_index(sources, index_dir, warm if i == 0 and spec.get("warm_first") else settings)
        for i, (sources, index_dir) in enumerate(spec["builds"])
    ]


def memory() -> dict[str, int]:
    """This process's resident bytes: all, anonymous (heap), file-backed (mapped files and shared memory)."""
    with open("/proc/self/smaps_rollup") as f:
        kb = {k: int(v.split()[0]) for k, v in (x.split(":", 1) for x in f if ":" in x and x[0].isupper())}
    return {"rss": kb["Rss"] * 1024, "anon": kb["Anonymous"] * 1024, "file": (kb["Rss"] - kb["Anonymous"]) * 1024}


def _search_all(index, queries: list[str], batch: int, retriever: str) -> float:
    from tqdm import tqdm

    t = time.perf_counter()
    for i in tqdm(range(0, len(queries), batch), desc=retriever, unit="batch", disable=None, leave=False):
        index.search(queries[i : i + batch], k=K, retriever=retriever)
    return time.perf_counter() - t


def probe(spec: dict) -> dict:
    from indexing import open_index
    from indexing.shards.native_memory import release_free_memory
    from platform_shims.java import bound_jvm_memory, ensure_java

    ensure_java()
    bound_jvm_memory(JVM_HEAP_MB, c1_only=False)  # search on the JIT a user's process has (C2: BM25 ~1.8x faster)
    settings = _settings(spec)
    warm_settings = _settings(spec, faiss_factory="Flat")
    queries = json.loads(Path(spec["queries"]).read_text(encoding="utf-8"))[: spec["limit"]]
    with open_index(spec["warm_index"], warm_settings) as warm:
        for retriever in ("bm25", "dense"):
            warm.search(queries[: spec["batch"]], k=K, retriever=retriever)
    gc.collect()
    before = memory()
    t0 = time.perf_counter()
    index = open_index(spec["index"], settings)
    open_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    index.search(queries[:1], k=K, retriever="dense")  # reads the FAISS shards
    first_dense_s = time.perf_counter() - t1
    seconds = {r: _search_all(index, queries, spec["batch"], r) for r in ("bm25", "dense")}
    gc.collect()
    after = memory()
    release_free_memory()  # what of the growth malloc only kept as free pages (search scratch)
    trimmed = memory()
    m = index.manifest  # FAISS holds its files: the shards' and the IVF template's (quantizer, codebooks)
    faiss_bytes = sum(s["files"]["faiss.index"]["bytes"] for s in m["shards"]) + (m["faiss_template"] or {}).get(
        "bytes", 0
    )
    index.close()
    return {
        "open_s": round(open_s, 4),
        "first_dense_query_s": round(first_dense_s, 3),
        "queries": len(queries),
        "batch": spec["batch"],
        "bm25_qps": round(len(queries) / seconds["bm25"], 1),
        "dense_qps": round(len(queries) / seconds["dense"], 1),
        "rss_before_open_bytes": before["rss"],
        "rss_delta_bytes": after["rss"] - before["rss"],
        "rss_delta_anon_bytes": after["anon"] - before["anon"],
        "rss_delta_file_bytes": after["file"] - before["file"],
        "rss_delta_after_malloc_trim_bytes": trimmed["rss"] - before["rss"],
        "faiss_bytes": faiss_bytes,
    }


if __name__ == "__main__":
    from jobs.cli import setup_logging

    what, spec_file = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    setup_logging(spec.get("log_level", "WARNING"))
    print(json.dumps(build(spec) if what == "build" else probe(spec)))
