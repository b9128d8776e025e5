"""A work unit's job, written once: the tasks every build runs, in-process or on Ray (executors.py).

A unit (readers.plan_units: a file, or a line-aligned byte range of one larger than `index.unit_bytes`) is
the grain of every build. build.py plans the units and runs these functions on an executor, in rounds:

1. `scan_unit`: the unit's manifest digest (its bytes, and the rules that read them: unit_reuse.py), its
   counts, and its passages' (id hash, digest of title and text) pairs cut into P ranges of the id hash.
   A unit whose digest and shards are those of the previous version is taken unread: its id hashes come from
   its shards' `ids.npy`, its texts are not read (UNREAD_DIGEST).
2. `dedup_task`, P tasks (with more than one unit): range p of every unit; per unit, the ids an earlier unit
   holds (the first occurrence in corpus order wins), with the first occurrence's text digest.
3. `train_unit_template`, only for an IVF factory without a template yet: the corpus's passages of smallest
   id hash (each scan keeps its unit's share) embedded (or read from the given vectors), trained once.
4. `build_unit`: read and split the unit, drop the ids of its drop lists, cut content-defined shards (they
   restart at each unit), and for each shard whose key is not under `shards/` yet: stage its passages, its
   vectors (given; copied from the previous version's shards sharing its first or last id; embedded), then
   FAISS, Lucene, checksums and the rename into place (shard_storage.finalize_shard). Returns the shards'
   metadata and the unit's counts.

Every function takes plain values (a `UnitJob`, arrays) and returns plain values, so a process pool or a Ray
worker runs it as well as this process. A task that fails leaves its finished shards under `shards/` and its
staged passages and vectors under `staging/`; a rerun reuses them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import os
import socket
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from indexing.builder.executors import tick
from indexing.builder.given_vectors import GivenVectors, RowPassage, VectorFile
from indexing.builder.shard_storage import ShardStorage
from indexing.corpus.passages import Passage, PassageStats, id_hash, passages_of
from indexing.corpus.readers import ReadStats, Unit, read_corpus, unit_digest
from indexing.shards.chunking import content_hash, shard_key, shard_stream
from indexing.shards.embed import EncoderSpec, embed_input, get_encoder
from indexing.shards.store import read_table, save_array, write_store
from platform_shims.faults import fault_point


def short_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def embedding_hash(title: str, text: str) -> bytes:
    """What decides a passage's vector: its embedding input (a copied vector is found by it)."""
    return hashlib.blake2b(embed_input(title, text).encode("utf-8"), digest_size=12).digest()


UNREAD_DIGEST = (1 << 64) - 1  # the text digest of a passage in a unit taken unread: compared with none (dedup_range)


