"""The cluster build (`runtime.mode=ray`): Ray workers read, split, shard, embed and index; the driver plans
and publishes.

Work units: one per corpus file (a source with glob characters is expanded with fsspec, matches sorted).
Three rounds of Ray tasks, spread over the cluster's nodes (scheduling strategy SPREAD, one CPU each):

1. scan, one task per unit: read and split the unit; return its passage count (to the driver) and, as a
   Ray object the driver never fetches, its passages' 64-bit id hashes with a digest of title and text
   (16 bytes a passage).
2. train, only for an IVF factory without a template yet: one task per unit returns the embedding inputs of
   its share of a sample taken evenly over the corpus; one task embeds them, trains the template and writes
   it to `trained/` (build.py's template: the shard keys depend on it, so it exists before any shard).
3. build, one task per unit: read and split the unit again, drop the passages whose id an earlier unit has
   (the ids of units 0..i-1 from round 1 reach the task as Ray objects: the first occurrence in source order
   wins, as in-process), cut content-defined shards, and for each shard whose key is not under `shards/`
   yet: stage its passages, take the vectors of passages the previous version embedded from the old shards
   that share its first or last passage id (the shards a changed shard came from), embed the rest with the
   worker's encoder (loaded once per worker process), then FAISS, Lucene, checksums and the atomic rename
   into `shards/<key>/` (build.finalize_shard). It returns the shards' metadata, counts and its node id.

The driver never reads the corpus nor a vector: it holds a few hundred bytes per shard. It keeps the build
lock for the whole build and then does stage 4 of build.py itself: the version's BM25 index (a merge of the
shards' Lucene segments: postings and docids, no text) and publishing (manifest, then CURRENT). Publishing
stays on the one process that holds the lock, so two builders can never interleave versions.

Shards: content-defined boundaries restart at each unit, so a unit's shards are those an in-process build of
that file alone would cut (with one file: the in-process build's shards and keys exactly; with several, the
shards differ only where one file ends and the next begins). Edits change only the shards of the edited
file near the edit; the search results are those of an in-process build of the same corpus.

Resume: a task that fails (or whose worker dies; Ray retries it) leaves the shards it finished under
`shards/` and staged passages and vectors under `staging/`; the retry or a rerun of the build skips or
reuses them. The driver waits for every task before it raises the first error, so no task writes after the
build lock is released. The index directory must be the same path on every node (one machine, or a shared
file system).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from indexing.build import BuildError, _Builder, _ehash, build_local_index, finalize_shard
from indexing.dense import is_ivf
from indexing.embed import EncoderSpec, embed_input, get_encoder
from indexing.errors import IndexingError
from indexing.faults import fault_point
from indexing.passages import PassageStats, id_hash
from indexing.readers import ReadStats
from indexing.shards import content_hash, shard_key, shard_stream
from indexing.store import read_table, write_store

log = logging.getLogger(__name__)


def build_cluster_index(sources: list[str], index_dir, cfg, **options) -> dict:
    """`build_local_index` with stages 1-3 on Ray workers (see the module doc)."""
    return build_local_index(sources, index_dir, cfg, builder=_ClusterBuilder, **options)


def work_units(sources: list[str]) -> list[str]:
    """One unit per file: sources as given, a glob expanded to its matches (sorted)."""
    import fsspec

    units = []
    for src in sources:
        if not any(c in src for c in "*?["):
            units.append(src)
            continue
        fs, _ = fsspec.core.url_to_fs(src)
        matches = sorted(fs.glob(src))
        if not matches:
            raise BuildError(f"no corpus file matches {src}")
        protocol = src.split("://", 1)[0] + "://" if "://" in src else ""
        units += [m if "://" in m or not protocol else protocol + m for m in matches]
    return units


@dataclasses.dataclass(frozen=True)
class UnitJob:
    """What a worker needs for one unit: plain values (no settings object, no model resolver, crosses over)."""

    unit: str
    fmt: str
    fields: dict | None
    on_bad_line: str
    passage_words: int
    shard_size: int
    root: str
    settings_hash: str
    factory: str
    threads: int
    analyzer: dict
    spec: EncoderSpec
    reuse_from: tuple[tuple[str, str, str], ...]  # previous shards (key, first id, last id) whose vectors fit
    release: bool  # index.memory_budget_mb set: give free pages back after each shard
    template: dict | None = None

    def key(self, content: str) -> str:
        """The shard key, as build._Builder._shard_key."""
        return shard_key(content, self.settings_hash + (f":{self.template['sha256']}" if self.template else ""))


def _node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _passages(job: UnitJob, rs: ReadStats, ps: PassageStats):
    from indexing.passages import passages_of
    from indexing.readers import read_corpus

    return passages_of(read_corpus(job.unit, job.fmt, dict(job.fields or {}), job.on_bad_line, rs), job.passage_words, ps)


def _digest(title: str, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{title}\n{text}".encode("utf-8"), digest_size=8).digest(), "little")


# ---- round 1 ----
def scan_unit(job: UnitJob) -> tuple[dict, np.ndarray]:
    """The unit's counts (small, for the driver) and its (id hash, text digest) pairs sorted by id hash."""
    rs, ps = ReadStats(), PassageStats()
    flat = np.fromiter(itertools.chain.from_iterable((id_hash(p.id), _digest(p.title, p.text))
                                                     for p in _passages(job, rs, ps)), dtype=np.uint64)
    pairs = flat.reshape(-1, 2)
    return {"passages": len(pairs), "node": _node()}, pairs[np.argsort(pairs[:, 0], kind="stable")]


