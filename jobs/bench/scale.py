"""`dynrag bench scale`: what an index of N passages costs to build, store and hold, so that sizes compare.

Corpora (`--corpus`):

- `lead-sections` (default): N passages of 100 words drawn (seeded) from the words of one of the 10,033
  packaged lead sections (pipeline/assets/embedded.py), titled by that article; one JSONL file.
- `dpr-synthetic`: one DPR-shaped TSV (id, text, title; 100 words a passage over a Zipf vocabulary:
  jobs/bench/rig/dpr_synthetic.py), reused from `--corpus-dir` when present with the same parameters. It
  comes with the settings of a full-size run: FAISS `ivf_factory(N)` (below) and `index.keep_vectors=false`
  (the vectors of 21M passages at 384-d would take 32 GB of disk); `--set` and `--factory` override them.

Steps, each but the first in a process of its own (rig/scale_child.py), so that the bench's own memory is in
no figure:

1. corpus: written to `--corpus-dir` (default: a temporary directory), with the queries (`--queries`,
   12 words each from random passages) and a 1,000-passage warm-up corpus. Before anything, the disk
   space the run needs is estimated (`disk_needed`) and a run that does not fit is refused.
2. build: a warm-up index (loads the encoder and the JVM), then the index, from scratch; wall time per
   stage from the build's own report, the process tree's peak RSS sampled every 0.5 s (rig/rss.py).
3. search: a fresh index holder opens the index (timed), answers every query in batches of `--batch`
   (k = 10) with BM25 and then dense, and reports its resident memory grown since before the open
   (rig/scale_child.py): beyond what FAISS loaded (its files: the shards' and the template's), anonymous
   memory and file-backed pages (mapped Lucene and `ids.npy`), against the goal 256 MiB + 16 B x N.
3b. with `--memory-cap` (Linux, root): the search again, its process in a memory cgroup capped at what the
   goal allows a holder (its memory before the open + FAISS's files + the goal; rig/memory_cap.py), the page
   cache dropped first so that the index files it reads are charged to it: whether it finished (or was
   killed for memory), its queries/s and the cgroup's peak. RSS counts the mapped index files' pages, which
   are page cache the kernel reclaims; the cap shows what the holder needs.
4. incremental: 1% new passages appended to the corpus (truncated back afterwards) and the index
   rebuilt in place: that build's wall time / the full build's, with the work units it took unread
   (indexing/builder/unit_reuse.py) and whether it updated the previous BM25 index or merged every shard again.

`--search-only` runs steps 3 (and 3b) alone, on the index an earlier `--keep` run left in `--corpus-dir`,
with the first `--queries` of its queries.

After each step the figures so far are in `DIR/scale-N.partial.json` (removed when the run ends well).

`--encoder hash` (indexing.shards.embed.HashEncoder) is a deterministic feature-hashing test encoder, not a
language model: it measures everything but embedding at sizes a CPU cannot embed; the default is the
configured `embedding.model` (MiniLM).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.bench.rig import dpr_synthetic

WARM_PASSAGES = 1000
MIB = 1 << 20
GOAL_FIXED_BYTES, GOAL_BYTES_PER_PASSAGE = 256 * MIB, 16  # a holder's memory beyond FAISS (issue 30)
# disk a passage takes besides its FAISS codes, measured on dpr-synthetic at 100k (lead-sections: 94 + 80 B
# of Lucene): passages.arrow, ids.npy, the shard's Lucene index; the version's BM25 index and id map (12 B; one
# per version kept)
PASSAGE_DISK_BYTES = 658 + 8 + 243
VERSION_BYTES = 216 + 12
IVF_MAX_LISTS = 4096  # trained on 40 x 4096 vectors of 384-d in a few minutes on 2 cores (ivf_factory)


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = bsub.add_parser(
        "scale",
        help="build, search and refresh an index of N synthetic passages: time, memory and disk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--passages", type=int, metavar="N", help="passages in the index (required but with --search-only)")
    p.add_argument("--corpus", choices=("lead-sections", "dpr-synthetic"), default="lead-sections")
    p.add_argument(
        "--encoder",
        default=None,
        metavar="NAME",
        help="embedding model: 'hash' (a cheap deterministic test encoder) or a model name "
        "(default: the configured embedding.model)",
    )
    p.add_argument("--factory", default=None, help="index.faiss_factory (dpr-synthetic's default: ivf_factory(N))")
    p.add_argument(
        "--queries",
        type=int,
        default=10_000,
        help="queries per retriever (default 10,000; --search-only: the first of the kept run's)",
    )
    p.add_argument("--batch", type=int, default=100, help="queries per search call (default 100)")
    p.add_argument(
        "--corpus-dir",
        default=None,
        metavar="DIR",
        help="where the corpus, the queries and the index go (default: a temporary directory)",
    )
    p.add_argument("--keep", action="store_true", help="keep what the run wrote (corpus, index) for the next run")
    p.add_argument(
        "--memory-cap",
        action="store_true",
        help="after the search step, search again in a memory cgroup capped at the goal's budget (step 3b; "
        "Linux, root)",
    )
    p.add_argument(
        "--search-only",
        action="store_true",
        help="measure only the search (and --memory-cap) of the index an earlier --keep run left in --corpus-dir",
    )
    add_job_options(p, json={"help": "print one JSON object"})
    add_config_args(p)
    p.set_defaults(func=run)


def ivf_factory(n: int) -> tuple[str, int]:
    """The FAISS factory and training sample of a `dpr-synthetic` run: about 4 sqrt(N) inverted lists (a power
    of two, at most IVF_MAX_LISTS), trained on 40 vectors a list (faiss asks for at least 39), and PQ128x4np:
    64-byte codes as PQ64's, but 128 sub-quantizers of 16 centroids (4 bits), searched in faiss's fast-scan
    layout once the shards are merged (dense.fast_scan). Measured on this machine at 384-d (200k vectors):
    adding them 4.2x faster than `PQ64np` (FAISS encodes 6-dim sub-vectors against 256 centroids without BLAS;
    3 against 16 is 16x less work), training 2.3x faster, search 3.3x faster, recall@10 against exact search
    the same (0.541 vs 0.549 at nprobe 32). `--factory IVF4096,PQ64np` gives the earlier runs' index (and one a
    GPU takes: faiss's GPU IVF-PQ has 8-bit codes only). `np`: without faiss's polysemous training of 8-bit
    codes, which IVF search does not use and which made PQ64's training 13x slower."""
    lists = min(IVF_MAX_LISTS, 2 ** max(4, round(math.log2(4 * math.sqrt(n)))))
    return f"IVF{lists},PQ128x4np", min(n, 40 * lists)


