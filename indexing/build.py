"""`build_index`: corpus files in, a published index version out; incremental and resumable.

Stages, each visible in the log (and as progress bars on a terminal):

1. read + split + shard: stream the sources' work units (readers.plan_units: a file, or a byte range of
   one larger than `index.unit_bytes`) in order into passages (passages.py; an id an earlier unit holds
   is dropped), cut each unit's passages into content-defined shards (shards.py; boundaries restart at
   each unit, as in a cluster build, so both cut the same shards) and write every shard that does not
   exist yet to `staging/<staging key>/` (store.py; the key without the IVF template). Shards whose key
   exists under `shards/` are reused untouched, and a unit whose bytes are those of a unit of the previous
   version is not read at all: its shards are taken as they were (unit_reuse.py). With vectors given
   (`--vectors FILE`, given_vectors.py), each shard's rows of the file are read here: their digest is part
   of its key, and a staged shard gets its `vectors.npy` from them.
2. embed: for each new shard, vectors of passages whose embedding input was already embedded by the
   previous version (same model settings) are copied from it; only the rest go through the
   embedding stage (embed.py). A shard's `vectors.npy` is saved as soon as its last batch arrives.
   With vectors given, nothing is embedded (the query model encodes one text, for its dimension).
3. shard indexes: FAISS (dense.py) and Lucene (sparse.py) per new shard, then checksums, then the
   staging directory is renamed into `shards/`. With `index.keep_vectors=false` a shard's `vectors.npy`
   is deleted once its FAISS index is written (before its checksums): a later build re-embeds the
   passages of the shards it changes instead of copying their vectors.
4. publish: the version's BM25 index (the union of its shards' Lucene segments, merged down to
   `index.bm25_segments`, or the previous version's updated: `_bm25_update`) and id map (id hash -> shard, merged from the shards' sorted ids; store.py),
   a new manifest version, then `CURRENT` (manifest.py); old versions are pruned.

A shard's key is a hash of its passages, the settings it is built with and, for an IVF factory, the
digest of the template its FAISS index is filled from (`_Builder._shard_key`): a shard is reused only
with the very template it was filled from.

This is the in-process build. With `runtime.mode=ray`, stages 1-3 run as Ray tasks on the workers, one
per work unit, each writing its shards straight to the index's storage; stage 4 stays here
(cluster_build.py, a subclass of `_Builder`). Given vectors are taken by the in-process build only.

A build killed anywhere resumes on rerun: finished shards are found by key under `shards/`, staged
passages and vectors are reused from `staging/`, an IVF template trained for this build is reused from
`staging/.template.json` (so are the shards filled from it), and nothing is published before stage 4.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np

from indexing.dense import is_ivf
from indexing.digests import DigestSet
from indexing.embed import EncoderSpec, embed_batches, embed_input
from indexing.errors import IndexingError
from indexing.faults import fault_point
from indexing.given_vectors import GivenVectors, VectorFile
from indexing.manifest import (
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
from indexing.native_memory import release_free_memory
from indexing.passages import RULES_VERSION, Passage, PassageStats, passages_of
from indexing.readers import CorpusError, ReadStats, Record, plan_units, read_corpus, unit_digest
from indexing.settings import IndexSettings
from indexing.shards import content_hash, effective_shard_size, shard_key, shard_stream
from indexing.store import read_table, save_array, write_id_shards, write_store
from indexing.unit_reuse import UnitLedger, counts, unit_entry

log = logging.getLogger(__name__)


# a version's BM25 index is updated from the previous one's (not merged again from every shard) while it
# holds at most this share of deleted documents and this many segments beyond index.bm25_segments
BM25_MAX_DELETED = 0.05
BM25_EXTRA_SEGMENTS = 16

# with index.memory_budget_mb set, Lucene's JVM gets a fixed heap of at least this size (java.py)
JVM_HEAP_MB = 512


class BuildError(IndexingError):
    """The build cannot proceed (no sources, an empty corpus, ...)."""


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _ehash(title: str, text: str) -> bytes:
    return hashlib.blake2b(embed_input(title, text).encode("utf-8"), digest_size=12).digest()


def _settings(cfg: IndexSettings, given: dict | None = None) -> dict:
    """The settings a version records; `given`: its vectors came from a file (given_vectors.py)."""
    from indexing.sparse import configured_analyzer

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


def _progress(iterable: Iterable[Any] | None, desc: str, unit: str, total: int | None = None) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=unit, total=total, disable=None, mininterval=1.0, leave=False)


class UnitProgress:
    """Work units finished in a stage: a progress bar on a terminal, a log line at most every 15 s."""

    def __init__(self, stage: str, total: int):
        self.stage, self.total, self.count = stage, total, 0
        self.bar = _progress(None, stage, "unit", total=total)
        self.last_log = time.perf_counter()

    def done(self, status: str = "") -> None:
        self.count += 1
        self.bar.update(1)
        if status:
            self.bar.set_postfix_str(status, refresh=False)
        if time.perf_counter() - self.last_log > 15 and self.count < self.total:
            self.last_log = time.perf_counter()
            log.info("%s: %d/%d units done%s", self.stage, self.count, self.total, f" ({status})" if status else "")

    def close(self) -> None:
        self.bar.close()


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
    `builder`: the class that runs it (cluster_build.py passes its Ray one; default in-process).
    `vectors`: a file of the records' vectors, taken instead of embedding (given_vectors.py), L2-normalised
    with `normalize_vectors`."""
    if not sources:
        raise BuildError("no corpus sources given")
    root = Path(index_dir)
    if cfg.index.memory_budget_mb:
        from indexing.native_memory import bound_native_memory

        bound_native_memory(max(JVM_HEAP_MB, cfg.index.memory_budget_mb))
    with build_lock(root):
        try:
            given = (vectors, normalize_vectors) if vectors is not None else None
            return (builder or _Builder)(sources, root, cfg, fmt, fields, on_bad_line, given).run()
        finally:
            for folder in (root / "staging", root / "shards"):  # removed if empty: staged work stays for a rerun
                with contextlib.suppress(OSError):
                    folder.rmdir()


