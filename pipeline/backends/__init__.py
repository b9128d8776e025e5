"""Backends behind small interfaces, created lazily on first use by `Backends`.

- generation: `generate(prompts, samplings, chats) -> list[Completion | Exception]` (vLLM or transformers),
  and a streaming generator's `submit(prompt, sampling, chat) -> Future` (pipeline/engine/streaming.py)
- retrieval:  `search(queries, k, retriever) -> list[list[Hit]]` (an index from `indexing.open_index`)
- scoring:    `score(items, classifier) -> list[float]` (cross-encoders)
- embedding:  `embed(texts, model) -> ndarray` (sentence-transformers)
- named backends for `Call` requests: `call(name, op, items) -> list`, each registered with
  `@register_backend(name)` on a class built as `cls(cfg, backends)` on first use (DRAGIN's attention
  pass, ERM4's knowledge reservoir); `cfg.runtime` may not know them, so they read their own settings

A run that never retrieves never opens an index; one that never generates never loads a model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pipeline.config import DynragConfig
from pipeline.engine.requests import Completion, Retrieve
from pipeline.engine.search_cache import SearchCache
from pipeline.errors import BackendError as BackendError  # re-exported: raised by the backends

log = logging.getLogger(__name__)


_NAMED: dict[str, Callable[..., Any]] = {}


def register_backend(name: str):
    """Register a factory `(cfg, backends) -> object` for `Call(backend=name, ...)` requests."""

    def deco(factory):
        _NAMED[name] = factory
        return factory

    return deco


class Backends:
    def __init__(
        self,
        cfg: DynragConfig,
        index_dir: str | None = None,
        *,
        generator: Any = None,
        retriever: Any = None,
        scorer: Any = None,
        embedder: Any = None,
        named: dict[str, Any] | None = None,
        one_call: bool = False,
    ):
        self.cfg = cfg
        self.one_call = one_call  # every method these backends serve makes one LLM call a question (`streams`)
        self.index_dir = index_dir
        self._generator, self._retriever, self._scorer, self._embedder = generator, retriever, scorer, embedder
        self._named: dict[str, Any] = dict(named or {})
        # the continuous engine's lanes may build parts at the same time: one lock per part, so a part that
        # loads slowly holds up only its own users; a built part is read without any lock
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # hits of queries searched already, for every run and round on these backends (engine/search_cache.py)
        size = cfg.answer.retrieval_cache
        self.search_cache = SearchCache(size) if size else None
        self._scope: tuple | None = None

    def _built(self, attr: str, build: Callable[[], Any]) -> Any:
        """`getattr(self, attr)`, built once by `build()` (double-checked under the part's own lock)."""
        part = getattr(self, attr)
        if part is None:
            with self._lock(attr):
                part = getattr(self, attr)
                if part is None:
                    part = build()
                    setattr(self, attr, part)
        return part

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())

    # -- lazily built parts ------------------------------------------------------------------
    @property
    def generator(self):
        return self._built("_generator", lambda: make_generator(self.cfg, self.one_call))

    @property
    def retriever(self):
        def build():
            from pipeline.backends.retrieval import IndexRetriever

            if not self.index_dir:
                raise BackendError("this method retrieves: pass --index DIR")
            return IndexRetriever(self.index_dir, self.cfg)  # FAISS on the CPU: a GPU plan opens it first

        return self._built("_retriever", build)

    @property
    def embedder(self):
        def build():
            from pipeline.backends.embedding import SentenceEmbedder

            return SentenceEmbedder(self.cfg)

        return self._built("_embedder", build)

    @property
    def scorer(self):
        def build():
            from pipeline.backends.scoring import CrossEncoderScorer

            return CrossEncoderScorer(self.cfg)

        return self._built("_scorer", build)

    # -- the calls the engine makes ----------------------------------------------------------
    def defaults(self, req: Retrieve) -> tuple[int, str]:
        return (req.k or self.cfg.retrieval.k, req.retriever or self.cfg.retrieval.retriever)

    def search_scope(self) -> tuple:
        """What decides a query's hits besides the query, the retriever and k: the index (folder and the version
        opened) and the index, embedding and retrieval settings (a retriever given ready-made: that object)."""
        if self._scope is None:
            import json

            retriever = self.retriever
            index = getattr(retriever, "index", None)
            where = (
                (str(getattr(index, "root", self.index_dir)), getattr(index, "version", None))
                if index is not None
                else ("object", id(retriever))
            )
            settings = [self.cfg.index, self.cfg.embedding, self.cfg.retrieval]
            self._scope = (*where, json.dumps([s.model_dump(mode="json") for s in settings], sort_keys=True))
        return self._scope

    def generate(self, prompts, samplings, chats):
        return self.generator.generate(prompts, samplings, chats)

    @property
    def streams(self) -> bool:
        """The generator takes prompts one by one (`submit`, pipeline/engine/streaming.py)."""
        return hasattr(self.generator, "submit")

    def submit(self, prompt, sampling, chat) -> Future:
        return self.generator.submit(prompt, sampling, chat)

    @property
    def default_max_tokens(self) -> int:
        """What a generate call whose max_tokens is None may write (the generator's generation.max_new_tokens)."""
        return self.cfg.generation.max_new_tokens

    def kv_capacity(self) -> int | None:
        """Tokens the generator's KV cache holds (None: no bound known). A vLLM generator is built to tell."""
        if self._generator is None and self.cfg.generation.backend != "vllm":
            return None
        capacity = getattr(self.generator, "kv_capacity", None)
        return capacity() if capacity is not None else None

    def program_ended(self, program: int) -> None:
        """`program` (a question's admission order) makes no more calls: a generator that holds each program's KV
        blocks between its calls (answer.kv_pin_s, kv_pins.py) gives them back."""
        end = getattr(self._generator, "program_ended", None)
        if end is not None:
            end(program)

    def search(self, queries, k, retriever):
        return self.retriever.search(queries, k, retriever)

    def score(self, items, classifier):
        return self.scorer.score(items, classifier)

    def embed(self, texts, model):
        return self.embedder.embed(texts, model)

    def named(self, name: str):
        backend = self._named.get(name)
        if backend is None:
            with self._lock(f"named:{name}"):
                backend = self._named.get(name)
                if backend is None:
                    if name not in _NAMED:
                        raise BackendError(
                            f"no backend {name!r} registered (known: {', '.join(sorted(_NAMED)) or 'none'})"
                        )
                    backend = self._named[name] = _NAMED[name](self.cfg, self)
        return backend

    def call(self, name: str, op: str, items: list):
        backend = self.named(name)
        fn = getattr(backend, op, None)
        if op.startswith("_") or not callable(fn):
            raise BackendError(f"backend {name!r} has no operation {op!r}")
        return fn(items)

    def close(self) -> None:
        for part in (self._generator, self._retriever, self._scorer, self._embedder, *self._named.values()):
            if part is not None and hasattr(part, "close"):
                try:
                    part.close()
                except Exception:  # closing is best effort
                    log.debug("closing %s failed", type(part).__name__, exc_info=True)