def faiss_bytes_per_passage(factory: str, dim: int) -> int:
    """What FAISS stores a passage in (codes, and an IVF list's 8-byte id), from its factory string."""
    pq, sq = re.search(r"PQ(\d+)(?:x(\d+))?", factory), re.search(r"SQ(\d+)", factory)
    ivf = 8 if "IVF" in factory else 0
    if pq:
        return math.ceil(int(pq.group(1)) * int(pq.group(2) or 8) / 8) + ivf
    if sq:
        return dim * int(sq.group(1)) // 8 + ivf
    hnsw = re.search(r"HNSW(\d+)", factory)
    return 4 * dim + ivf + (8 * int(hnsw.group(1)) if hnsw else 0)


def disk_needed(n: int, corpus_bytes: int, settings, dim: int) -> int:
    """Bytes a run writes at most: the corpus (0 when reused), the index, for the incremental build 1% more
    of both and a second version's BM25 index and id map, and a shard's staged vectors; +10%."""
    i = settings.index
    per_passage = PASSAGE_DISK_BYTES + VERSION_BYTES + faiss_bytes_per_passage(i.faiss_factory, dim)
    per_passage += 4 * dim if i.keep_vectors else 0
    staged = min(n, i.shard_size) * 4 * dim
    return int(1.1 * (1.01 * (corpus_bytes + n * per_passage) + n * VERSION_BYTES + staged))


