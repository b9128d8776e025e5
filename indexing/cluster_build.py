"""The cluster build (`runtime.mode=ray`): Ray workers read, split, shard, embed and index; the driver plans
and publishes.

Work units: readers.plan_units: one per corpus file (a glob becomes its matches, sorted), and a file larger
than `index.unit_bytes` (uncompressed JSONL, TSV, Parquet) is several, line-aligned byte ranges resolved by
the task that reads them (the driver only looks up file sizes). Four rounds of Ray tasks, spread over the
cluster's nodes (scheduling strategy SPREAD, one CPU each; the tasks that embed also ask for
`ray.embed_actor_num_gpus` GPUs, as the embedding actors of embed.py do):

1. scan, one task per unit: read and split the unit; return its passage count (to the driver) and, as P
   Ray objects the driver never fetches, its passages' 64-bit id hashes with a digest of title and text
   (16 bytes a passage), cut into P ranges of the id hash (P = min(units, 16)).
2. dedup, P tasks (with more than one unit): task p takes range p of every unit (each pair moves once:
   O(passages) in all) and returns per unit the ids it must drop, those an earlier unit holds (the first
   occurrence in source order wins, as in-process), each flagged when its text differs from the kept one.
3. train, only for an IVF factory without a template yet: one task per unit returns the embedding inputs of
   its share of a sample taken evenly over the corpus; one task embeds them, trains the template and writes
   it to `trained/` (build.py's template: the shard keys depend on it, so it exists before any shard).
4. build, one task per unit: read and split the unit again, drop the passages of its drop lists (its own
   P objects from round 2, never other units' ids), cut content-defined shards, and for each shard whose key
   is not under `shards/` yet: stage its passages, take the vectors of passages the previous version
   embedded from the old shards that share its first or last passage id (the shards a changed shard came
   from), embed the rest with the worker's encoder (loaded once per worker process), then FAISS, Lucene,
   checksums and the atomic rename into `shards/<key>/` (build.finalize_shard). It returns the shards'
   metadata, counts and its node id.

The driver never reads the corpus nor a vector: it holds a few hundred bytes per shard and Ray object
references. It keeps the build lock for the whole build and then does stage 4 of build.py itself: the
version's BM25 index (a merge of the shards' Lucene segments: postings and docids, no text), its id map
(from the shards' sorted id hashes, merged a hash range at a time) and publishing (manifest, then CURRENT).
Publishing stays on the one process that holds the lock, so two builders can never interleave versions.
A progress bar and the log count the units each round has finished.

Shards: content-defined boundaries restart at each unit, in-process as here, so both builds cut the same
shards with the same keys, and the search results are those of an in-process build of the same corpus.
Edits change only the shards of the edited unit near the edit (and those next to a unit boundary the edit
moved: readers.py says when one moves).

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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from indexing.build import BuildError, UnitProgress, _Builder, _ehash, build_local_index, finalize_shard
from indexing.embed import HASH_ENCODER, EncoderSpec, embed_input, get_encoder
from indexing.errors import IndexingError
from indexing.faults import fault_point
from indexing.passages import Passage, PassageStats, id_hash
from indexing.readers import ReadStats, Unit, plan_units, unit_digest
from indexing.shards import content_hash, shard_key, shard_stream
from indexing.store import read_table, save_array, write_store
from indexing.unit_reuse import unit_entry_of

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

log = logging.getLogger(__name__)

DEDUP_RANGES = 16  # at most this many dedup tasks, each over one range of the id hash of every unit


def build_cluster_index(sources: list[str], index_dir: str | os.PathLike, cfg: IndexSettings, **options: Any) -> dict:
    """`build_local_index` with stages 1-3 on Ray workers (see the module doc)."""
    return build_local_index(sources, index_dir, cfg, builder=_ClusterBuilder, **options)


class ShardStorage:
    """Where unit tasks put what they build. A local index directory (the same path on every node) is used in
    place: shards are staged under `staging/` and renamed into `shards/` (build.finalize_shard). For an fsspec
    URI, a scratch directory on the worker's node takes the staging, and each finished shard is uploaded to
    `shards/<key>/` with its `checksums.json` last (the marker of a complete shard, as remote.py uploads)."""

    def __init__(self, root: str, scratch: str | None = None):
        from indexing.remote import is_remote

        self.root, self.remote = root, is_remote(root)
        self.local = Path(cast(str, scratch) if self.remote else root)  # a remote root always comes with a scratch

    def _fs(self) -> tuple[Any, str]:
        from indexing.remote import _store

        return _store(self.root)

    def has(self, key: str) -> bool:
        if not self.remote:
            return (self.local / "shards" / key / "checksums.json").is_file()
        fs, base = self._fs()
        return fs.exists(f"{base}/shards/{key}/checksums.json")

    def files(self, key: str) -> dict:
        """A complete shard's {file: {sha256, bytes}} (its checksums.json)."""
        if not self.remote:
            return json.loads((self.local / "shards" / key / "checksums.json").read_text(encoding="utf-8"))
        fs, base = self._fs()
        return json.loads(fs.cat_file(f"{base}/shards/{key}/checksums.json"))

    def dim(self, key: str) -> int:
        """The vectors' dimension of a complete shard, from the header of its faiss.index."""
        import fsspec

        from indexing.dense import faiss_dim

        path = (
            f"{self.root}/shards/{key}/faiss.index" if self.remote else str(self.local / "shards" / key / "faiss.index")
        )
        with fsspec.open(path, "rb") as f:
            return faiss_dim(f)

    def drop_pulled(self, rel: str) -> None:
        """Remove what `fetch` pulled under `rel` (a remote index's; a local one is never copied)."""
        import shutil

        if self.remote:
            shutil.rmtree(self.local / "pulled" / rel, ignore_errors=True)

    def fetch(self, rel: str, want: dict) -> Path:
        """A local copy of the index file `rel` (a remote one pulled once into the scratch, checked)."""
        if not self.remote:
            return self.local / rel
        from indexing.remote import _pull_files

        fs, base = self._fs()
        local = self.local / "pulled" / rel
        _pull_files(fs, [(f"{base}/{rel}", local, want)])
        return local

    def put(self, path: Path, rel: str) -> None:
        """A file written in the scratch goes to `rel` of a remote index (a local one is written in place)."""
        if self.remote:
            fs, base = self._fs()
            fs.put_file(str(path), f"{base}/{rel}")

    def finish(self, stage: Path, key: str, *index_args: Any) -> dict[str, float]:
        """FAISS, Lucene and checksums of a staged shard, then into `shards/<key>/`; returns seconds."""
        done = self.local / ("shards" if not self.remote else "uploading") / key
        done.parent.mkdir(parents=True, exist_ok=True)
        seconds = finalize_shard(str(stage), str(done), *index_args)
        if self.remote:
            t = time.perf_counter()
            self.upload_finished(key)
            seconds["upload_s"] = time.perf_counter() - t
        return seconds

    def upload_finished(self, key: str) -> bool:
        """Remote: upload a shard finished in the scratch (checksums.json last) and drop it; False if none."""
        import shutil

        from indexing.remote import _upload_dir

        done = self.local / "uploading" / key
        if not self.remote or not (done / "checksums.json").is_file():
            return False
        fs, base = self._fs()
        _upload_dir(fs, done, f"{base}/shards/{key}", "checksums.json")
        shutil.rmtree(done, ignore_errors=True)
        return True


