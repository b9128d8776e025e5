"""`build_index`: corpus files in, a published index version out; incremental and resumable.

The driver plans the corpus's work units (readers.plan_units: a file, or a byte range of one larger than
`index.unit_bytes`), hands each unit's work to an executor in rounds, and publishes; it never reads the
corpus. The work of a unit is written once (unit_work.py) and runs the same on every executor
(executors.py): in this process, in a pool of processes (`index.build_workers`), or as Ray tasks spread over
a cluster (`runtime.mode=ray`, cluster_build.py). Rounds, each with its progress and its seconds:

1. scan (with more than one unit, an IVF template to train, or a previous version): each unit's digest and
   its passages' id hashes; a unit whose bytes and shards are unchanged is taken unread (unit_reuse.py).
2. dedup: the ids an earlier unit holds, per unit (the first occurrence in corpus order wins).
3. train (an IVF factory without a template yet): the shared template, on a sample taken over the corpus.
4. build: each unit read, split and cut into content-defined shards (they restart at each unit); a shard
   whose key is not under `shards/` yet is staged, given its vectors (given with `--vectors FILE`:
   given_vectors.py; copied from the previous version's shards it came from; embedded), then FAISS, Lucene,
   checksums and the rename into `shards/` (shard_storage.py).
5. publish: the version's BM25 index (the union of its shards' Lucene segments, merged down to
   `index.bm25_segments`, or the previous version's updated: `_bm25_update`) and id map (id hash -> shard,
   merged from the shards' sorted ids; store.py), a new manifest version, then `CURRENT` (manifest.py); old
   versions are pruned.

A shard's key is a hash of its passages, the settings it is built with and, for an IVF factory, the
digest of the template its FAISS index is filled from: a shard is reused only with the very template it
was filled from. With `index.keep_vectors=false` a shard's `vectors.npy` is deleted once its FAISS index
is written: a later build re-embeds the passages of the shards it changes instead of copying their vectors.

A build killed anywhere resumes on rerun: finished shards are found by key under `shards/`, staged
passages and vectors are reused from `staging/`, an IVF template trained for this build is reused from
`staging/.template.json` (so are the shards filled from it), and nothing is published before stage 5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from indexing.builder.executors import Executor
from indexing.builder.given_vectors import GivenVectors, VectorFile
from indexing.builder.shard_storage import ShardStorage
from indexing.builder.unit_reuse import add_counts, previous_units, unit_entry_of
from indexing.builder.unit_work import (
    PreviousUnit,
    UnitJob,
    build_unit,
    dedup_task,
    scan_unit,
    short_hash,
    train_unit_template,
)
from indexing.corpus.passages import RULES_VERSION, PassageStats
from indexing.corpus.readers import CorpusError, ReadStats, Unit, plan_units
from indexing.errors import IndexingError
from indexing.settings import IndexSettings
from indexing.shards.chunking import effective_shard_size, shard_key
from indexing.shards.dense import is_ivf
from indexing.shards.embed import EncoderSpec
from indexing.shards.store import read_table, write_id_shards
from indexing.versions.manifest import (
    FORMAT_VERSION,
    ShardFiles,
    build_lock,
    collect_garbage,
    current_version,
    publish,
    read_manifest,
    version_name,
    write_checksums,
)
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)


# a version's BM25 index is updated from the previous one's (not merged again from every shard) while it
# holds at most this share of deleted documents and this many segments beyond index.bm25_segments
BM25_MAX_DELETED = 0.05
BM25_EXTRA_SEGMENTS = 16
DEDUP_RANGES = 16  # at most this many dedup tasks, each over one range of the id hash of every unit

# with index.memory_budget_mb set, Lucene's JVM gets a fixed heap of at least this size (java.py)
JVM_HEAP_MB = 512


class BuildError(IndexingError):
    """The build cannot proceed (no sources, an empty corpus, ...)."""


_hash = short_hash


def _settings(cfg: IndexSettings, given: dict | None = None) -> dict:
    """The settings a version records; `given`: its vectors came from a file (given_vectors.py)."""
    from indexing.shards.sparse import configured_analyzer

    e, i = cfg.embedding, cfg.index
    embedding = {"model": e.model, "dtype": e.dtype, "max_seq_length": e.max_seq_length, "input": "title\\ntext"}
    embedding.update(given or {})
    return {
        **({} if i.dense else {"dense": False}),  # absent: dense (what every index built before the flag is)
        "embedding": embedding,
        "embedding_hash": _hash(embedding),
        "faiss_factory": i.faiss_factory,
        **({"faiss_train_size": i.faiss_train_size} if i.dense and is_ivf(i.faiss_factory) else {}),
        "passage_words": i.passage_words,
        "shard_size": effective_shard_size(cfg),
        "lucene": {"collection": "JsonCollection", "contents": "title\\ntext", "analyzer": configured_analyzer(i)},
        "bm25_segments": i.bm25_segments,
    }


def build_local_index(
    sources: list[str],
    index_dir: str | os.PathLike,
    cfg: IndexSettings,
    *,
    fmt: str = "auto",
    fields: dict | None = None,
    on_bad_line: str = "error",
    builder: type | None = None,
    vectors: str | os.PathLike | None = None,
    normalize_vectors: bool = False,
) -> dict:
    """Build or incrementally refresh the local index at `index_dir` from `sources`; return a report.
    `builder`: the class that runs it (cluster_build.py passes its Ray one; default: a local executor).
    `vectors`: a file of the records' vectors, taken instead of embedding (given_vectors.py), L2-normalised
    with `normalize_vectors`."""
    if not sources:
        raise BuildError("no corpus sources given")
    root = Path(index_dir)
    if cfg.index.memory_budget_mb:
        from indexing.shards.native_memory import bound_native_memory

        bound_native_memory(max(JVM_HEAP_MB, cfg.index.memory_budget_mb))
    with build_lock(root):
        try:
            given = (vectors, normalize_vectors) if vectors is not None else None
            return (builder or Builder)(sources, root, cfg, fmt, fields, on_bad_line, given).run()
        finally:
            for folder in (root / "staging", root / "shards"):  # removed if empty: staged work stays for a rerun
                with contextlib.suppress(OSError):
                    folder.rmdir()


class Builder:
    def __init__(
        self,
        sources: list[str],
        root: Path,
        cfg: IndexSettings,
        fmt: str,
        fields: dict | None,
        on_bad_line: str,
        given: tuple[str | os.PathLike, bool] | None = None,
    ):
        self.sources, self.root, self.cfg = sources, root, cfg
        self.fmt, self.fields, self.on_bad_line = fmt, fields, on_bad_line
        self.read_stats = ReadStats()
        # vectors taken from a file instead of embedded: (path, normalise)
        self.given = (
            GivenVectors(VectorFile.open(given[0]), given[1], self.read_stats, cfg.index.passage_words)
            if given
            else None
        )
        self.settings = _settings(cfg, self.given.settings() if self.given else None)
        self.dense = cfg.index.dense
        self.ivf = self.dense and is_ivf(self.settings["faiss_factory"])  # shards filled from a shared template
        self.settings_hash = _hash(
            {
                "e": self.settings["embedding_hash"],
                "f": self.settings["faiss_factory"],
                "t": self.settings.get("faiss_train_size"),
                "l": self.settings["lucene"],
                "format": FORMAT_VERSION,
                **({} if self.dense else {"dense": False}),
            }
        )
        self.template: dict | None = None  # the IVF template this build's shards are filled from (part of their keys)
        self.shards_dir = root / "shards"
        self.staging = root / "staging"
        self.timings: dict[str, float] = {}
        self.passage_stats = PassageStats()
        self.embedded = 0
        self.vectors_reused = 0
        self.reembedded_shards: list[str] = []
        self.previous: dict | None = None  # the version this build refreshes (`run`)
        self._bm25_linked: dict[str, dict] = {}  # checksums of the BM25 files linked from the previous version
        self.unit_entries: list[dict] | None = None  # the manifest's `units` (unit_reuse.py); None: not recorded
        self.extra: dict = {}  # further entries of the manifest's `build` record and of the report (cluster_build.py)
        self.store = ShardStorage(str(root))  # where the unit tasks build shards (cluster_build.py: also remote)
        self.dim: int | None = None  # the vectors' dimension, as the unit tasks found it
        self.nodes: dict[str, int] = {}  # tasks by node (a Ray build)

    def _shard_key(self, content: str) -> str:
        """A shard's key: its passages, the settings, and the digest of the IVF template it is filled from."""
        return shard_key(content, self.settings_hash + (f":{self.template['sha256']}" if self.template else ""))

    def _check_vectors_source(self, prev: dict | None) -> None:
        """Before any work: given vectors fit the query model, and given and embedded vectors never mix."""
        if prev is not None and self.dense and not self.given and prev["settings"]["embedding"].get("given"):
            raise BuildError(
                f"{self.root} holds vectors given with --vectors ({prev['settings']['embedding']['model']}): "
                "refresh it with --vectors again, or build into a new --index to embed with embedding.model"
            )
        if not self.given:
            return
        if not self.dense:
            raise BuildError("--vectors with index.dense=false: a BM25-only index has no vectors to take")
        from indexing.shards.embed import get_encoder

        model = self.cfg.embedding.model
        dim = get_encoder(EncoderSpec.from_config(self.cfg)).encode(["the query model's dimension"]).shape[1]
        if dim != self.given.file.dim:
            raise BuildError(
                f"vectors {self.given.file.path} has dimension {self.given.file.dim}, but the query model "
                f"{model} gives {dim}: name the model that made them (--vectors-model)"
            )

    def _executor(self, units: int) -> Executor:
        """Who runs the unit tasks: a pool of `index.build_workers` processes (0: one per `index.threads` CPUs,
        the threads each unit's Lucene and FAISS work already uses), never more than the units; one worker
        runs them in this process (cluster_build.py: Ray)."""
        from indexing.builder.executors import LocalExecutor

        workers = self.cfg.index.build_workers or max(1, (os.cpu_count() or 1) // self.cfg.index.threads)
        return LocalExecutor(min(workers, units), self.cfg.index.build_stall_s)

    def _job(self, unit: Unit, previous: PreviousUnit | None) -> UnitJob:
        cfg, prev = self.cfg, self.previous
        same_model = (
            self.dense
            and not self.given
            and prev is not None
            and prev["settings"].get("dense", True)
            and prev["settings"]["embedding_hash"] == self.settings["embedding_hash"]
        )
        reading = (RULES_VERSION, self.fmt, self.fields, self.on_bad_line, cfg.index.passage_words)
        return UnitJob(
            unit=unit,
            store=self.store,
            fmt=self.fmt,
            fields=self.fields,
            on_bad_line=self.on_bad_line,
            reading=(*reading, self.settings["shard_size"]),
            passage_words=cfg.index.passage_words,
            shard_size=self.settings["shard_size"],
            settings_hash=self.settings_hash,
            factory=cfg.index.faiss_factory,
            threads=cfg.index.threads,
            analyzer=self.settings["lucene"]["analyzer"],
            spec=EncoderSpec.from_config(cfg, build=True),
            reuse_from=tuple(
                (s["key"], s["first_id"], s["last_id"], {f: s["files"][f] for f in ("passages.arrow", "vectors.npy")})
                for s in prev["shards"]
                if "vectors.npy" in s["files"]  # not with index.keep_vectors=false
            )
            if same_model and prev is not None
            else (),
            release=bool(cfg.index.memory_budget_mb),
            dense=self.dense,
            template=self.template,
            keep_vectors=cfg.index.keep_vectors,
            given=(self.given.file, self.given.normalize) if self.given else None,
            previous=previous,
        )

    def _build_shards(self, prev: dict | None) -> tuple[list[dict], int]:
        """Stages 1-3: every shard of the corpus complete under `shards/`, built by unit tasks (unit_work.py)
        on this build's executor; returns their metas (in corpus order) and how many this build made."""
        self.template = self._known_template(prev)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        units = plan_units(self.sources, self.fmt, self.cfg.index.unit_bytes)
        self.extra["units"] = len(units)
        executor = self._executor(len(units))
        try:
            return self._run_units(executor, units, prev)
        finally:
            executor.close()

    def _run_units(self, ex: Executor, units: list[Unit], prev: dict | None) -> tuple[list[dict], int]:
        untrained = self.ivf and self.template is None
        # units that may be taken unread: not with given vectors (their rows count every record), nor before a
        # template is trained (no shard keys yet), nor from a remote store (its shards are not on this disk)
        takeable = (
            {} if not prev or self.given or untrained or self.store.remote else previous_units(prev, self._shard_key)
        )
        jobs = [self._job(u, takeable.get(str(u))) for u in units]
        ranges = min(len(jobs), DEDUP_RANGES) if len(jobs) > 1 else 0  # one unit: no earlier unit's ids
        scans: list[list] = [[] for _ in jobs]
        summaries: list[dict] = [{} for _ in jobs]
        if ranges or untrained or takeable:
            samples = _sample_sizes(units, self.cfg.index.faiss_train_size) if untrained else [0] * len(units)
            scans, summaries, jobs = self._scan(ex, jobs, ranges, samples)
        drops, dropping = self._dedup(ex, scans, ranges, len(jobs))
        taken = [bool(s.get("taken")) and (s["in_place"] or not dropping[i]) for i, s in enumerate(summaries)]
        if self.given and ranges:  # a unit's rows follow every record of the units before it
            bases = np.cumsum([0] + [s["records"] + s["bad_lines"] for s in summaries[:-1]])
            jobs = [dataclasses.replace(j, row_base=int(b)) for j, b in zip(jobs, bases)]
        if untrained:
            self.template = self._train(ex, jobs, [s[1] for s in scans])
            jobs = [dataclasses.replace(j, template=self.template) for j in jobs]
        del scans  # the id hashes and samples go
        t = time.perf_counter()
        todo = [i for i in range(len(jobs)) if not taken[i]]
        handles = [ex.submit(build_unit, jobs[i], *drops[i], embeds=True)[0] for i in todo]
        results = dict(zip(todo, ex.gather(handles, "build")))
        self.timings["build_units_s"] = time.perf_counter() - t
        metas = self._collect(units, jobs, summaries, results)
        self.extra.update({"tasks_by_node": self.nodes} if ex.records_nodes else {})
        return metas, sum(r["built"] for r in results.values())

    def _scan(
        self, ex: Executor, jobs: list[UnitJob], ranges: int, samples: list[int]
    ) -> tuple[list[list], list[dict], list[UnitJob]]:
        """Round 1 (unit_work.scan_unit); a unit that dropped duplicates before is taken unread only in place
        (it and every unit before it taken, each at its old position: unit_reuse.py), else it is scanned again
        from the corpus."""
        t = time.perf_counter()
        returns = 2 + max(ranges, 1)
        scans = [ex.submit(scan_unit, j, ranges, n, returns=returns) for j, n in zip(jobs, samples)]
        summaries = ex.gather([s[0] for s in scans], "scan")
        redo = _place(jobs, summaries)
        if redo:
            for i in redo:
                jobs[i] = dataclasses.replace(jobs[i], previous=None)
                scans[i] = ex.submit(scan_unit, jobs[i], ranges, samples[i], returns=returns)
            for i, summary in zip(redo, ex.gather([scans[i][0] for i in redo], "scan again")):
                summaries[i] = summary
            _place(jobs, summaries)
        self.timings["scan_s"] = time.perf_counter() - t
        self._tally({"scan_task_s": sum(s["seconds"] for s in summaries)})
        return scans, summaries, [dataclasses.replace(j, digest=s["digest"]) for j, s in zip(jobs, summaries)]

    def _dedup(self, ex: Executor, scans: list[list], ranges: int, n: int) -> tuple[list[list], np.ndarray]:
        """Round 2: per unit, its drop lists (handles, one per hash range) and how many ids it drops."""
        drops: list[list] = [[] for _ in range(n)]
        if not ranges:
            return drops, np.zeros(n, np.int64)
        t = time.perf_counter()
        counts = []
        for r in range(ranges):
            out = ex.submit(dedup_task, *[s[2 + r] for s in scans], returns=n + 1)
            counts.append(out[0])
            for unit_drops, handle in zip(drops, out[1:]):
                unit_drops.append(handle)
        dropping = np.sum(ex.gather(counts, "dedup"), axis=0)
        self.timings["dedup_s"] = time.perf_counter() - t
        return drops, dropping

    def _train(self, ex: Executor, jobs: list[UnitJob], samples: list) -> dict:
        """Round 3: an IVF factory's template, trained on the corpus's `index.faiss_train_size` passages of
        smallest id hash (the scans kept each unit's candidates); recorded in staging/.template.json, so a
        rerun reuses it (and the shards filled from it)."""
        from indexing.versions.manifest import atomic_write

        t = time.perf_counter()
        bases = [j.row_base for j in jobs]
        args = (jobs[0], self.cfg.index.faiss_factory, self.cfg.index.faiss_train_size, bases, *samples)
        template = ex.gather(ex.submit(train_unit_template, *args, embeds=True))[0]
        self.timings["faiss_train_task_s"] = template.pop("seconds")
        self.timings["faiss_train_s"] = time.perf_counter() - t
        log.info("trained %s on %d passages", self.cfg.index.faiss_factory, template.pop("passages"))
        atomic_write(self.staging / ".template.json", json.dumps(template))
        return template

    def _collect(self, units: list[Unit], jobs: list[UnitJob], summaries: list[dict], results: dict) -> list[dict]:
        """The shards' metas in corpus order, the manifest's units, and the counts of every unit."""
        metas: list[dict] = []
        self.unit_entries = []  # the manifest's units: a later incremental build may take them
        for i, (unit, job) in enumerate(zip(units, jobs)):
            r = results.get(i)
            if r is None:  # taken unread
                prev = cast(PreviousUnit, job.previous)
                metas += [dict(m) for m in prev.metas]
                self.unit_entries.append(prev.entry)
                add_counts(self.read_stats, self.passage_stats, prev.entry)
                self.extra["units_reused"] = self.extra.get("units_reused", 0) + 1
                continue
            metas += r["shards"]
            self.unit_entries.append(
                unit_entry_of(str(unit), r["digest"], len(r["shards"]), r["read"], r["passage_stats"])
            )
            self.embedded += r["embedded"]
            self.vectors_reused += r["vectors_reused"]
            self.reembedded_shards += r["reembedded"]
            add_counts(self.read_stats, self.passage_stats, {**r["read"], **r["passage_stats"]})
            self.read_stats.skipped += r["read"]["skipped"][: 20 - len(self.read_stats.skipped)]
            self._tally(r["timings"])
            self.dim = self.dim or r.get("dim")
            for where in (summaries[i].get("node"), r["node"]):
                if where:
                    self.nodes[where] = self.nodes.get(where, 0) + 1
        if self.read_stats.records == 0 or not metas:
            raise BuildError(
                f"no passages in {', '.join(self.sources)}"
                + (f" ({self.read_stats.bad_lines} bad lines skipped)" if self.read_stats.bad_lines else "")
            )
        if self.given:
            self.given.records = self.read_stats.records
            self.given.taken = sum(r["vectors_taken"] for r in results.values())
            self.given.check_count()
            self.extra["vectors"] = self.given.describe()
        log.info(
            "units: %d records -> %d passages (%d duplicates merged) in %d shards from %d units",
            self.read_stats.records,
            self.passage_stats.passages,
            self.passage_stats.duplicates,
            len(metas),
            len(units),
        )
        return metas

    def _known_template(self, prev: dict | None) -> dict | None:
        """Before stage 1: the template this build's shards are filled from if it exists already: the
        previous version's when trained with this build's settings (its `settings_hash`), else the one an
        interrupted attempt of this build trained (`staging/.template.json`), if its file is intact."""
        from indexing.versions.manifest import check_file

        if not self.ivf:
            return None
        marker = self.staging / ".template.json"
        candidates = [
            ((prev or {}).get("faiss_template"), False),  # published: checked like any version file
            (json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None, True),
        ]
        for t, full in candidates:
            if t and t.get("settings_hash") == self.settings_hash:
                try:
                    check_file(self.root / t["path"], t, full=full)
                except IndexingError as exc:
                    log.info("not reusing the IVF template %s: %s", t["path"], exc)
                    continue
                return t
        return None

    def _tally(self, seconds: dict[str, float]) -> None:
        for k, v in seconds.items():
            self.timings[k] = self.timings.get(k, 0.0) + v

    # ---- stage 4 ----
    def _merge_bm25(self, metas: list[dict]) -> tuple[Path, dict]:
        """The version's BM25 index (in staging) and its stats: updated from the previous version's when that
        keeps it within BM25_MAX_DELETED and BM25_EXTRA_SEGMENTS (`_bm25_update`), else merged from every shard."""
        from indexing.shards.sparse import merge_lucene

        t = time.perf_counter()
        out = self.staging / ".bm25"
        stats = self._bm25_update(metas, out)
        if stats is None:
            lucene = [self.shards_dir / m["key"] / "lucene" for m in metas]
            stats = {**merge_lucene(lucene, out, self.cfg.index.bm25_segments), "updated": False}
        self.timings["bm25_merge_s"] = time.perf_counter() - t
        self.extra["bm25"] = stats
        return out, stats

    def _bm25_update(self, metas: list[dict], out: Path) -> dict | None:
        """The previous version's BM25 index with the documents of its shards this version drops deleted and
        the new shards' segments added (sparse.update_lucene: no segment is copied), or None when there is
        none here to start from, or the result would hold more than `BM25_MAX_DELETED` deleted documents
        (they count in BM25's statistics until merged away) or more than `BM25_EXTRA_SEGMENTS` segments
        beyond `index.bm25_segments` (each costs every query a little)."""
        from indexing.shards.sparse import update_lucene

        prev = self.previous
        if not prev or not prev.get("bm25") or prev["settings"]["lucene"] != self.settings["lucene"]:
            return None
        folder = self.root / "versions" / version_name(prev["version"]) / prev["bm25"]["path"]
        keys = {m["key"] for m in metas}
        dropped = [s for s in prev["shards"] if s["key"] not in keys]
        known = {s["key"] for s in prev["shards"]}
        added = [m for m in metas if m["key"] not in known]
        stores = [self.shards_dir / s["key"] for s in dropped]
        if not folder.is_dir() or not all((d / "passages.arrow").is_file() for d in stores):
            return None  # a remote build's previous version is not on this disk
        deleted = prev["bm25"].get("deleted", 0) + sum(s["passages"] for s in dropped)
        if deleted > BM25_MAX_DELETED * (deleted + sum(m["passages"] for m in metas)):
            return None
        ids = (i for d in stores for i in read_table(d).column("id").to_pylist())
        stats = update_lucene(folder, out, ids, [self.shards_dir / m["key"] / "lucene" for m in added])
        limit = self.cfg.index.bm25_segments + BM25_EXTRA_SEGMENTS
        if self.cfg.index.bm25_segments and stats["segments"] > limit:
            log.info("BM25 update left %d segments (more than %d): merging every shard", stats["segments"], limit)
            return None
        self._bm25_linked = {
            name: prev["bm25"]["files"][name] for name in prev["bm25"]["files"] if _same_file(folder / name, out / name)
        }
        return {**stats, "updated": True}

    def _previous(self) -> dict | None:
        """The published manifest this build refreshes, if any."""
        return read_manifest(self.root) if current_version(self.root) else None

    def _describe_shards(self, metas: list[dict]) -> int | None:
        """Set each shard's `files` where its task did not (checksums read from disk when used); return the
        vectors' dimension (None: BM25 only)."""
        for m in metas:
            m.setdefault("files", ShardFiles(self.shards_dir / m["key"]))
        if not self.dense or self.dim is not None:
            return self.dim
        from indexing.shards.dense import faiss_dim

        with open(self.shards_dir / metas[0]["key"] / "faiss.index", "rb") as f:
            return faiss_dim(f)

    def _publish(self, manifest: dict, metas: list[dict]) -> None:
        """Stage 4: the version's BM25 index, the manifest, CURRENT; then old versions are collected."""
        self._publish_here(manifest, metas)
        collect_garbage(self.root, self.cfg.index.keep_versions, published=manifest)

    def _id_map(self, metas: list[dict]) -> Path:
        t = time.perf_counter()
        out = self.staging / ".id_shards"
        write_id_shards([self.shards_dir / m["key"] for m in metas], out)
        self.timings["id_map_s"] = time.perf_counter() - t
        return out

    def _publish_here(self, manifest: dict, metas: list[dict]) -> None:
        bm25, stats = self._merge_bm25(metas)
        fault_point("build.bm25_merged")
        folders = {"lucene": bm25, "id_shards": self._id_map(metas)}
        known = {"lucene": self._bm25_linked, "id_shards": {}}
        for part, name in (("bm25", "lucene"), ("id_shards", "id_shards")):
            manifest[part] = {"path": name, "files": write_checksums(folders[name], known[name])}
            (folders[name] / "checksums.json").unlink()
        manifest["bm25"].update(stats)
        publish(self.root, manifest, folders)

    def _clean_staging(self) -> None:
        for stale in self.staging.iterdir():  # staged shards, .template.json, .train.parquet
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def run(self) -> dict:
        t0 = time.perf_counter()
        prev = self.previous = self._previous()
        self._check_vectors_source(prev)
        metas, n_new = self._build_shards(prev)
        dim = self._describe_shards(metas)
        keys = [m["key"] for m in metas]
        unchanged = (
            prev is not None
            and [s["key"] for s in prev["shards"]] == keys
            and prev["settings"] == self.settings
            and "id_shards" in prev  # a version from before id maps is published again, with one
        )
        if unchanged and prev is not None:
            version = prev["version"]
            log.info("corpus and settings unchanged: version %d stays published", version)
        else:
            version = (prev["version"] + 1) if prev else 1
            manifest = {
                "format": FORMAT_VERSION,
                "faiss_template": self.template,
                "version": version,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "sources": self.sources,
                "settings": self.settings,
                "dim": dim,
                "passages": sum(m["passages"] for m in metas),
                "shards": metas,
                **({"units": self.unit_entries} if self.unit_entries is not None else {}),
                "build": {
                    "shards_reused": len(metas) - n_new,
                    "shards_built": n_new,
                    "shards_reembedded": len(self.reembedded_shards),
                    "reembedded_shards": self.reembedded_shards,
                    "passages_embedded": self.embedded,
                    "vectors_reused": self.vectors_reused,
                    "records": self.read_stats.records,
                    "bad_lines_skipped": self.read_stats.bad_lines,
                    "duplicates_merged": self.passage_stats.duplicates,
                    "previous_version": prev["version"] if prev else None,
                    **self.extra,
                },
            }
            self._publish(manifest, metas)
        self._clean_staging()
        seconds = time.perf_counter() - t0
        report = {
            "index_dir": str(self.root),
            "version": version,
            "published": not unchanged,
            "records": self.read_stats.records,
            "passages": sum(m["passages"] for m in metas),
            "duplicates_merged": self.passage_stats.duplicates,
            "conflicting_duplicates": self.passage_stats.conflicting_duplicates,
            "bad_lines_skipped": self.read_stats.bad_lines,
            "skipped_examples": list(self.read_stats.skipped),
            "shards": len(metas),
            "shards_reused": len(metas) - n_new,
            "shards_built": n_new,
            "shards_reembedded": len(self.reembedded_shards),
            "passages_embedded": self.embedded,
            "vectors_reused": self.vectors_reused,
            **self.extra,
            "seconds": round(seconds, 3),
            **{k: round(v, 3) for k, v in self.timings.items()},
        }
        log.info(
            "build done: version %s, %d passages, %d shards (%d reused, %d built, %d re-embedded), "
            "%d passages embedded, %.1fs",
            version,
            report["passages"],
            report["shards"],
            report["shards_reused"],
            report["shards_built"],
            report["shards_reembedded"],
            self.embedded,
            seconds,
        )
        return report


def _same_file(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and os.path.samefile(a, b)


def _sample_sizes(units: list[Unit], size: int) -> list[int]:
    """Per unit, how many passages of smallest id hash its scan keeps for the IVF template's training sample:
    twice its share of `size` by bytes, and at least 64 (so the corpus's `size` smallest are among them, but
    for a unit far denser in passages than its bytes say). Only file sizes are looked up."""
    import fsspec

    spans = []
    for u in units:
        end = u.end if u.end is not None else fsspec.core.url_to_fs(u.path)[0].size(u.path)
        spans.append(max(1, end - u.start))
    return [min(size, max(64, math.ceil(2 * size * n / sum(spans)))) for n in spans]


def _place(jobs: list[UnitJob], summaries: list[dict]) -> list[int]:
    """Mark each scanned unit `in_place` when it and every unit before it were taken unread, each at its
    previous position; return the units taken that dropped duplicates before but are not in place."""
    in_place, redo = True, []
    for i, (job, s) in enumerate(zip(jobs, summaries)):
        prev = job.previous
        in_place = in_place and s["taken"] and prev is not None and prev.position == i
        s["in_place"] = in_place
        if s["taken"] and not in_place and prev is not None and prev.entry["duplicates"]:
            redo.append(i)
    return redo


def build_remote_index(sources: list[str], uri: str, cfg: IndexSettings, **kwargs: Any) -> dict:
    """`build_index` for a remote index directory: build locally, then upload (remote.py's module doc)."""
    from indexing.versions.manifest import read_manifest
    from indexing.versions.remote import cache_root, collect_remote_garbage, seed_build, upload_version

    scratch = cache_root(uri, cfg).with_name("builds")
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=scratch))
    try:
        seed_build(uri, cfg, work)
        report = build_local_index(sources, work, cfg, **kwargs)
        report["shards_uploaded"] = 0
        if report["published"]:
            report["shards_uploaded"] = upload_version(work, uri, read_manifest(work))
            collect_remote_garbage(uri, cfg.index.keep_versions)
        report["index_dir"] = uri
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["build_local_index", "build_remote_index", "BuildError", "CorpusError"]