class _Builder:
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
        # with a memory budget, the free pages a shard leaves go back to the system after it (native_memory.py)
        self._release = release_free_memory if cfg.index.memory_budget_mb else (lambda: None)

    def _unit_digest(self, bytes_digest: str) -> str:
        """A unit's manifest digest (unit_reuse.py): its bytes' sha256 (readers.unit_digest) and what turns
        them into shards besides them (the rules' version, format, fields, bad-line rule, sizes)."""
        reading = [
            RULES_VERSION,
            self.fmt,
            self.fields,
            self.on_bad_line,
            self.cfg.index.passage_words,
            self.settings["shard_size"],
        ]
        return _hash([bytes_digest, reading])

    def _shard_key(self, content: str) -> str:
        """A shard's key: its passages, the settings, and the digest of the IVF template it is filled from."""
        return shard_key(content, self.settings_hash + (f":{self.template['sha256']}" if self.template else ""))

    def _stage_dir(self, meta: dict) -> Path:
        """Where a shard is built: named by its passages and settings alone (what is staged there, passages
        and vectors, does not depend on the template), so a rerun finds it before knowing the template."""
        return self.staging / shard_key(meta["content_hash"], self.settings_hash)

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
        from indexing.embed import get_encoder

        model = self.cfg.embedding.model
        dim = get_encoder(EncoderSpec.from_config(self.cfg)).encode(["the query model's dimension"]).shape[1]
        if dim != self.given.file.dim:
            raise BuildError(
                f"vectors {self.given.file.path} has dimension {self.given.file.dim}, but the query model "
                f"{model} gives {dim}: name the model that made them (--vectors-model)"
            )

    # ---- stage 1 ----
    def _stage_passages(self, prev: dict | None) -> list[dict]:
        t = time.perf_counter()
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        units = plan_units(self.sources, self.fmt, self.cfg.index.unit_bytes)
        self.extra["units"] = len(units)
        seen = DigestSet()  # ids over all units: the first occurrence in source order wins
        progress = UnitProgress("read + shard", len(units))
        metas: list[dict] = []
        ivf_untrained = self.ivf and self.template is None
        # units of the previous version taken unread (unit_reuse.py): not with given vectors (their rows
        # count every record) nor before a template is trained (no shard keys yet)
        ledger = (
            UnitLedger(prev, self._shard_key, self.shards_dir) if prev and not (self.given or ivf_untrained) else None
        )
        self.unit_entries = []
        for position, unit in enumerate(units):
            t_digest = time.perf_counter()
            digest = self._unit_digest(unit_digest(unit, self.fmt))
            self._tally({"unit_digest_s": time.perf_counter() - t_digest})
            taken = (
                ledger.take(position, str(unit), digest, seen, self.read_stats, self.passage_stats) if ledger else None
            )
            if taken:
                self.unit_entries.append(taken[0])
                metas += taken[1]
                self.extra["units_reused"] = self.extra.get("units_reused", 0) + 1
                progress.done(f"{self.passage_stats.passages} passages, {len(metas)} shards")
                continue
            before, first_shard = counts(self.read_stats, self.passage_stats), len(metas)
            records: Iterable[Record] = read_corpus(
                unit, self.fmt, dict(self.fields or {}), self.on_bad_line, self.read_stats
            )
            if self.given:  # rows count records over all units, in order
                records = self.given.number(records)
            passages: Iterable[Passage] = passages_of(records, self.cfg.index.passage_words, self.passage_stats, seen)
            if self.given:
                passages = self.given.attach(passages)
            for group in shard_stream(passages, self.settings["shard_size"]):  # shards restart at each unit
                metas.append(self._stage_group(group, ivf_untrained))
            after = counts(self.read_stats, self.passage_stats)
            self.unit_entries.append(unit_entry(str(unit), digest, len(metas) - first_shard, before, after))
            progress.done(f"{self.passage_stats.passages} passages, {len(metas)} shards")
        progress.close()
        if self.read_stats.records == 0 or not metas:
            raise BuildError(
                f"no passages in {', '.join(self.sources)}"
                + (f" ({self.read_stats.bad_lines} bad lines skipped)" if self.read_stats.bad_lines else "")
            )
        if self.given:
            self.given.check_count()
            self.extra["vectors"] = self.given.describe()
        self.timings["passages_s"] = time.perf_counter() - t
        log.info(
            "stage passages: %d records -> %d passages (%d duplicates merged) in %d shards from %d units, %.1fs",
            self.read_stats.records,
            self.passage_stats.passages,
            self.passage_stats.duplicates,
            len(metas),
            len(units),
            self.timings["passages_s"],
        )
        return metas

    def _stage_group(self, group: list, ivf_untrained: bool) -> dict:
        """A shard's meta; its passages (and given vectors) are staged unless the shard exists under `shards/`."""
        ch, given_vectors = content_hash(group), None
        if self.given:  # the shard's vectors are part of its content
            ch, given_vectors = self.given.shard(ch, group)
        # with a template still to train, keys are set after training (`_stage_template`); no shard
        # under shards/ can have it yet, so every shard is staged
        key = None if ivf_untrained else self._shard_key(ch)
        meta = {
            "key": key,
            "passages": len(group),
            "content_hash": ch,
            "first_id": group[0].id,
            "last_id": group[-1].id,
        }
        if key is None or not (self.shards_dir / key / "checksums.json").is_file():
            target = self._stage_dir(meta)
            if not (target / "passages.arrow").is_file():
                target.mkdir(parents=True, exist_ok=True)
                write_store(group, target)
            if given_vectors is not None and not (target / "vectors.npy").is_file():
                cast(GivenVectors, self.given).save(group, given_vectors, target)
        return meta

    # ---- stage 2 helpers ----
    def _vector_cache(self, prev: dict | None, keep: set[str]) -> tuple[dict[bytes, tuple[str, int]], int | None]:
        """Embedding-input hash -> (old shard, row), over the previous version's shards that this
        build does not reuse (the passages of changed shards come from them). None with given vectors
        (every staged shard has its vectors from stage 1)."""
        if self.given or prev is None or prev["settings"]["embedding_hash"] != self.settings["embedding_hash"]:
            return {}, None
        cache: dict[bytes, tuple[str, int]] = {}
        for s in prev["shards"]:
            d = self.shards_dir / s["key"]
            if s["key"] in keep or not (d / "vectors.npy").is_file():
                continue
            t = read_table(d)
            for row, (title, text) in enumerate(zip(t.column("title").to_pylist(), t.column("text").to_pylist())):
                cache.setdefault(_ehash(title, text), (s["key"], row))
        return cache, prev.get("dim")

    def _plan_embedding(self, todo: list[dict], cache: dict) -> tuple[list[str], dict[int, tuple[int, list]]]:
        """Per new shard: rows to embed (written to staging/<key>/to_embed.parquet; their count is kept) and cached rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files, plans = [], {}
        for i, meta in enumerate(todo):
            d = self._stage_dir(meta)
            if (d / "vectors.npy").is_file():
                continue  # finished before an interruption
            t = read_table(d)
            titles, texts = t.column("title").to_pylist(), t.column("text").to_pylist()
            new_rows, cached = [], []
            for row, (title, text) in enumerate(zip(titles, texts)):
                hit = cache.get(_ehash(title, text)) if cache else None
                if hit is None:
                    new_rows.append(row)
                else:
                    cached.append((row, hit[0], hit[1]))
            plans[i] = (len(new_rows), cached)  # a count: the rows themselves go to disk, not memory
            if new_rows:
                f = d / "to_embed.parquet"
                pq.write_table(
                    pa.table(
                        {
                            "shard": np.full(len(new_rows), i, dtype=np.int64),
                            "row": np.asarray(new_rows, dtype=np.int64),
                            "text": [embed_input(titles[r], texts[r]) for r in new_rows],
                        }
                    ),
                    f,
                )
                files.append(str(f))
            del t, titles, texts
            self._release()
        return files, plans

    def _assemble(self, meta: dict, cached: list, new_rows: np.ndarray, new_vecs: np.ndarray | None, dim: int) -> None:
        vecs = np.zeros((meta["passages"], dim), dtype=np.float32)
        if new_vecs is not None and len(new_rows):
            vecs[new_rows] = new_vecs
        by_shard: dict[str, list[tuple[int, int]]] = {}
        for row, old_key, old_row in cached:
            by_shard.setdefault(old_key, []).append((row, old_row))
        for old_key, pairs in by_shard.items():
            old = np.load(self.shards_dir / old_key / "vectors.npy", mmap_mode="r")
            rows, old_rows = zip(*pairs)
            vecs[list(rows)] = old[list(old_rows)]
        self.vectors_reused += len(cached)
        d = self._stage_dir(meta)
        save_array(d / "vectors.npy", vecs)
        (d / "to_embed.parquet").unlink(missing_ok=True)

    # ---- stage 2b: an IVF factory's shared template ----
    def _known_template(self, prev: dict | None) -> dict | None:
        """Before stage 1: the template this build's shards are filled from if it exists already: the
        previous version's when trained with this build's settings (its `settings_hash`), else the one an
        interrupted attempt of this build trained (`staging/.template.json`), if its file is intact."""
        from indexing.manifest import check_file

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

    def _stage_template(self, metas: list[dict]) -> None:
        """After stage 1, for an IVF factory without a known template: train one, then key the shards by it."""
        if self.template is not None or not self.ivf:
            return
        from indexing.manifest import atomic_write

        self.template = self._train_template(metas)
        atomic_write(self.staging / ".template.json", json.dumps(self.template))  # a rerun reuses it
        for m in metas:
            m["key"] = self._shard_key(m["content_hash"])

    def _train_template(self, metas: list[dict]) -> dict:
        """A template trained on `index.faiss_train_size` passages taken evenly over the whole corpus."""
        from indexing.dense import train_template
        from indexing.manifest import sha256_file

        t = time.perf_counter()
        vecs = self._training_vectors(metas)
        out = self.root / "trained" / ".template.tmp"
        out.parent.mkdir(exist_ok=True)
        train_template(vecs, self.cfg.index.faiss_factory, out)
        digest = sha256_file(out)
        final = out.with_name(f"{digest[:16]}.index")
        os.replace(out, final)
        self.timings["faiss_train_s"] = time.perf_counter() - t
        log.info(
            "trained %s on %d passages in %.1fs",
            self.cfg.index.faiss_factory,
            len(vecs),
            self.timings["faiss_train_s"],
        )
        return {
            "path": f"trained/{final.name}",
            "sha256": digest,
            "bytes": final.stat().st_size,
            "settings_hash": self.settings_hash,
        }

    def _training_vectors(self, metas: list[dict]) -> np.ndarray:
        """The vectors of `index.faiss_train_size` passages taken evenly over the whole corpus: embedded, or
        the staged ones when the vectors were given."""
        total = sum(m["passages"] for m in metas)
        picks = np.unique(np.linspace(0, total - 1, min(total, self.cfg.index.faiss_train_size)).astype(np.int64))
        texts, given, start = [], [], 0
        for m in metas:
            rows = picks[(picks >= start) & (picks < start + m["passages"])] - start
            if len(rows) and self.given:  # every shard is staged when a template is trained (stage 1)
                given.append(np.load(self._stage_dir(m) / "vectors.npy", mmap_mode="r")[rows])
            elif len(rows):
                tab = read_table(self._stage_dir(m)).take(rows)
                texts += [
                    embed_input(a, b) for a, b in zip(tab.column("title").to_pylist(), tab.column("text").to_pylist())
                ]
            start += m["passages"]
        if self.given:
            return np.concatenate(given)
        sample = self.staging / ".train.parquet"
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.table({"shard": np.zeros(len(texts), np.int64), "row": np.arange(len(texts)), "text": texts}), sample
        )
        spec = EncoderSpec.from_config(self.cfg, build=True)
        vecs = np.concatenate([v for _, _, v in embed_batches([str(sample)], spec, self.cfg)])
        sample.unlink()
        return vecs

    # ---- stage 3 ----
    def _finalize(self, metas: list[dict]) -> None:
        """Build the shards' FAISS + Lucene indexes in this process (a cluster build does it on the workers)."""
        cfg = self.cfg
        for m in metas:
            self._tally(
                finalize_shard(
                    str(self._stage_dir(m)),
                    str(self.shards_dir / m["key"]),
                    cfg.index.faiss_factory if self.dense else None,
                    cfg.index.threads,
                    str(self.root / self.template["path"]) if self.template else None,
                    self.settings["lucene"]["analyzer"],
                    cfg.index.keep_vectors,
                )
            )
            self._release()

    def _tally(self, seconds: dict[str, float]) -> None:
        for k, v in seconds.items():
            self.timings[k] = self.timings.get(k, 0.0) + v

    def _stage_embed_and_index(self, metas: list[dict], prev: dict | None) -> None:
        keep = {m["key"] for m in metas}
        todo = [m for m in metas if not (self.shards_dir / m["key"] / "checksums.json").is_file()]
        if not todo:
            return
        t = time.perf_counter()
        if not self.dense:  # BM25 only: no vectors to embed, no FAISS
            self._finalize(todo)
            self.timings["embed_and_index_s"] = time.perf_counter() - t
            return
        cache, dim = self._vector_cache(prev, keep)
        files, plans = self._plan_embedding(todo, cache)
        ready = [todo[i] for i in range(len(todo)) if i not in plans]  # vectors staged by an earlier attempt
        for i, (n_new, cached) in plans.items():
            if not n_new:  # every vector comes from the previous version
                # every vector cached: the previous version had vectors, so a dim
                self._assemble(todo[i], cached, np.zeros(0, int), None, cast(int, dim))
                ready.append(todo[i])
        self._finalize(ready)
        n_embed = sum(p[0] for p in plans.values())
        spec = EncoderSpec.from_config(self.cfg, build=True)
        log.info(
            "stage embed: %d passages to embed in %d shards (%d vectors reused)",
            n_embed,
            len(files),
            sum(len(p[1]) for p in plans.values()),
        )
        t_embed = time.perf_counter()
        bar = _progress(None, "embedding", "psg", total=n_embed)
        current: int | None = None
        rows: list[np.ndarray] = []
        vecs: list[np.ndarray] = []
        last_log = t_embed
        flushing = [0.0]  # seconds spent outside the encoder: assembling vectors, shard indexes

        def flush(i: int) -> None:
            t_flush = time.perf_counter()
            new_rows = np.concatenate(rows)
            new_vecs = np.concatenate(vecs)
            order = np.argsort(new_rows, kind="stable")
            self._assemble(todo[i], plans[i][1], new_rows[order], new_vecs[order], new_vecs.shape[1])
            self.reembedded_shards.append(todo[i]["key"])
            fault_point("build.shard_embedded")
            self._finalize([todo[i]])
            flushing[0] += time.perf_counter() - t_flush

        for shard, row, vec in embed_batches(files, spec, self.cfg):
            for i in np.unique(shard):  # batches are ordered; a batch may straddle two shards
                m = shard == i
                if current is not None and i != current:
                    flush(current)
                    rows, vecs = [], []
                current = int(i)
                rows.append(row[m])
                vecs.append(vec[m])
            self.embedded += len(row)
            bar.update(len(row))
            if time.perf_counter() - last_log > 15:
                last_log = time.perf_counter()
                rate = self.embedded / (last_log - t_embed)
                log.info(
                    "embedded %d/%d passages (%.1f/s), %d shards done",
                    self.embedded,
                    n_embed,
                    rate,
                    len(self.reembedded_shards),
                )
        if current is not None:
            flush(current)
        bar.close()
        self.timings["embed_s"] = time.perf_counter() - t_embed - flushing[0]
        self.timings["embed_and_index_s"] = time.perf_counter() - t
        if self.embedded != n_embed:
            raise BuildError(f"embedding stage returned {self.embedded} vectors for {n_embed} passages")

    def _build_shards(self, prev: dict | None) -> tuple[list[dict], int]:
        """Stages 1-3: every shard of the corpus complete under `shards/`; returns their metas (in corpus
        order) and how many of them this build made (cluster_build.py does the same on Ray workers)."""
        self.template = self._known_template(prev)
        metas = self._stage_passages(prev)
        fault_point("build.passages_staged")
        self._stage_template(metas)
        n_new = sum(not (self.shards_dir / m["key"] / "checksums.json").is_file() for m in metas)
        self._stage_embed_and_index(metas, prev)
        return metas, n_new

    # ---- stage 4 ----
    def _merge_bm25(self, metas: list[dict]) -> tuple[Path, dict]:
        """The version's BM25 index (in staging) and its stats: updated from the previous version's when that
        keeps it within BM25_MAX_DELETED and BM25_EXTRA_SEGMENTS (`_bm25_update`), else merged from every shard."""
        from indexing.sparse import merge_lucene

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
        from indexing.sparse import update_lucene

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
        """Set each shard's `files` (its checksums, read from disk when used); return the vectors' dimension
        (None: BM25 only)."""
        for m in metas:
            m["files"] = ShardFiles(self.shards_dir / m["key"])
        if not self.dense:
            return None
        from indexing.dense import faiss_dim

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