@dataclasses.dataclass(frozen=True)
class UnitJob:
    """What a worker needs for one unit: plain values (no settings object, no model resolver, crosses over)."""

    unit: Unit
    store: ShardStorage
    fmt: str
    fields: dict | None
    on_bad_line: str
    passage_words: int
    shard_size: int
    settings_hash: str
    factory: str
    threads: int
    analyzer: dict
    spec: EncoderSpec
    reuse_from: tuple[tuple[str, str, str, dict], ...]  # previous shards whose vectors fit: key, first and last
    # passage id, {file: {sha256, bytes}} of their passages.arrow and vectors.npy
    release: bool  # index.memory_budget_mb set: give free pages back after each shard
    dense: bool  # false: a BM25-only index (index.dense): no vectors, no FAISS
    template: dict | None = None
    keep_vectors: bool = True  # index.keep_vectors

    def key(self, content: str) -> str:
        """The shard key, as build._Builder._shard_key."""
        return shard_key(content, self.settings_hash + (f":{self.template['sha256']}" if self.template else ""))


def _node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _passages(job: UnitJob, rs: ReadStats, ps: PassageStats) -> Iterator[Passage]:
    from indexing.passages import passages_of
    from indexing.readers import read_corpus

    return passages_of(
        read_corpus(job.unit, job.fmt, dict(job.fields or {}), job.on_bad_line, rs), job.passage_words, ps
    )