def _text_digest(title: str, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass(frozen=True)
class PreviousUnit:
    """The previous version's unit of the same name: its position, manifest entry and shard metas (keyed for
    this build)."""

    position: int
    entry: dict
    metas: tuple[dict, ...]


@dataclasses.dataclass(frozen=True)
class UnitJob:
    """What a task needs for one unit: plain values (no settings object, no model resolver, crosses over)."""

    unit: Unit
    store: ShardStorage
    fmt: str
    fields: dict | None
    on_bad_line: str
    reading: tuple  # what besides its bytes decides the unit's passages (part of its manifest digest)
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
    given: tuple[VectorFile, bool] | None = None  # vectors taken from a file (given_vectors.py), normalised or not
    row_base: int = 0  # given vectors: the row of the unit's first record (records and bad lines before it)
    previous: PreviousUnit | None = None  # taken unread when its bytes and shards are unchanged (scan_unit)
    digest: str | None = None  # the unit's manifest digest, once a scan has computed it

    def key(self, content: str) -> str:
        """A shard's key: its passages, the settings, and the digest of the IVF template it is filled from."""
        return shard_key(content, self.settings_hash + (f":{self.template['sha256']}" if self.template else ""))

    def stage_dir(self, content: str) -> Path:
        """Where a shard is staged: named without the template, so a rerun finds it before knowing one."""
        return self.store.local / "staging" / shard_key(content, self.settings_hash)

    def manifest_digest(self) -> str:
        return self.digest or short_hash([unit_digest(self.unit, self.fmt), list(self.reading)])

    def vectors(self, rs: ReadStats) -> GivenVectors | None:
        if self.given is None:
            return None
        return GivenVectors(self.given[0], self.given[1], rs, self.passage_words, base=self.row_base)


def node() -> str:
    """This task's node: Ray's node id on a Ray worker, else the host name. Ray may be half imported by another
    thread (`dynrag demo` imports vLLM, which imports Ray, while it builds its index): then it is not initialized."""
    is_initialized = getattr(sys.modules.get("ray"), "is_initialized", None)
    if is_initialized is not None and is_initialized():
        import ray

        return str(ray.get_runtime_context().get_node_id())
    return socket.gethostname()


def _passages(job: UnitJob, rs: ReadStats, ps: PassageStats, given: GivenVectors | None = None) -> Iterator[Passage]:
    records = read_corpus(job.unit, job.fmt, dict(job.fields or {}), job.on_bad_line, rs)
    return passages_of(given.number(records) if given else records, job.passage_words, ps)


def _shard_dirs(job: UnitJob) -> list[Path]:
    return [job.store.local / "shards" / m["key"] for m in job.previous.metas] if job.previous else []


# ---- round 1 ----
def scan_unit(job: UnitJob, ranges: int, sample: int = 0) -> list:
    """The unit's summary (small, for the driver), its training sample, then its (id hash, text digest) pairs
    sorted by id hash and cut into `ranges` equal ranges of the hash (`ranges` 0: one empty array). A unit
    taken unread (`taken`) gives its shards' id hashes, each with UNREAD_DIGEST (its bytes are not read: a
    +1% rebuild at 5M spent 17.8 of its 31.7 s reading and hashing the stores' texts). `sample` > 0 (an IVF
    template to train): the (id hash, embedding input) of its `sample` passages of smallest id hash, or with
    given vectors (id hash, row in the unit), sorted; the template is trained on the corpus's smallest (round 3)."""
    t = time.perf_counter()
    digest = job.manifest_digest()
    prev = job.previous
    taken = bool(
        prev and prev.entry["sha256"] == digest and all((d / "checksums.json").is_file() for d in _shard_dirs(job))
    )
    rs, ps = ReadStats(), PassageStats()
    summary: dict[str, Any] = {"digest": digest, "taken": taken, "node": node()}
    triples: Iterator[tuple[int, int, str | int]] = iter(())  # (id hash, text digest, training input)
    if not taken and (ranges or sample):
        given = job.vectors(rs) if sample else None  # rows counted from the unit's first record
        passages = _passages(job, rs, ps, given)
        if given is not None:
            triples = ((id_hash(p.id), _text_digest(p.title, p.text), p.row) for p in given.attach(passages))
        else:
            triples = (
                (id_hash(p.id), _text_digest(p.title, p.text), embed_input(p.title, p.text) if sample else "")
                for p in passages
            )
    kept: list[tuple[int, str | int]] = []
    flat = array("Q")  # 16 bytes a passage (a list of Python ints took about 90)
    for h, d, x in triples:
        flat.extend((h, d))
        if sample:
            kept.append((h, x))
            if len(kept) >= 2 * sample:
                kept = heapq.nsmallest(sample, kept)
    pairs = np.frombuffer(flat, dtype=np.uint64).reshape(-1, 2)
    if taken and ranges:  # its shards' id hashes (ids.npy); their texts, the previous version's, are not read
        ids = np.concatenate([np.load(d / "ids.npy") for d in _shard_dirs(job)] or [np.zeros(0, np.uint64)])
        pairs = np.column_stack((ids, np.full(len(ids), UNREAD_DIGEST, np.uint64)))
    summary.update(passages=len(pairs), records=rs.records, bad_lines=rs.bad_lines, seconds=time.perf_counter() - t)
    chosen = heapq.nsmallest(sample, kept) if sample else []
    if not ranges:
        return [summary, chosen, np.zeros((0, 2), np.uint64)]
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    edges = np.array([(r << 64) // ranges for r in range(1, ranges)], dtype=np.uint64)
    return [summary, chosen, *np.split(pairs, np.searchsorted(pairs[:, 0], edges))]


# ---- round 2 ----
def dedup_range(*per_unit: np.ndarray) -> list[np.ndarray]:
    """One hash range of every unit's (id hash, text digest) pairs, in unit order (ids unique within a unit) ->
    per unit, the (id hash, digest of the first occurrence) pairs it must drop: ids an earlier unit holds.
    The build task that drops one counts it conflicting when its own text's digest differs (neither being
    UNREAD_DIGEST: a unit taken unread, whose texts are not read; the build before the one path did not count
    those either). Sorted by id hash."""
    pairs = np.concatenate(per_unit)
    unit: np.ndarray = np.repeat(np.arange(len(per_unit)), [len(p) for p in per_unit])
    order = np.lexsort((unit, pairs[:, 0]))  # by id hash, then unit: each id's first occurrence leads
    ids, digests, unit = pairs[order, 0], pairs[order, 1], unit[order]
    first: np.ndarray = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    kept = np.maximum.accumulate(np.where(first, np.arange(len(ids)), 0))  # each row's first occurrence
    later = np.flatnonzero(~first)
    later = later[np.argsort(unit[later], kind="stable")]  # grouped by unit, by id hash within each
    drops = np.column_stack((ids[later], digests[kept[later]]))
    return np.split(drops, np.searchsorted(unit[later], np.arange(1, len(per_unit))))


def dedup_task(*per_unit: np.ndarray) -> list[np.ndarray]:
    """`dedup_range`, led by the number of ids each unit drops (the one return the driver reads)."""
    drops = dedup_range(*per_unit)
    return [np.array([len(d) for d in drops], dtype=np.int64), *drops]


# ---- round 3 (IVF) ----
def train_unit_template(
    job: UnitJob, factory: str, size: int, bases: list[int], *samples: list[tuple[int, str | int]]
) -> dict:
    """Train the IVF template on the corpus's `size` passages of smallest id hash (a uniform sample that any
    executor draws alike) out of the units' scan samples, embedded or read from the given vectors (a unit's
    rows from `bases[unit]`); write `trained/<sha>.index`; return its manifest entry."""
    from indexing.shards.dense import train_template
    from indexing.versions.manifest import sha256_file

    t = time.perf_counter()
    merged = heapq.nsmallest(size, ((h, u, x) for u, sample in enumerate(samples) for h, x in sample))
    if job.given is not None:
        given = job.vectors(ReadStats())
        vecs = cast(GivenVectors, given).stored([bases[u] + int(x) for _, u, x in merged])
    else:
        vecs = np.concatenate(_encode_in_steps(job, [str(x) for _, _, x in merged]))
    out = job.store.local / "trained" / f".template.{os.getpid()}.tmp"
    out.parent.mkdir(parents=True, exist_ok=True)
    train_template(vecs, factory, out)
    digest = sha256_file(out)
    final = out.with_name(f"{digest[:16]}.index")
    os.replace(out, final)
    job.store.put(final, f"trained/{final.name}")
    return {
        "path": f"trained/{final.name}",
        "sha256": digest,
        "bytes": final.stat().st_size,
        "settings_hash": job.settings_hash,
        "seconds": time.perf_counter() - t,
        "passages": len(vecs),
    }


# ---- round 4 ----
def build_unit(job: UnitJob, *drop_lists: np.ndarray) -> dict:
    """Cut the unit's shards (without the passages of its drop lists: ids earlier units hold, round 2)
    and build those not yet built."""
    from indexing.shards.native_memory import release_free_memory

    t0 = time.perf_counter()
    drops = np.concatenate(drop_lists) if drop_lists else np.zeros((0, 2), np.uint64)
    drops = drops[np.argsort(drops[:, 0], kind="stable")]
    keys, first_digests = np.ascontiguousarray(drops[:, 0]), drops[:, 1]
    rs, ps = ReadStats(), PassageStats()
    given = job.vectors(rs)
    out: dict[str, Any] = {
        "node": node(),
        "shards": [],
        "built": 0,
        "reembedded": [],
        "embedded": 0,
        "vectors_reused": 0,
        "vectors_taken": 0,
        "duplicates": 0,
        "conflicting": 0,
        "timings": {},
    }

    def fresh() -> Iterator[Passage]:
        kept = (p for p in _passages(job, rs, ps, given) if not _dropped(p, keys, first_digests, out))
        return given.attach(kept) if given else kept

    read_s = time.perf_counter()
    for group in shard_stream(fresh(), job.shard_size):
        t = time.perf_counter()
        _tally(out["timings"], {"read_s": t - read_s})
        ch, raw = content_hash(group), None
        if given is not None:  # the shard's vectors are part of its content
            ch, raw = given.shard(ch, cast("list[RowPassage]", group))
        meta: dict[str, Any] = {
            "key": job.key(ch),
            "passages": len(group),
            "content_hash": ch,
            "first_id": group[0].id,
            "last_id": group[-1].id,
        }
        if not job.store.has(meta["key"]):
            _build_shard(job, group, meta, out, given, raw)
            if job.release:
                release_free_memory()
        if job.store.remote:  # a local shard's files are read from its checksums.json when the manifest is
            meta["files"] = job.store.files(meta["key"])  # written (build.ShardFiles): parsed, 643 held 3.6 MiB
        out["shards"].append(meta)
        tick()
        if "dim" not in out:
            out["dim"] = job.store.dim(meta["key"]) if job.dense else None
        read_s = time.perf_counter()
    _tally(out["timings"], {"read_s": time.perf_counter() - read_s})
    dropped = out.pop("duplicates")  # passages_of counted them as passages of this unit
    ps.passages -= dropped
    ps.duplicates += dropped
    ps.conflicting_duplicates += out.pop("conflicting")
    out["read"] = dataclasses.asdict(rs)
    out["passage_stats"] = dataclasses.asdict(ps)
    t_digest = time.perf_counter()
    out["digest"] = job.manifest_digest()  # for the manifest's units (unit_reuse.py)
    out["timings"]["unit_digest_s"] = time.perf_counter() - t_digest
    out["timings"]["unit_task_s"] = time.perf_counter() - t0
    return out


def _dropped(p: Passage, keys: np.ndarray, first_digests: np.ndarray, out: dict) -> bool:
    if not len(keys):
        return False
    h = np.uint64(id_hash(p.id))
    i = int(np.searchsorted(keys, h))
    if i < len(keys) and keys[i] == h:
        out["duplicates"] += 1
        first = int(first_digests[i])
        out["conflicting"] += first != UNREAD_DIGEST and first != _text_digest(p.title, p.text)
        return True
    return False


def _tally(timings: dict, seconds: dict) -> None:
    for k, v in seconds.items():
        timings[k] = timings.get(k, 0.0) + v


def _build_shard(
    job: UnitJob, group: list, meta: dict, out: dict, given: GivenVectors | None, raw: np.ndarray | None
) -> None:
    out["built"] += 1
    if job.store.upload_finished(meta["key"]):  # built before an interruption, not yet uploaded
        return
    stage = job.stage_dir(meta["content_hash"])
    t = time.perf_counter()
    if not (stage / "passages.arrow").is_file():
        stage.mkdir(parents=True, exist_ok=True)
        write_store(group, stage)
    if given is not None and raw is not None and not (stage / "vectors.npy").is_file():
        given.save(group, raw, stage)
        out["vectors_taken"] += len(group)
    _tally(out["timings"], {"passages_s": time.perf_counter() - t})
    fault_point("build.passages_staged")
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
                cache.setdefault(embedding_hash(*pair), (old, row))
    t = read_table(stage)
    titles, texts = t.column("title").to_pylist(), t.column("text").to_pylist()
    inputs = [embed_input(a, b) for a, b in zip(titles, texts)]
    hits = [cache.get(embedding_hash(a, b)) for a, b in zip(titles, texts)] if cache else [None] * len(inputs)
    del t, cache
    todo = [r for r, h in enumerate(hits) if h is None]
    new = _encode_in_steps(job, [inputs[r] for r in todo])
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


def _encode_in_steps(job: UnitJob, texts: list[str]) -> list[np.ndarray]:
    """`texts` embedded a few batches at a time: one call over a whole training sample (163,840 passages) held
    the hash encoder's per-byte arrays for all of them at once (GBs of a 1M build's peak)."""
    encoder, step = get_encoder(job.spec), job.spec.batch_size * 4
    out = []
    for i in range(0, len(texts), step):
        out.append(encoder.encode(texts[i : i + step]))
        tick()  # progress: a long unit's embedding is not a hung task (executors.py)
    return out
