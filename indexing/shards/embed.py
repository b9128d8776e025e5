"""The encoder of passages and queries: `EncoderSpec` (what to load, picklable), `Encoder` (sentence-transformers)
or `HashEncoder` (a test encoder, `embedding.model=hash`), loaded once per process by `get_encoder`.

An index build embeds each staged shard's passages in its unit task (unit_work.py: in this process, a pool
process or a Ray task), `embed_input(title, text)` each; an open index embeds its queries (index.py). Vectors are
float32 and L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from indexing.settings import IndexSettings


def embed_input(title: str, text: str) -> str:
    """What the embedder sees for one passage: title and text, as FlashRAG's `contents`."""
    return f"{title}\n{text}" if title else text


@dataclass(frozen=True)
class EncoderSpec:
    """Everything an encoder needs, picklable for Ray actors."""

    model_path: str
    model_name: str
    device: str = "auto"
    dtype: str = "float32"
    batch_size: int = 128
    max_seq_length: int = 256

    @classmethod
    def from_config(cls, cfg: IndexSettings, *, build: bool = False) -> EncoderSpec:
        """The configured encoder; for a build (`build=True`) its batch fits `index.memory_budget_mb`."""
        e = cfg.embedding
        path = cfg.model_path(e.model)
        batch = e.batch_size
        if build and e.model != HASH_ENCODER:
            from indexing.shards.chunking import effective_embed_batch

            batch = effective_embed_batch(cfg, read_model_config(path))
        return cls(
            model_path=path,
            model_name=e.model,
            device=e.device,
            dtype=e.dtype,
            batch_size=batch,
            max_seq_length=e.max_seq_length,
        )


def read_model_config(path: str) -> dict:
    """The transformer's config.json in a sentence-transformers folder ({} when there is none)."""
    import json

    try:
        return json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def resolve_device(device: str) -> str:
    from platform_shims.device import own_device

    return own_device(device)


class Encoder:
    """A SentenceTransformer with the configured device, dtype and max sequence length."""

    def __init__(self, spec: EncoderSpec):
        import torch
        from sentence_transformers import SentenceTransformer

        self.spec = spec
        self.device = resolve_device(spec.device)
        self.model = SentenceTransformer(spec.model_path, device=self.device)
        self.model.max_seq_length = spec.max_seq_length
        if spec.dtype != "float32":
            self.model.to(getattr(torch, spec.dtype))
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(
            list(texts),
            batch_size=self.spec.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return vecs.float().cpu().numpy().astype(np.float32, copy=False)


HASH_ENCODER = "hash"  # embedding.model name of HashEncoder


class HashEncoder:
    """A deterministic test encoder, not a language model (`embedding.model=hash`): feature hashing,
    each word (lower-cased, split on whitespace) adds +-1 to one of 384 dimensions chosen by a hash of
    its bytes; L2-normalised. Texts that share words are near, nothing else is. It exists to measure
    the costs of builds and searches other than embedding at sizes a CPU cannot embed
    (`dynrag bench scale --encoder hash`), and for fast tests; numpy only, ~1M passages a minute."""

    dim = 384
    _MUL = np.random.default_rng(17).integers(1, 2**63, size=32, dtype=np.uint64) | np.uint64(1)

    def __init__(self, spec: EncoderSpec | None = None):
        self.spec = spec

    def encode(self, texts: list[str]) -> np.ndarray:
        n = len(texts)
        out: np.ndarray = np.zeros((n, self.dim), dtype=np.float64)
        b = np.frombuffer("\n".join(t.lower().replace("\n", " ") for t in texts).encode("utf-8"), dtype=np.uint8)
        word = b > 32
        if n and word.any():
            start = word & ~np.concatenate([[False], word[:-1]])
            doc = np.cumsum(b == 10)[start]
            begin = np.flatnonzero(start)
            wid = np.cumsum(start)[word] - 1
            pos = np.flatnonzero(word) - begin[wid]
            h = np.add.reduceat(
                b[word].astype(np.uint64) * self._MUL[pos % 32], np.flatnonzero(np.diff(wid, prepend=-1))
            )
            h = (h ^ (h >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
            sign = ((h >> np.uint64(40)) & np.uint64(1)).astype(np.float64) * 2 - 1
            out = np.bincount(
                doc * self.dim + (h % np.uint64(self.dim)).astype(np.int64), weights=sign, minlength=n * self.dim
            ).reshape(n, self.dim)
        norm = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norm > 0, norm, 1)).astype(np.float32)


_LOADED: dict[EncoderSpec, Encoder | HashEncoder] = {}


def get_encoder(spec: EncoderSpec) -> Encoder | HashEncoder:
    """The process's encoder for `spec`, loaded once (a refresh in a long-lived process, or the
    queries of an open index, do not reload the model)."""
    if spec not in _LOADED:
        _LOADED[spec] = HashEncoder(spec) if spec.model_name == HASH_ENCODER else Encoder(spec)
    return _LOADED[spec]