def _digest(title: str, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=8).digest(), "little")


# ---- round 1 ----
def scan_unit(job: UnitJob, ranges: int) -> list:
    """The unit's counts (small, for the driver), then its (id hash, text digest) pairs sorted by id hash
    and cut into `ranges` equal ranges of the hash (one array each; `ranges` 0: one empty array)."""
    rs, ps = ReadStats(), PassageStats()
    if not ranges:  # the only unit: no ids to compare
        return [{"passages": sum(1 for _ in _passages(job, rs, ps)), "node": _node()}, np.zeros((0, 2), np.uint64)]
    flat = np.fromiter(
        itertools.chain.from_iterable((id_hash(p.id), _digest(p.title, p.text)) for p in _passages(job, rs, ps)),
        dtype=np.uint64,
    )
    pairs = flat.reshape(-1, 2)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    edges = np.array([(r << 64) // ranges for r in range(1, ranges)], dtype=np.uint64)
    return [{"passages": len(pairs), "node": _node()}, *np.split(pairs, np.searchsorted(pairs[:, 0], edges))]


# ---- round 2 ----
def dedup_range(*per_unit: np.ndarray) -> list[np.ndarray]:
    """One hash range of every unit's (id hash, digest) pairs, in unit order (ids unique within a unit) ->
    per unit, the (id hash, conflicting) pairs it must drop: ids an earlier unit holds, flagged 1 when the
    digest differs from the earliest unit's. Sorted by id hash."""
    pairs = np.concatenate(per_unit)
    unit: np.ndarray = np.repeat(np.arange(len(per_unit)), [len(p) for p in per_unit])
    order = np.lexsort((unit, pairs[:, 0]))  # by id hash, then unit: each id's first occurrence leads
    ids, digests, unit = pairs[order, 0], pairs[order, 1], unit[order]
    first: np.ndarray = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    kept = np.maximum.accumulate(np.where(first, np.arange(len(ids)), 0))  # each row's first occurrence
    later = np.flatnonzero(~first)
    later = later[np.argsort(unit[later], kind="stable")]  # grouped by unit, by id hash within each
    drops = np.column_stack((ids[later], (digests[later] != digests[kept[later]]).astype(np.uint64)))
    return np.split(drops, np.searchsorted(unit[later], np.arange(1, len(per_unit))))


# ---- round 3 (IVF) ----
def sample_unit(job: UnitJob, rows: np.ndarray) -> list[str]:
    """The embedding inputs of the unit's passages at positions `rows` (sorted)."""
    wanted, out = set(rows.tolist()), []
    for i, p in enumerate(_passages(job, ReadStats(), PassageStats())):
        if i in wanted:
            out.append(embed_input(p.title, p.text))
    return out


def train_unit_template(
    spec: EncoderSpec, factory: str, store: ShardStorage, settings_hash: str, *samples: list[str]
) -> dict:
    """Embed the sample, train the IVF template, write `trained/<sha>.index`; return its manifest entry."""
    from indexing.dense import train_template
    from indexing.manifest import sha256_file

    t = time.perf_counter()
    texts = [x for s in samples for x in s]
    vecs = get_encoder(spec).encode(texts)
    out = store.local / "trained" / f".template.{os.getpid()}.tmp"
    out.parent.mkdir(parents=True, exist_ok=True)
    train_template(vecs, factory, out)
    digest = sha256_file(out)
    final = out.with_name(f"{digest[:16]}.index")
    os.replace(out, final)
    store.put(final, f"trained/{final.name}")
    return {
        "path": f"trained/{final.name}",
        "sha256": digest,
        "bytes": final.stat().st_size,
        "settings_hash": settings_hash,
        "seconds": time.perf_counter() - t,
        "passages": len(texts),
    }


# ---- round 4 ----
def build_unit(job: UnitJob, *drop_lists: np.ndarray) -> dict:
    """Cut the unit's shards (without the passages of its drop lists: ids earlier units hold, round 2)
    and build those not yet built."""
    from indexing.native_memory import release_free_memory

    t0 = time.perf_counter()
    drops = np.concatenate(drop_lists) if drop_lists else np.zeros((0, 2), np.uint64)
    drops = drops[np.argsort(drops[:, 0], kind="stable")]
    keys, conflicting = np.ascontiguousarray(drops[:, 0]), drops[:, 1]
    rs, ps = ReadStats(), PassageStats()
    out: dict[str, Any] = {
        "node": _node(),
        "shards": [],
        "built": 0,
        "reembedded": [],
        "embedded": 0,
        "vectors_reused": 0,
        "duplicates": 0,
        "conflicting": 0,
        "timings": {},
    }

    def fresh() -> Iterator[Passage]:
        for p in _passages(job, rs, ps):
            h = np.uint64(id_hash(p.id))
            i = int(np.searchsorted(keys, h))
            if i < len(keys) and keys[i] == h:
                out["duplicates"] += 1
                out["conflicting"] += int(conflicting[i])
                continue
            yield p

    for group in shard_stream(fresh(), job.shard_size):
        ch = content_hash(group)
        meta: dict[str, Any] = {
            "key": job.key(ch),
            "passages": len(group),
            "content_hash": ch,
            "first_id": group[0].id,
            "last_id": group[-1].id,
        }
        if not job.store.has(meta["key"]):
            _build_shard(job, group, meta, out)
            if job.release:
                release_free_memory()
        meta["files"] = job.store.files(meta["key"])
        out["shards"].append(meta)
        if "dim" not in out:
            out["dim"] = job.store.dim(meta["key"]) if job.dense else None
    dropped = out.pop("duplicates")  # passages_of counted them as passages of this unit
    ps.passages -= dropped
    ps.duplicates += dropped
    ps.conflicting_duplicates += out.pop("conflicting")
    out["read"] = dataclasses.asdict(rs)
    out["passage_stats"] = dataclasses.asdict(ps)
    t_digest = time.perf_counter()
    out["bytes_sha256"] = unit_digest(job.unit, job.fmt)  # for the manifest's units (unit_reuse.py)
    out["timings"]["unit_digest_s"] = time.perf_counter() - t_digest
    out["timings"]["unit_task_s"] = time.perf_counter() - t0
    return out


def _tally(timings: dict, seconds: dict) -> None:
    for k, v in seconds.items():
        timings[k] = timings.get(k, 0.0) + v


def _build_shard(job: UnitJob, group: list, meta: dict, out: dict) -> None:
    out["built"] += 1
    if job.store.upload_finished(meta["key"]):  # built before an interruption, not yet uploaded
        return
    stage = job.store.local / "staging" / shard_key(meta["content_hash"], job.settings_hash)  # as build._stage_dir
    t = time.perf_counter()
    if not (stage / "passages.arrow").is_file():
        stage.mkdir(parents=True, exist_ok=True)
        write_store(group, stage)
    _tally(out["timings"], {"passages_s": time.perf_counter() - t})
    if job.dense and not (stage / "vectors.npy").is_file():
        t = time.perf_counter()
        embedded, reused = _stage_vectors(job, stage, meta["key"], {p.id for p in group})
        out["embedded"] += embedded
        out["vectors_reused"] += reused
        if embedded:
            out["reembedded"].append(meta["key"])
        _tally(out["timings"], {"embed_s": time.perf_counter() - t})
        fault_point("build.shard_embedded")
    tpl = job.template
    template = str(job.store.fetch(tpl["path"], {"sha256": tpl["sha256"], "bytes": tpl["bytes"]})) if tpl else None
    factory = job.factory if job.dense else None
    _tally(
        out["timings"],
        job.store.finish(stage, meta["key"], factory, job.threads, template, job.analyzer, job.keep_vectors),
    )


def _stage_vectors(job: UnitJob, stage: Path, key: str, ids: set[str]) -> tuple[int, int]:
    """Write the staged shard's `vectors.npy`: rows the previous version embedded (in the old shards sharing
    this shard's first or last id) are copied, the rest embedded here. Returns (embedded, copied)."""
    cache: dict[bytes, tuple[str, int]] = {}
    old_dirs: dict[str, Path] = {}
    for old, first, last, files in job.reuse_from:
        if old != key and (first in ids or last in ids):
            old_dirs[old] = job.store.fetch(f"shards/{old}/vectors.npy", files["vectors.npy"]).parent
            job.store.fetch(f"shards/{old}/passages.arrow", files["passages.arrow"])
            t = read_table(old_dirs[old])
            for row, pair in enumerate(zip(t.column("title").to_pylist(), t.column("text").to_pylist())):
                cache.setdefault(_ehash(*pair), (old, row))
    t = read_table(stage)
    inputs = [embed_input(a, b) for a, b in zip(t.column("title").to_pylist(), t.column("text").to_pylist())]
    hits = [cache.get(_ehash(a, b)) for a, b in zip(t.column("title").to_pylist(), t.column("text").to_pylist())]
    del t, cache
    todo = [r for r, h in enumerate(hits) if h is None]
    encoder = get_encoder(job.spec)
    step = job.spec.batch_size * 4
    new = [encoder.encode([inputs[r] for r in todo[i : i + step]]) for i in range(0, len(todo), step)]
    copied = [(r, h) for r, h in enumerate(hits) if h is not None]
    dim = new[0].shape[1] if new else np.load(old_dirs[copied[0][1][0]] / "vectors.npy", mmap_mode="r").shape[1]
    vecs = np.zeros((len(inputs), dim), dtype=np.float32)
    if todo:
        vecs[todo] = np.concatenate(new)
    by_old: dict[str, list[tuple[int, int]]] = {}
    for r, (old, row) in copied:
        by_old.setdefault(old, []).append((r, row))
    for old, pairs in by_old.items():
        rows, old_rows = zip(*pairs)
        vecs[list(rows)] = np.load(old_dirs[old] / "vectors.npy", mmap_mode="r")[list(old_rows)]
    save_array(stage / "vectors.npy", vecs)
    for old in old_dirs:
        job.store.drop_pulled(f"shards/{old}")
    return len(todo), len(copied)


def _gather(refs: list, stage: str | None = None) -> list:
    """Every task's result, in order; after all have ended, the first failure is raised (its own
    IndexingError where a task raised one, so the message is the one-line error of an in-process build).
    With a `stage` name (one task per unit), the units done are shown (build.UnitProgress)."""
    import ray
    from ray.exceptions import RayTaskError

    results, error, pending = {}, None, list(refs)
    progress = UnitProgress(stage, len(refs)) if stage else None
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            results[done[0]] = ray.get(done[0])
        except Exception as exc:  # noqa: BLE001 (re-raised below, once every task has ended)
            error = error or exc
        if progress:
            progress.done()
    if progress:
        progress.close()
    if error is not None:
        cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
        if isinstance(cause, IndexingError):
            raise cause from None
        raise error
    return [results[r] for r in refs]


class _ClusterBuilder(_Builder):
    """build._Builder with stages 1-3 as Ray tasks (rounds 1-4 of the module doc); stage 4 is the base class's."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.store = ShardStorage(str(self.root))
        self.dim: int | None = None

    def _job(self, unit: Unit, prev: dict | None) -> UnitJob:
        cfg = self.cfg
        same_model = (
            self.dense
            and prev is not None
            and prev["settings"].get("dense", True)
            and prev["settings"]["embedding_hash"] == self.settings["embedding_hash"]
        )
        return UnitJob(
            unit=unit,
            store=self.store,
            fmt=self.fmt,
            fields=self.fields,
            on_bad_line=self.on_bad_line,
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
        )

    def _build_shards(self, prev: dict | None) -> tuple[list[dict], int]:
        import ray

        from indexing.raytools import init_ray

        init_ray(self.cfg.ray.address, self.cfg.ray.num_cpus)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self.template = self._known_template(prev)
        units = plan_units(self.sources, self.fmt, self.cfg.index.unit_bytes)
        jobs = [self._job(u, prev) for u in units]
        from indexing.embed import resolve_device
        from indexing.raytools import embed_actor_gpus

        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
        spec = jobs[0].spec
        embeds = self.dense and spec.model_name != HASH_ENCODER
        gpus = embed_actor_gpus(self.cfg, resolve_device(spec.device)) if embeds else 0
        embedding_task = ray.remote(num_cpus=1, num_gpus=gpus, scheduling_strategy="SPREAD")  # train and build
        t = time.perf_counter()
        ranges = min(len(jobs), DEDUP_RANGES) if len(jobs) > 1 else 0  # one unit: no earlier unit's ids
        scans = [task(scan_unit).options(num_returns=1 + max(ranges, 1)).remote(j, ranges) for j in jobs]
        counts = _gather([s[0] for s in scans], "scan")
        self.timings["scan_s"] = time.perf_counter() - t
        drops: list[list] = [[] for _ in jobs]  # per unit: its drop list from each dedup task
        if ranges:
            t = time.perf_counter()
            for r in range(ranges):
                per_unit = task(dedup_range).options(num_returns=len(jobs)).remote(*[s[1 + r] for s in scans])
                for unit_drops, ref in zip(drops, per_unit):
                    unit_drops.append(ref)
            refs = [ref for d in drops for ref in d]
            ray.wait(refs, num_returns=len(refs), fetch_local=False)  # failures surface in the build round
            self.timings["dedup_s"] = time.perf_counter() - t
        del scans  # the id hashes leave the object store
        if self.template is None and self.ivf:
            self.template = self._train_on_cluster(task, embedding_task, jobs, [c["passages"] for c in counts])
            jobs = [dataclasses.replace(j, template=self.template) for j in jobs]
        t = time.perf_counter()
        results = _gather([embedding_task(build_unit).remote(j, *d) for j, d in zip(jobs, drops)], "build")
        self.timings["unit_tasks_wait_s"] = time.perf_counter() - t
        metas = self._collect(units, counts, results)
        fault_point("build.passages_staged")
        return metas, sum(r["built"] for r in results)

    def _train_on_cluster(self, task: Any, embedding_task: Any, jobs: list[UnitJob], counts: list[int]) -> dict:
        from indexing.manifest import atomic_write

        total = sum(counts)
        picks = np.unique(
            np.linspace(0, max(total - 1, 0), min(total, self.cfg.index.faiss_train_size)).astype(np.int64)
        )
        samples, start = [], 0
        for job, n in zip(jobs, counts):
            rows = picks[(picks >= start) & (picks < start + n)] - start
            if len(rows):
                samples.append(task(sample_unit).remote(job, rows))
            start += n
        template = _gather(
            [
                embedding_task(train_unit_template).remote(
                    jobs[0].spec, self.cfg.index.faiss_factory, self.store, self.settings_hash, *samples
                )
            ]
        )[0]
        self.timings["faiss_train_s"] = template.pop("seconds")
        log.info("trained %s on %d passages on the cluster", self.cfg.index.faiss_factory, template.pop("passages"))
        atomic_write(self.staging / ".template.json", json.dumps(template))  # a rerun reuses it
        return template

    def _collect(self, units: list[Unit], counts: list[dict], results: list[dict]) -> list[dict]:
        metas: list[dict] = []
        nodes: dict[str, int] = {}
        self.unit_entries = []  # the manifest's units, as in-process: a later incremental build may take them
        for unit, count, r in zip(units, counts, results):
            metas += r["shards"]
            self.unit_entries.append(
                unit_entry_of(
                    str(unit), self._unit_digest(r["bytes_sha256"]), len(r["shards"]), r["read"], r["passage_stats"]
                )
            )
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
            raise BuildError(
                f"no passages in {', '.join(self.sources)}"
                + (f" ({self.read_stats.bad_lines} bad lines skipped)" if self.read_stats.bad_lines else "")
            )
        self.dim = next((r["dim"] for r in results if "dim" in r), None)  # a unit may have no shard
        self.extra = {"units": len(units), "tasks_by_node": nodes}
        log.info("cluster build: %d units, %d shards, tasks on %d nodes", len(units), len(metas), len(nodes))
        return metas

    def _describe_shards(self, metas: list[dict]) -> int | None:
        return self.dim  # the tasks set each shard's files; None for a BM25-only index


def build_remote_cluster_index(
    sources: list[str],
    uri: str,
    cfg: IndexSettings,
    *,
    fmt: str = "auto",
    fields: dict | None = None,
    on_bad_line: str = "error",
) -> dict:
    """The cluster build of an fsspec index (s3://, gs://, ...): see `_RemoteClusterBuilder`."""
    import shutil
    import tempfile

    from indexing.remote import cache_root

    cache = cache_root(uri, cfg)
    scratch = cache.with_name("builds")
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=scratch))
    try:
        builder = _RemoteClusterBuilder(sources, work, cfg, fmt, fields, on_bad_line)
        builder.uri = uri
        builder.store = ShardStorage(uri, str(cache.with_name(cache.name + ".build")))  # the same path on each node
        report = builder.run()
        report.update(index_dir=uri, shards_uploaded=report["shards_built"])
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _RemoteClusterBuilder(_ClusterBuilder):
    """The tasks upload each shard straight to the store (ShardStorage). The driver works in a local folder: it
    pulls the shards' Lucene indexes (postings and docids; never passages nor vectors) and `ids.npy` (8 bytes a
    passage) for the version's BM25 merge and id map, publishes there and uploads the version (remote.upload_version: manifest last, then CURRENT).
    Object stores have no lock: one builder per remote index at a time, as remote.py says."""

    uri: str

    def _previous(self) -> dict | None:
        from indexing.remote import _store, remote_manifest

        fs, base = _store(self.uri)
        return remote_manifest(self.uri) if fs.exists(f"{base}/CURRENT") else None

    def _known_template(self, prev: dict | None) -> dict | None:
        t = (prev or {}).get("faiss_template")
        return t if t and t.get("settings_hash") == self.settings_hash else None  # tasks check it when they pull it

    def _publish(self, manifest: dict, metas: list[dict]) -> None:
        from indexing.remote import _pull_files, _store, collect_remote_garbage, upload_version

        fs, base = _store(self.uri)
        t = time.perf_counter()
        _pull_files(
            fs,
            [
                (f"{base}/shards/{m['key']}/{rel}", self.shards_dir / m["key"] / rel, want)
                for m in metas
                for rel, want in m["files"].items()
                if rel.startswith("lucene/") or rel == "ids.npy"  # the BM25 merge's and the id map's inputs
            ],
        )
        self.timings["lucene_pull_s"] = time.perf_counter() - t
        self._publish_here(manifest, metas)
        upload_version(self.root, self.uri, manifest)
        collect_remote_garbage(self.uri, self.cfg.index.keep_versions)