# ---- round 2 (IVF) ----
def sample_unit(job: UnitJob, rows: np.ndarray) -> list[str]:
    """The embedding inputs of the unit's passages at positions `rows` (sorted)."""
    wanted, out = set(rows.tolist()), []
    for i, p in enumerate(_passages(job, ReadStats(), PassageStats())):
        if i in wanted:
            out.append(embed_input(p.title, p.text))
    return out


def train_unit_template(spec: EncoderSpec, factory: str, root: str, settings_hash: str, *samples: list[str]) -> dict:
    """Embed the sample, train the IVF template, write `trained/<sha>.index`; return its manifest entry."""
    from indexing.dense import train_template
    from indexing.manifest import sha256_file

    t = time.perf_counter()
    texts = [x for s in samples for x in s]
    vecs = get_encoder(spec).encode(texts)
    out = Path(root) / "trained" / f".template.{os.getpid()}.tmp"
    out.parent.mkdir(exist_ok=True)
    train_template(vecs, factory, out)
    digest = sha256_file(out)
    final = out.with_name(f"{digest[:16]}.index")
    os.replace(out, final)
    return {"path": f"trained/{final.name}", "sha256": digest, "bytes": final.stat().st_size,
            "settings_hash": settings_hash, "seconds": time.perf_counter() - t, "passages": len(texts)}


# ---- round 3 ----
def build_unit(job: UnitJob, *earlier: np.ndarray) -> dict:
    """Cut the unit's shards (without the passages earlier units hold) and build those not yet built."""
    from indexing.native_memory import release_free_memory

    t0 = time.perf_counter()
    seen = np.concatenate(earlier) if earlier else np.zeros((0, 2), np.uint64)
    seen = seen[np.argsort(seen[:, 0], kind="stable")]
    keys, digests = np.ascontiguousarray(seen[:, 0]), np.ascontiguousarray(seen[:, 1])
    rs, ps = ReadStats(), PassageStats()
    out = {"node": _node(), "shards": [], "built": 0, "reembedded": [], "embedded": 0, "vectors_reused": 0,
           "duplicates": 0, "conflicting": 0, "timings": {}}

    def fresh():
        for p in _passages(job, rs, ps):
            h = np.uint64(id_hash(p.id))
            i = int(np.searchsorted(keys, h))
            if i < len(keys) and keys[i] == h:
                out["duplicates"] += 1
                out["conflicting"] += int(digests[i]) != _digest(p.title, p.text)
                continue
            yield p

    root = Path(job.root)
    for group in shard_stream(fresh(), job.shard_size):
        ch = content_hash(group)
        meta = {"key": job.key(ch), "passages": len(group), "content_hash": ch,
                "first_id": group[0].id, "last_id": group[-1].id}
        if not (root / "shards" / meta["key"] / "checksums.json").is_file():
            _build_shard(job, group, meta, out)
            if job.release:
                release_free_memory()
        out["shards"].append(meta)
    dropped = out.pop("duplicates")  # passages_of counted them as passages of this unit
    ps.passages -= dropped
    ps.duplicates += dropped
    ps.conflicting_duplicates += out.pop("conflicting")
    out["read"] = dataclasses.asdict(rs)
    out["passage_stats"] = dataclasses.asdict(ps)
    out["timings"]["unit_task_s"] = time.perf_counter() - t0
    return out