def run(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.errors import DynragError

    if args.passages is None and not args.search_only:
        raise DynragError("--passages N is required (but with --search-only)")
    for name, value, least in (
        ("passages", 1 if args.passages is None else args.passages, 1),
        ("queries", args.queries, 1),
        ("batch", args.batch, 1),
    ):
        if value < least:
            raise DynragError(f"--{name} must be at least {least}, got {value}")
    if args.search_only and not args.corpus_dir:
        raise DynragError("--search-only measures an index kept by an earlier run: give its --corpus-dir")
    overrides = list(args.overrides or [])
    if args.corpus == "dpr-synthetic" and not args.search_only:  # the full-size defaults, before the user's --set
        factory, train = ivf_factory(args.passages)
        defaults = [f"index.faiss_factory={factory}", f"index.faiss_train_size={train}", "index.keep_vectors=false"]
        overrides = defaults + overrides
    if args.encoder:
        overrides.append(f"embedding.model={args.encoder}")
    if args.factory:
        overrides.append(f"index.faiss_factory={args.factory}")
    cfg = load_config(getattr(args, "config", None), overrides)
    work = Path(args.corpus_dir or tempfile.mkdtemp(prefix="dynrag-bench-scale-"))
    made: list[Path] = [] if args.corpus_dir and work.exists() else [work]  # removed after the run unless --keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = Bench(args, cfg, work, made).run()
    finally:
        if not args.keep:
            for path in reversed(made):
                _remove(path)
    if args.keep:
        print(f"kept in {work}", file=sys.stderr)
    if args.json:
        from jobs.jsonout import emit

        emit(result)
    else:
        print(_text(result))
    return 0


class Bench:
    def __init__(self, args: argparse.Namespace, cfg, work: Path, made: list[Path]):
        self.args, self.cfg, self.work, self.made = args, cfg, work, made
        self.n = args.passages
        self.settings = cfg.index_settings()
        self.dpr = args.corpus == "dpr-synthetic"
        ext = "tsv" if self.dpr else "jsonl"
        self.corpus = work / f"{args.corpus}-{self.n}.{ext}"
        self.warm_corpus = work / f"warm.{ext}"
        self.index, self.warm_index, self.queries = work / "index", work / "warm-index", work / "queries.json"

    def _made(self, path: Path) -> Path:
        if path not in self.made:
            self.made.append(path)
        return path

    def run(self) -> dict:
        out: dict = {"passages": self.n}
        if not self.args.search_only:
            out |= {
                "corpus": self.args.corpus,
                "encoder": self.cfg.embedding.model,
                "faiss_factory": self.settings.index.faiss_factory,
                "keep_vectors": self.settings.index.keep_vectors,
            }
        partial = self.work / f"scale-{self.n}.partial.json"  # what is measured so far, should a later step fail
        search = [self._probe, *([lambda: self._capped_probe(out)] if self.args.memory_cap else [])]
        steps = [self._kept, *search]
        if not self.args.search_only:
            steps = [
                self._check_disk,
                self._write_corpus,
                lambda: self._build_figures(
                    self._build(
                        [([str(self.warm_corpus)], self.warm_index), ([str(self.corpus)], self.index)], fresh=True
                    )
                ),
                self._disk,
                *search,
                lambda: self._incremental(out["build_s"]),
            ]
        for step in steps:
            out.update(step())
            out["load_average"] = [round(x, 2) for x in os.getloadavg()]
            partial.write_text(json.dumps(out), encoding="utf-8")
        partial.unlink()
        return out

    def _kept(self) -> dict:
        """--search-only: the index, warm-up index and queries an earlier --keep run left; N is the index's."""
        from indexing.versions.manifest import current_version, read_manifest
        from pipeline.errors import DynragError

        for path in (self.index, self.warm_index):
            if current_version(path) is None:
                raise DynragError(f"no index at {path}: build one first with --keep --corpus-dir {self.work}")
        if not self.queries.exists():
            raise DynragError(f"no {self.queries}: build one first with --keep --corpus-dir {self.work}")
        m = read_manifest(self.index)
        self.n = m["passages"]
        built = m["settings"]  # the index's own, not this run's configuration
        return {"passages": self.n, "encoder": built["embedding"]["model"], "faiss_factory": built["faiss_factory"]}

    # ---- 1. corpus ----
    def _corpus_present(self) -> bool:
        return self.dpr and dpr_synthetic.is_current(self.corpus, self.n)

    def _check_disk(self) -> dict:
        from pipeline.errors import DynragError

        corpus_bytes = 0
        if not self._corpus_present():
            corpus_bytes = dpr_synthetic.vocabulary().expected_bytes(self.n) if self.dpr else 800 * self.n
        need = disk_needed(self.n, corpus_bytes, self.settings, _dim(self.settings))
        free = shutil.disk_usage(self.work).free
        if need > free:
            raise DynragError(
                f"{self.work} has {free / 1e9:.1f} GB free, the run needs about {need / 1e9:.1f} GB "
                "(choose another disk with --corpus-dir)"
            )
        return {"disk_needed_bytes": need, "disk_free_bytes": free}

    def _write_corpus(self) -> dict:
        from tqdm import tqdm

        t = time.perf_counter()
        written = True
        if self.dpr:
            with tqdm(total=self.n, desc="corpus", unit="row", disable=None, leave=False) as bar:
                written = dpr_synthetic.write_tsv(self._made(self.corpus), self.n, progress=bar.update)
            if not written:
                self.made.remove(self.corpus)  # not this run's: left as found
            dpr_synthetic.write_tsv(self._made(self.warm_corpus), WARM_PASSAGES, seed=1)
            queries = dpr_synthetic.sample_queries(self.corpus, self.args.queries)
        else:
            articles = _articles(self.cfg)
            write_corpus(self._made(self.corpus), self.n, articles)
            write_corpus(self._made(self.warm_corpus), WARM_PASSAGES, articles, seed=1)
            rng = random.Random(2)
            queries = [" ".join(w[:12]) for _, w in rng.choices(articles, k=self.args.queries)]
        seconds = time.perf_counter() - t
        self._made(self.queries).write_text(json.dumps(queries), encoding="utf-8")
        return {
            "corpus_bytes": self.corpus.stat().st_size,
            "corpus_written": written,
            "corpus_rows_per_s": round(self.n / seconds) if written else None,
        }

    # ---- 2. build ----
    def _child(self, what: str, spec: dict, measured: bool, cap: int | None = None) -> tuple[Any, float, int | None]:
        """Run rig/scale_child.py; its stderr (progress bars, logs) goes to ours. Returns its result, wall
        time and, when `measured`, its process tree's peak RSS; with a memory `cap` (rig/memory_cap.py), the
        cgroup's peak, and no result when the kernel killed it for memory."""
        from jobs.bench.rig.memory_cap import run_capped
        from jobs.bench.rig.rss import run_measured
        from pipeline.errors import DynragError

        spec = {"config": self.cfg.model_dump(mode="json"), "log_level": _log_level(), **spec}
        path = self.work / f".{what}.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        cmd = [sys.executable, "-m", "jobs.bench.rig.scale_child", what, str(path)]
        peak: int | None
        try:
            if measured:
                m = run_measured(cmd, capture_stderr=False)
                code, stdout, wall, peak = m.returncode, m.stdout, m.wall_s, m.peak_rss
            elif cap is not None:
                c = run_capped(cmd, cap)
                if c.oom_killed:
                    return None, c.wall_s, c.peak_bytes
                code, stdout, wall, peak = c.returncode, c.stdout, c.wall_s, c.peak_bytes
            else:
                t = time.perf_counter()
                p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
                code, stdout, wall, peak = p.returncode, p.stdout, time.perf_counter() - t, 0
        finally:
            path.unlink(missing_ok=True)
        if code != 0:
            raise DynragError(f"the bench's {what} process failed (exit {code}; its errors are above)")
        return json.loads(stdout.strip().splitlines()[-1]), wall, peak

    def _build(self, builds: list[tuple[list[str], Path]], fresh: bool = False) -> dict:
        """Build in a child process; `fresh`: the first build is the warm-up, and each index starts from nothing."""
        for _, index_dir in builds:
            if fresh:
                _remove(index_dir)
            self._made(index_dir)
        spec = {"builds": [(s, str(d)) for s, d in builds], "warm_first": fresh}
        reports, _, peak = self._child("build", spec, measured=True)
        report = reports[-1]
        return {"report": report, "wall_s": report["seconds"], "peak_rss": peak}

    def _build_figures(self, full: dict) -> dict:
        r = full["report"]
        return {
            "shards": r["shards"],
            "faiss_train_size": self.settings.index.faiss_train_size if "faiss_train_s" in r else None,
            "build_s": r["seconds"],
            "build_s_by_stage": _by_stage(r),
            "build_s_per_1k": round(1000 * r["seconds"] / self.n, 4),
            "build_peak_rss_bytes": full["peak_rss"],
        }

    def _disk(self) -> dict:
        """Bytes of the published version by kind of file (what `index.keep_versions=1` would keep)."""
        from indexing.versions.manifest import read_manifest, version_files

        by_kind: dict[str, int] = {}
        for rel, files in version_files(read_manifest(self.index)):
            for name, meta in files.items():
                if rel.startswith("versions"):
                    kind = "id map (version)" if rel.endswith("/id_shards") else "bm25 (version)"
                else:  # a shard's file or folder (lucene/), or the IVF template (trained/)
                    kind = "trained" if rel == "trained" else name.split("/")[0]
                by_kind[kind] = by_kind.get(kind, 0) + meta["bytes"]
        return {
            "disk_bytes_per_passage": round(sum(by_kind.values()) / self.n, 1),
            "disk_bytes_per_passage_by_file": {k: round(v / self.n, 1) for k, v in by_kind.items()},
        }

    # ---- 3. search ----
    def _probe_spec(self) -> dict:
        return {
            "index": str(self.index),
            "warm_index": str(self.warm_index),
            "queries": str(self.queries),
            "limit": self.args.queries,
            "batch": self.args.batch,
        }

    def _probe(self) -> dict:
        p, _, _ = self._child("probe", self._probe_spec(), measured=False)
        beyond = p["rss_delta_bytes"] - p["faiss_bytes"]
        return {
            **p,
            "faiss_bytes_per_passage": round(p["faiss_bytes"] / self.n, 1),
            "resident_beyond_faiss_bytes": beyond,
            "resident_beyond_faiss_anon_bytes": p["rss_delta_anon_bytes"] - p["faiss_bytes"],
            "resident_bytes_per_passage": round(beyond / self.n, 1),
            "resident_goal_bytes": GOAL_FIXED_BYTES + GOAL_BYTES_PER_PASSAGE * self.n,
        }

    def _capped_probe(self, out: dict) -> dict:
        """The search again, the holder in a cgroup capped at what the goal allows it: its memory before the
        open (libraries, JVM, encoder) + FAISS's files + the goal; the page cache dropped first."""
        limit = out["rss_before_open_bytes"] + out["faiss_bytes"] + out["resident_goal_bytes"]
        p, _, peak = self._child("probe", self._probe_spec(), measured=False, cap=limit)
        figures = {"capped_limit_bytes": limit, "capped_peak_bytes": peak, "capped_completed": p is not None}
        if p is not None:
            figures |= {f"capped_{k}": p[k] for k in ("open_s", "bm25_qps", "dense_qps", "rss_delta_file_bytes")}
        return figures

    # ---- 4. incremental ----
    def _incremental(self, full_s: float) -> dict:
        added = max(1, self.n // 100)
        size = self.corpus.stat().st_size
        try:
            if self.dpr:
                dpr_synthetic.append_rows(self.corpus, added, first_id=self.n + 1)
            else:
                write_corpus(self.corpus, added, _articles(self.cfg), seed=3, append=True)
            inc = self._build([([str(self.corpus)], self.index)])
        finally:
            os.truncate(self.corpus, size)  # the corpus as written (its sidecar's size)
        r = inc["report"]
        return {
            "incremental_passages_added": added,
            "incremental_build_s": r["seconds"],
            "incremental_build_peak_rss_bytes": inc["peak_rss"],
            "incremental_shards_built": r["shards_built"],
            "incremental_passages_embedded": r["passages_embedded"],
            "incremental_units_reused": r.get("units_reused", 0),
            "incremental_units": r["units"],
            "incremental_bm25": r["bm25"],
            "incremental_build_s_by_stage": _by_stage(r),
            "incremental_ratio": round(r["seconds"] / full_s, 4),
        }


def _by_stage(report: dict) -> dict[str, float]:
    """A build's wall time by round (scan, dedup, faiss_train, build_units: the unit tasks' round, bm25_merge,
    id_map, other), then the unit tasks' own seconds by step (task_*: summed over the tasks, which a pool or
    a cluster runs side by side, so they may add up to more than the round's wall time)."""
    rounds = ("scan", "dedup", "faiss_train", "build_units", "bm25_merge", "id_map")
    out = {k: round(report.get(f"{k}_s", 0.0), 2) for k in rounds}
    out["other"] = round(report["seconds"] - sum(out.values()), 2)
    for k in ("read", "passages", "embed", "faiss", "lucene", "checksum", "unit_digest"):
        out[f"task_{k}"] = round(report.get(f"{k}_s", 0.0), 2)
    return out


def _dim(settings) -> int:
    """The embedding dimension, for the disk estimate: the model's hidden size where its folder says (1,024 if not)."""
    from indexing.shards.embed import HASH_ENCODER, HashEncoder, read_model_config

    name = settings.embedding.model
    if name == HASH_ENCODER:
        return HashEncoder.dim
    return int(read_model_config(settings.model_path(name)).get("hidden_size", 1024))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _log_level() -> str:
    import logging

    return logging.getLevelName(logging.getLogger().getEffectiveLevel())


def _articles(cfg) -> list[tuple[str, list[str]]]:
    from pipeline.assets.embedded import wikipedia_lead_sections

    sections = json.loads(wikipedia_lead_sections(cfg.paths.cache_dir).read_text(encoding="utf-8"))
    return [(v["title"], v["extract"].split()) for _, v in sorted(sections.items()) if len(v["extract"].split()) >= 10]


def write_corpus(path: Path, n: int, articles, seed: int = 0, append: bool = False) -> None:
    rng = random.Random(seed)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for i in range(n):
            title, words = articles[rng.randrange(len(articles))]
            f.write(
                json.dumps({"id": f"syn{seed}-{i}", "title": title, "text": " ".join(rng.choices(words, k=100))}) + "\n"
            )


def _text(r: dict) -> str:
    """The figures as lines, those of the steps that ran (--search-only: the search's)."""
    kept = f"passages    {r['passages']:,} (the kept index), encoder {r.get('encoder')}, FAISS {r.get('faiss_factory')}"
    lines = [_build_text(r)] if "build_s" in r else [kept]
    lines.append(_search_text(r))
    if "capped_limit_bytes" in r:
        lines.append(_capped_text(r))
    if "incremental_ratio" in r:
        lines.append(_incremental_text(r))
    return "\n".join(lines)


def _build_text(r: dict) -> str:
    gb = 1e9
    stages = ", ".join(f"{k} {v:.1f}" for k, v in r["build_s_by_stage"].items())
    files = ", ".join(f"{k} {v:.0f}" for k, v in r["disk_bytes_per_passage_by_file"].items())
    corpus = f"{r['corpus_bytes'] / gb:.2f} GB" + (
        f", written at {r['corpus_rows_per_s']:,} rows/s" if r["corpus_written"] else ", reused"
    )
    peak = r["build_peak_rss_bytes"] / gb
    return "\n".join(
        [
            f"passages    {r['passages']:,} ({r['shards']} shards), corpus {r['corpus']} ({corpus}), encoder "
            f"{r['encoder']}, FAISS {r['faiss_factory']}, keep_vectors {r['keep_vectors']}, "
            f"load {r['load_average']}",
            f"build       {r['build_s']:.1f} s ({stages}); peak RSS of the build {peak:.2f} GB",
            f"disk        {r['disk_bytes_per_passage']:.0f} bytes per passage ({files})",
        ]
    )


def _search_text(r: dict) -> str:
    goal, beyond = r["resident_goal_bytes"], r["resident_beyond_faiss_bytes"]
    return "\n".join(
        [
            f"open        {r['open_s']:.4f} s; first dense query (reads FAISS) {r['first_dense_query_s']:.2f} s",
            f"search      {r['queries']:,} queries in batches of {r['batch']}, k=10: BM25 {r['bm25_qps']:.1f} q/s, "
            f"dense {r['dense_qps']:.1f} q/s",
            f"resident    beyond FAISS {beyond / MIB:.1f} MiB = {r['resident_bytes_per_passage']:.1f} B per passage "
            f"(anonymous {r['resident_beyond_faiss_anon_bytes'] / MIB:.1f} MiB, mapped files "
            f"{r['rss_delta_file_bytes'] / MIB:.1f} MiB); goal 256 MiB + 16 B x N = {goal / MIB:.0f} MiB: "
            + ("met" if beyond <= goal else "NOT met")
            + (" (the anonymous part alone: met)" if beyond > goal >= r["resident_beyond_faiss_anon_bytes"] else ""),
            f"            RSS +{r['rss_delta_bytes'] / MIB:.1f} MiB after open + queries, of it FAISS "
            f"{r['faiss_bytes'] / MIB:.1f} MiB ({r['faiss_bytes_per_passage']:.0f} B per passage); "
            f"+{r['rss_delta_after_malloc_trim_bytes'] / MIB:.1f} MiB once malloc returned its free pages",
        ]
    )


def _capped_text(r: dict) -> str:
    head = f"capped      the search again in {r['capped_limit_bytes'] / MIB:,.0f} MiB (before the open + FAISS + goal)"
    peak = f", cgroup peak {r['capped_peak_bytes'] / MIB:,.0f} MiB" if r["capped_peak_bytes"] else ""
    if not r["capped_completed"]:
        return f"{head}: killed for memory{peak}"
    return (
        f"{head}: finished{peak}; BM25 {r['capped_bm25_qps']:.1f} q/s, dense {r['capped_dense_qps']:.1f} q/s, "
        f"open {r['capped_open_s']:.4f} s, mapped files resident {r['capped_rss_delta_file_bytes'] / MIB:+.1f} MiB"
    )


def _incremental_text(r: dict) -> str:
    return "\n".join(
        [
            f"incremental +{r['incremental_passages_added']:,} passages: {r['incremental_build_s']:.1f} s "
            f"({r['incremental_shards_built']} shards built, {r['incremental_passages_embedded']:,} passages embedded, "
            f"{r['incremental_units_reused']}/{r['incremental_units']} units taken unread, BM25 "
            f"{'updated' if r['incremental_bm25']['updated'] else 'merged again'}) "
            f"= {r['incremental_ratio']:.4f} of the full build",
            "            " + ", ".join(f"{k} {v:.1f}" for k, v in r["incremental_build_s_by_stage"].items()),
        ]
    )
