"""indexing's settings: the `index` and `embedding` sections, and what a build on Ray needs.

A library user builds `IndexSettings()` directly (model names must then be local folders); dynrag's
configuration composes it (`DynragConfig.index_settings()`), resolving model names as everywhere else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from indexing.errors import IndexingError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def default_cache_dir() -> str:
    return os.environ.get("DYNRAG_CACHE", str(Path.home() / ".cache" / "dynrag"))


class EmbeddingConfig(Section):
    model: str = Field("all-minilm-l6-v2", description="known model name (dynrag models list), local path or hub name")
    batch_size: int = Field(128, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N")
    max_seq_length: int = Field(256, ge=8)


class IndexConfig(Section):
    shard_size: int = Field(50_000, ge=1, description="passages per shard")
    dense: bool = Field(
        True,
        description="embed the passages and build FAISS indexes; false: a BM25-only index (no embedding stage; "
        "dense search is refused), e.g. when BM25 is the only retriever used. Turning it on later rebuilds the shards",
    )
    faiss_factory: str = Field(
        "Flat",
        description="FAISS index factory string: Flat (exact; small corpora), HNSW32, or an IVF index for large "
        "ones, e.g. IVF4096,PQ64 or IVF4096,SQ8, whose quantizer and codebooks are trained once and shared by all "
        "shards. On CPUs IVF4096,PQ128x4np (4-bit codes, 64 bytes as PQ64's) builds ~4x faster and is searched in "
        "faiss's fast-scan layout (indexing/shards/dense.py)",
    )
    faiss_train_size: int = Field(
        100_000,
        ge=1,
        description="IVF factories: passages sampled evenly over the corpus and embedded to train the "
        "shared quantizer and codebooks, at the first build (later builds of the index reuse them)",
    )
    unit_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="an uncompressed JSONL, TSV or Parquet file larger than this is read as several work units "
        "of about this many bytes, cut between lines (indexing/corpus/readers.py): shards restart at each unit, and a "
        "cluster build runs one task per unit. 0: one unit per file (e.g. a TSV whose quoted fields span lines)",
    )
    build_workers: int = Field(
        0,
        ge=0,
        description="runtime.mode=local: processes that build work units side by side (one unit's reading beside "
        "another's embedding and indexing); 0: one per index.threads CPUs (one on 2 cores: a unit's Lucene and FAISS "
        "work already uses both, and two workers measured slower there); never more than the units; 1: in the "
        "building process",
    )
    build_stall_s: float = Field(
        1800.0,
        gt=0,
        description="seconds an index build with a pool of processes (index.build_workers) or on Ray waits for its "
        "tasks with no progress (no task ended, no running task finished an embedding step or a shard) before it "
        "stops with one line naming the tasks awaited (a hung worker, a task Ray cannot place); nothing is published "
        "and the previous version stays. A long build that makes progress is never stopped",
    )
    keep_vectors: bool = Field(
        True,
        description="keep each shard's vectors.npy (4 x dim bytes a passage) beside its FAISS index, so that an "
        "incremental build or a new faiss_factory copies vectors instead of embedding again; false: deleted once "
        "the shard's FAISS index is written (for IVF-PQ, most of the disk), and a rebuild embeds the passages of "
        "every changed shard again",
    )
    passage_words: int = Field(100, ge=10, description="long texts are split into passages of this many words")
    bm25_k1: float = Field(0.9, gt=0, description="BM25 term-frequency saturation (search time; Anserini's default)")
    bm25_b: float = Field(0.4, ge=0, le=1, description="BM25 length normalisation (search time; Anserini's default)")
    bm25_stemmer: Literal["porter", "krovetz", "none"] = Field(
        "porter", description="the BM25 analyzer's stemmer, fixed when the index is built (a search uses the index's)"
    )
    bm25_stopwords: bool = Field(True, description="the BM25 analyzer drops English stop words (fixed at build)")
    threads: int = Field(2, ge=1, description="threads for BM25 batch search and index builds")
    jvm_heap_mb: int | None = Field(
        None,
        ge=64,
        description="maximum Java heap of a process that opens an index for BM25 search (the JVM's own "
        "default is a quarter of the machine's memory, per process): set it where several index holders share a node, "
        "e.g. retrieval actors. Applies when the process starts its JVM",
    )
    faiss_gpu: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="where a replica that sees CUDA keeps the FAISS index (its GPU plan, pipeline/runtime/gpu_plan.py): "
        "auto: one merged index on its GPU when it fits beside vLLM and the models, else the CPU; cpu; gpu: refuse "
        "to start unless it fits. HNSW and other factories without a GPU index stay on the CPU",
    )
    faiss_nprobe: int = Field(16, ge=1, description="IVF indexes: lists probed per search")
    rrf_k: int = Field(60, ge=1, description="retriever rrf: the constant k of reciprocal rank fusion, 1 / (k + rank)")
    fusion_depth: int = Field(
        50, ge=1, description="retriever rrf: hits taken from BM25 and from dense per query before fusing (at least k)"
    )
    faiss_ef_search: int = Field(64, ge=1, description="HNSW indexes: efSearch")
    keep_versions: int = Field(2, ge=1, description="published versions kept; older ones and their shards are removed")
    bm25_segments: int = Field(
        1,
        ge=0,
        description="merge a version's BM25 index (the union of its shards' Lucene segments) down to at most this "
        "many segments when it is merged from every shard: faster search; 0 keeps the shards' segments as they are. "
        "A refresh instead updates the previous version's index (deletes the dropped shards' documents, adds the new "
        "shards' segments) while that leaves at most 5% deleted documents and 16 segments beyond this number",
    )
    remote_cache_dir: str | None = Field(
        None,
        description="where a remote index (s3://, gs://, az://) is pulled to on each machine, once per version "
        "(None: <paths.cache_dir>/index-cache)",
    )
    memory_budget_mb: int | None = Field(
        None,
        ge=4,
        description="bound on an index build's working memory beyond the loaded model, JVM and libraries: "
        "shards are capped at the passages that fit in it (indexing/shards/chunking.py); None: shard_size alone decides",
    )
    verify: Literal["size", "none"] = Field(
        "size",
        description="at open: check that the files search reads are present at their recorded sizes, or "
        "nothing; sha256 is checked when files are written and pulled, and by `dynrag index verify`",
    )

    @field_validator("faiss_factory")
    @classmethod
    def _no_fast_scan_shards(cls, value: str) -> str:
        if re.search(r"\d+x4fs", value):
            plain = re.sub(r"(\d+x4)fsr?", r"\1np", value)
            raise ValueError(
                f"index.faiss_factory={value!r}: shards in faiss's fast-scan layout cannot be merged into one index "
                f"(faiss crashes merging their lists); use {plain!r}: the same codes, stored plain and searched in "
                "the fast-scan layout once merged"
            )
        return value

    @field_validator("verify", mode="before")
    @classmethod
    def _checksum_moved(cls, value: object) -> object:
        if value == "checksum":
            raise ValueError(
                "index.verify=checksum was removed (opening no longer hashes the index): checksums are "
                "checked when shards are written and pulled; run `dynrag index verify --index DIR`"
            )
        return value


class RaySettings(Section):
    """Builds on Ray (runtime.mode=ray): where Ray is, and what each build task that embeds asks for."""

    enabled: bool = False
    address: str | None = Field(None, description="Ray address; None starts a local instance")
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local Ray instance")
    embed_actor_num_gpus: float | None = Field(None, ge=0, description="None: 1 when the driver sees CUDA")
    gpu_fallback: bool = Field(True, description="GPU requests become CPU-only on a cluster without GPUs")


class IndexSettings(Section):
    """Everything indexing reads. `resolve_model` turns a model name into a local folder (default: the
    name must already be one)."""

    index: IndexConfig = Field(default_factory=IndexConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    ray: RaySettings = Field(default_factory=RaySettings)
    cache_dir: str = Field(default_factory=default_cache_dir, description="where remote indexes are pulled to")
    resolve_model: Callable[[str], str] | None = Field(None, exclude=True)

    def model_path(self, name: str) -> str:
        if name == "hash":  # embed.HashEncoder: no folder
            return name
        if self.resolve_model is not None:
            return self.resolve_model(name)
        if Path(name).expanduser().is_dir():
            return str(Path(name).expanduser())
        raise IndexingError(
            f"embedding model {name!r} is not a local folder (pass IndexSettings(resolve_model=...) "
            "to resolve model names)"
        )