def _tally(timings: dict, seconds: dict) -> None:
    for k, v in seconds.items():
        timings[k] = timings.get(k, 0.0) + v


def _build_shard(job: UnitJob, group: list, meta: dict, out: dict) -> None:
    root = Path(job.root)
    stage = root / "staging" / shard_key(meta["content_hash"], job.settings_hash)  # build._Builder._stage_dir
    t = time.perf_counter()
    if not (stage / "passages.arrow").is_file():
        stage.mkdir(parents=True, exist_ok=True)
        write_store(group, stage)
    _tally(out["timings"], {"passages_s": time.perf_counter() - t})
    if not (stage / "vectors.npy").is_file():
        t = time.perf_counter()
        embedded, reused = _stage_vectors(job, stage, meta["key"], {p.id for p in group})
        out["embedded"] += embedded
        out["vectors_reused"] += reused
        if embedded:
            out["reembedded"].append(meta["key"])
        _tally(out["timings"], {"embed_s": time.perf_counter() - t})
        fault_point("build.shard_embedded")
    template = str(root / job.template["path"]) if job.template else None
    _tally(out["timings"], finalize_shard(str(stage), str(root / "shards" / meta["key"]), job.factory, job.threads,
                                          template, job.analyzer))
    out["built"] += 1


def _stage_vectors(job: UnitJob, stage: Path, key: str, ids: set[str]) -> tuple[int, int]:
    """Write the staged shard's `vectors.npy`: rows the previous version embedded (in the old shards sharing
    this shard's first or last id) are copied, the rest embedded here. Returns (embedded, copied)."""
    shards = Path(job.root) / "shards"
    cache: dict[bytes, tuple[str, int]] = {}
    for old, first, last in job.reuse_from:
        if old != key and (first in ids or last in ids) and (shards / old / "vectors.npy").is_file():
            t = read_table(shards / old)
            for row, pair in enumerate(zip(t.column("title").to_pylist(), t.column("text").to_pylist())):
                cache.setdefault(_ehash(*pair), (old, row))
    t = read_table(stage)
    inputs = [embed_input(a, b) for a, b in zip(t.column("title").to_pylist(), t.column("text").to_pylist())]
    hits = [cache.get(_ehash(a, b)) for a, b in zip(t.column("title").to_pylist(), t.column("text").to_pylist())]
    del t, cache
    todo = [r for r, h in enumerate(hits) if h is None]
    encoder = get_encoder(job.spec)
    step = job.spec.batch_size * 4
    new = [encoder.encode([inputs[r] for r in todo[i:i + step]]) for i in range(0, len(todo), step)]
    copied = [(r, h) for r, h in enumerate(hits) if h is not None]
    dim = new[0].shape[1] if new else np.load(shards / copied[0][1][0] / "vectors.npy", mmap_mode="r").shape[1]
    vecs = np.zeros((len(inputs), dim), dtype=np.float32)
    if todo:
        vecs[todo] = np.concatenate(new)
    for r, (old, row) in copied:
        vecs[r] = np.load(shards / old / "vectors.npy", mmap_mode="r")[row]
    tmp = stage / ".vectors.npy.tmp"
    with open(tmp, "wb") as f:
        np.save(f, vecs)
    os.replace(tmp, stage / "vectors.npy")
    return len(todo), len(copied)


def _gather(refs: list) -> list:
    """Every task's result, in order; after all have ended, the first failure is raised (its own
    IndexingError where a task raised one, so the message is the one-line error of an in-process build)."""
    import ray
    from ray.exceptions import RayTaskError

    results, error, pending = {}, None, list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            results[done[0]] = ray.get(done[0])
        except Exception as exc:  # noqa: BLE001 (re-raised below, once every task has ended)
            error = error or exc
    if error is not None:
        cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
        if isinstance(cause, IndexingError):
            raise cause from None
        raise error
    return [results[r] for r in refs]


