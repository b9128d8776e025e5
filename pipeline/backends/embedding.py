"""Sentence embeddings (sentence-transformers, or `embedding.model=hash`: the index's test encoder) for methods
that compare vectors (PAIRS, ERM4)."""

from __future__ import annotations

import numpy as np

from indexing.shards.embed import HASH_ENCODER, HashEncoder
from pipeline.assets.models import resolve_model
from pipeline.config import DynragConfig


class SentenceEmbedder:
    def __init__(self, cfg: DynragConfig):
        self.cfg = cfg
        self._models: dict[str, object] = {}

    def _model(self, name: str | None):
        name = name or self.cfg.embedding.model
        if name == HASH_ENCODER:  # the index's test encoder, here too
            return self._models.setdefault(name, HashEncoder())
        if name not in self._models:
            from sentence_transformers import SentenceTransformer

            from platform_shims.device import own_device

            e = self.cfg.embedding
            # this process's own device: "auto" is its own GPU, never another replica's GPU 0; an explicit CUDA
            # device where it owns none is refused with one line
            m = SentenceTransformer(resolve_model(name, self.cfg.paths.cache_dir), device=own_device(e.device))
            m.max_seq_length = e.max_seq_length
            self._models[name] = m
        return self._models[name]

    def embed(self, texts: list[str], model: str | None = None) -> np.ndarray:
        """L2-normalised float32 vectors, shape (len(texts), dim)."""
        m = self._model(model)
        if isinstance(m, HashEncoder):
            return m.encode(list(texts))
        vecs = m.encode(
            list(texts),
            batch_size=self.cfg.embedding.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)