class NoGenerator:
    """generation.backend=none: every prompt gets an empty completion (retrieval-only studies)."""

    def generate(self, prompts, samplings, chats):
        return [Completion("", finish_reason="none") for _ in prompts]


def streams(cfg: DynragConfig, one_call: bool) -> bool:
    """generation.streaming resolved: `auto` streams unless every method the generator serves is known to make
    one LLM call a question, as its last request (`one_call`: methods.registry.all_one_call, from the caller):
    batched calls then cost less (no async engine loop beside vLLM's threads, no request handed over one at a
    time) and streaming would buy them nothing."""
    if cfg.generation.streaming != "auto":
        return bool(cfg.generation.streaming)
    return not one_call


def make_generator(cfg: DynragConfig, one_call: bool = False):
    """The generator of generation.backend; `one_call`: see `streams`."""
    if cfg.generation.backend == "none":
        return NoGenerator()
    if cfg.generation.backend == "vllm" and streams(cfg, one_call):
        from pipeline.backends.vllm_stream import VllmStreamingGenerator

        return VllmStreamingGenerator(cfg)
    if cfg.generation.backend == "vllm":
        from pipeline.backends.vllm_gen import VllmGenerator

        return VllmGenerator(cfg)
    from pipeline.backends.hf_gen import HfGenerator

    return HfGenerator(cfg)


# its names, and the modules code outside backends/ may import
__all__ = [
    "BackendError",
    "Backends",
    "NoGenerator",
    "make_generator",
    "register_backend",
    "streams",
    "attention",
    "authors_attention",
    "chat",
    "dragin_math",
    "kv_pins",
    "orphan_guard",
    "retrieval",
    "scoring",
    "vllm_gen",
]