class _ClusterBuilder(_Builder):
    """build._Builder with stages 1-3 as Ray tasks (the module doc); stage 4 is the base class's."""

    def _job(self, unit: str, prev: dict | None) -> UnitJob:
        cfg = self.cfg
        same_model = prev is not None and prev["settings"]["embedding_hash"] == self.settings["embedding_hash"]
        return UnitJob(
            unit=unit, fmt=self.fmt, fields=self.fields, on_bad_line=self.on_bad_line,
            passage_words=cfg.index.passage_words, shard_size=self.settings["shard_size"], root=str(self.root),
            settings_hash=self.settings_hash, factory=cfg.index.faiss_factory, threads=cfg.index.threads,
            analyzer=self.settings["lucene"]["analyzer"], spec=EncoderSpec.from_config(cfg, build=True),
            reuse_from=tuple((s["key"], s["first_id"], s["last_id"]) for s in prev["shards"]) if same_model else (),
            release=bool(cfg.index.memory_budget_mb), template=self.template)

    def _build_shards(self, prev: dict | None) -> tuple[list[dict], int]:
        import ray

        from indexing.raytools import ensure_ray

        ensure_ray(self.cfg)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self.template = self._known_template(prev)
        units = work_units(self.sources)
        jobs = [self._job(u, prev) for u in units]
        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
        t = time.perf_counter()
        scans = [task(scan_unit).options(num_returns=2).remote(j) for j in jobs]
        counts = _gather([c for c, _ in scans])
        ids = [i for _, i in scans]
        self.timings["scan_s"] = time.perf_counter() - t
        if self.template is None and is_ivf(self.cfg.index.faiss_factory):
            self.template = self._train_on_cluster(task, jobs, [c["passages"] for c in counts])
            jobs = [dataclasses.replace(j, template=self.template) for j in jobs]
        t = time.perf_counter()
        results = _gather([task(build_unit).remote(j, *ids[:i]) for i, j in enumerate(jobs)])
        self.timings["unit_tasks_wait_s"] = time.perf_counter() - t
        metas = self._collect(units, counts, results)
        fault_point("build.passages_staged")
        return metas, sum(r["built"] for r in results)

    def _train_on_cluster(self, task, jobs: list[UnitJob], counts: list[int]) -> dict:
        from indexing.manifest import atomic_write

        total = sum(counts)
        picks = np.unique(np.linspace(0, max(total - 1, 0), min(total, self.cfg.index.faiss_train_size)).astype(np.int64))
        samples, start = [], 0
        for job, n in zip(jobs, counts):
            rows = picks[(picks >= start) & (picks < start + n)] - start
            if len(rows):
                samples.append(task(sample_unit).remote(job, rows))
            start += n
        template = _gather([task(train_unit_template).remote(jobs[0].spec, self.cfg.index.faiss_factory,
                                                             str(self.root), self.settings_hash, *samples)])[0]
        self.timings["faiss_train_s"] = template.pop("seconds")
        log.info("trained %s on %d passages on the cluster", self.cfg.index.faiss_factory, template.pop("passages"))
        atomic_write(self.staging / ".template.json", json.dumps(template))  # a rerun reuses it
        return template

    def _collect(self, units: list[str], counts: list[dict], results: list[dict]) -> list[dict]:
        metas, nodes = [], {}
        for unit, count, r in zip(units, counts, results):
            metas += r["shards"]
            self.embedded += r["embedded"]
            self.vectors_reused += r["vectors_reused"]
            self.reembedded_shards += r["reembedded"]
            self.read_stats.records += r["read"]["records"]
            self.read_stats.bad_lines += r["read"]["bad_lines"]
            self.read_stats.skipped += r["read"]["skipped"][: 20 - len(self.read_stats.skipped)]
            for k in ("passages", "duplicates", "conflicting_duplicates", "empty"):
                setattr(self.passage_stats, k, getattr(self.passage_stats, k) + r["passage_stats"][k])
            self._tally(r["timings"])
            for node in (count["node"], r["node"]):
                nodes[node] = nodes.get(node, 0) + 1
        if self.read_stats.records == 0 or not metas:
            raise BuildError(f"no passages in {', '.join(self.sources)}"
                             + (f" ({self.read_stats.bad_lines} bad lines skipped)" if self.read_stats.bad_lines else ""))
        self.extra = {"units": len(units), "tasks_by_node": nodes}
        log.info("cluster build: %d units, %d shards, tasks on %d nodes", len(units), len(metas), len(nodes))
        return metas