def finalize_shard(
    staging_dir: str,
    final_dir: str,
    factory: str | None,
    threads: int,
    template: str | None,
    analyzer: dict,
    keep_vectors: bool = True,
) -> dict[str, float]:
    """Build one shard's FAISS (unless `factory` is None: a BM25-only index) and Lucene indexes in staging,
    checksum, and move it into place; returns the seconds of each step. Without `keep_vectors` the staged
    `vectors.npy` is deleted once FAISS has them (a crash after that re-embeds the shard on rerun)."""
    from indexing.dense import build_faiss
    from indexing.sparse import build_lucene

    src, dst = Path(staging_dir), Path(final_dir)
    if (dst / "checksums.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        return {}
    t0 = time.perf_counter()
    if factory:
        build_faiss(np.load(src / "vectors.npy"), factory, src / "faiss.index", Path(template) if template else None)
        if not keep_vectors:
            (src / "vectors.npy").unlink()
    fault_point("shard.faiss_written")
    t1 = time.perf_counter()
    t = read_table(src)
    docs = (
        (i, embed_input(ti, tx))
        for i, ti, tx in zip(t.column("id").to_pylist(), t.column("title").to_pylist(), t.column("text").to_pylist())
    )
    build_lucene(docs, src / "lucene", threads, analyzer)
    fault_point("shard.lucene_written")
    t2 = time.perf_counter()
    for leftover in src.glob("*.tmp"):
        leftover.unlink()
    write_checksums(src)
    fault_point("shard.before_rename")
    if dst.exists():  # a half-moved directory cannot exist (rename is atomic); an incomplete one is stale
        shutil.rmtree(dst)
    os.rename(src, dst)
    log.debug("shard %s ready", dst.name)
    return {"faiss_s": t1 - t0, "lucene_s": t2 - t1, "checksum_s": time.perf_counter() - t2}


__all__ = ["build_local_index", "BuildError", "CorpusError"]
