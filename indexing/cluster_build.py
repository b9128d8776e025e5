"""The cluster build (`runtime.mode=ray`): Ray workers read, split, shard, embed and index; the driver plans
and publishes.

Work units: one per corpus file (readers.expand_sources: a glob becomes its matches, sorted).
Three rounds of Ray tasks, spread over the cluster's nodes (scheduling strategy SPREAD, one CPU each; the
tasks that embed also ask for `ray.embed_actor_num_gpus` GPUs, as the embedding actors of embed.py do):

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
shards' Lucene segments: postings and docids, no text), its id map (from the shards' sorted id hashes, merged
a hash range at a time) and publishing (manifest, then CURRENT). Publishing
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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from indexing.build import BuildError, _Builder, _ehash, build_local_index, finalize_shard
from indexing.embed import HASH_ENCODER, EncoderSpec, embed_input, get_encoder
from indexing.errors import IndexingError
from indexing.faults import fault_point
from indexing.passages import Passage, PassageStats, id_hash
from indexing.readers import ReadStats, expand_sources
from indexing.shards import content_hash, shard_key, shard_stream
from indexing.store import read_table, write_store

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

log = logging.getLogger(__name__)


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
        """The vectors' dimension of a complete shard, from the header of its vectors.npy."""
        import fsspec

        npy = np.lib.format
        path = (
            f"{self.root}/shards/{key}/vectors.npy" if self.remote else str(self.local / "shards" / key / "vectors.npy")
        )
        with fsspec.open(path, "rb") as f:
            version = npy.read_magic(f)
            shape = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(f)[0]
        return int(shape[1])

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

    unit: str
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
def scan_unit(job: UnitJob) -> tuple[dict, np.ndarray]:
    """The unit's counts (small, for the driver) and its (id hash, text digest) pairs sorted by id hash."""
    rs, ps = ReadStats(), PassageStats()
    flat = np.fromiter(
        itertools.chain.from_iterable((id_hash(p.id), _digest(p.title, p.text)) for p in _passages(job, rs, ps)),
        dtype=np.uint64,
    )
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


# ---- round 3 ----
def build_unit(job: UnitJob, *earlier: np.ndarray) -> dict:
    """Cut the unit's shards (without the passages earlier units hold) and build those not yet built."""
    from indexing.native_memory import release_free_memory

    t0 = time.perf_counter()
    seen = np.concatenate(earlier) if earlier else np.zeros((0, 2), np.uint64)
    seen = seen[np.argsort(seen[:, 0], kind="stable")]
    keys, digests = np.ascontiguousarray(seen[:, 0]), np.ascontiguousarray(seen[:, 1])
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
                out["conflicting"] += int(digests[i]) != _digest(p.title, p.text)
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
    _tally(out["timings"], job.store.finish(stage, meta["key"], factory, job.threads, template, job.analyzer))


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
    tmp = stage / ".vectors.npy.tmp"
    with open(tmp, "wb") as f:
        np.save(f, vecs)
    os.replace(tmp, stage / "vectors.npy")
    for old in old_dirs:
        job.store.drop_pulled(f"shards/{old}")
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

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.store = ShardStorage(str(self.root))
        self.dim: int | None = None

    def _job(self, unit: str, prev: dict | None) -> UnitJob:
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
            )
            if same_model and prev is not None
            else (),
            release=bool(cfg.index.memory_budget_mb),
            dense=self.dense,
            template=self.template,
        )

    def _build_shards(self, prev: dict | None) -> tuple[list[dict], int]:
        import ray

        from indexing.raytools import ensure_ray

        ensure_ray(self.cfg)
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self.template = self._known_template(prev)
        units = expand_sources(self.sources)
        jobs = [self._job(u, prev) for u in units]
        from indexing.embed import resolve_device
        from indexing.raytools import embed_actor_gpus

        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
        spec = jobs[0].spec
        embeds = self.dense and spec.model_name != HASH_ENCODER
        gpus = embed_actor_gpus(self.cfg, resolve_device(spec.device)) if embeds else 0
        embedding_task = ray.remote(num_cpus=1, num_gpus=gpus, scheduling_strategy="SPREAD")  # train and build
        t = time.perf_counter()
        scans = [task(scan_unit).options(num_returns=2).remote(j) for j in jobs]
        counts = _gather([c for c, _ in scans])
        ids = [i for _, i in scans]
        self.timings["scan_s"] = time.perf_counter() - t
        if self.template is None and self.ivf:
            self.template = self._train_on_cluster(task, embedding_task, jobs, [c["passages"] for c in counts])
            jobs = [dataclasses.replace(j, template=self.template) for j in jobs]
        t = time.perf_counter()
        results = _gather([embedding_task(build_unit).remote(j, *ids[:i]) for i, j in enumerate(jobs)])
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

    def _collect(self, units: list[str], counts: list[dict], results: list[dict]) -> list[dict]:
        metas: list[dict] = []
        nodes: dict[str, int] = {}
        for _unit, count, r in zip(units, counts, results):
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
            raise BuildError(
                f"no passages in {', '.join(self.sources)}"
                + (f" ({self.read_stats.bad_lines} bad lines skipped)" if self.read_stats.bad_lines else "")
            )
        self.dim = results[0]["dim"]
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
