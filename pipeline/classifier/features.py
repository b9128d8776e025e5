"""A feature model for C(q, d1, d2): a small MLP over frozen-embedding and lexical features.

DR-RAG fine-tunes a cross-encoder (App. A.1); on a 2-core CPU that takes hours. What C must see is
whether d2 is the second hop of d1 for q (Eq. 2): a bridge entity. So each input becomes a short
vector: cosines of the frozen sentence embeddings (q·d1, q·d2, d1·d2; all-MiniLM-L6-v2 by default) and
lexical overlaps (question / documents / the other document's title, as BM25 would see them), then a
standardised MLP. Measured on held-out questions: see README (the DR-RAG classifier). A pair (q, d) uses
the same features with d2 = d1, so one model folder scores both shapes.

Documents are read in `format_document`'s "title: text" form; the title is what precedes the first
": " (a title containing ": " is split early, which only weakens one feature).

Folder: `dynrag-classifier.json` (kind "features", embedder, feature names, threshold, metrics) and
`mlp.safetensors` (scaler and layer weights; inference is numpy, nothing is unpickled).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.classifier.meta import ClassifierError, ClassifierMeta, ThresholdClassifier, check_item, write_meta

log = logging.getLogger(__name__)

WEIGHTS = "mlp.safetensors"
KIND = "features"
FEATURES = (
    "cos_q_d1",
    "cos_q_d2",
    "cos_d1_d2",
    "q_d1_share_q",
    "q_d1_share_d1",
    "q_d1_log",
    "q_d2_share_q",
    "q_d2_share_d2",
    "q_d2_log",
    "d1_d2_share_d1",
    "d1_d2_share_d2",
    "d1_d2_log",
    "title2_in_d1",
    "title1_in_d2",
    "title1_in_q",
    "title2_in_q",
    "title2_words_in_d1",
    "title1_words_in_d2",
    "title1_words_in_q",
    "title2_words_in_q",
)
_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return {w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOP_WORDS}


def _title(doc: str) -> str:
    title, sep, _ = doc.partition(": ")
    return title.strip().lower() if sep else ""


def _overlap(a: set[str], b: set[str]) -> list[float]:
    n = len(a & b)
    return [n / max(1, len(a)), n / max(1, len(b)), float(np.log1p(n))]


def _contains(title: str, text: str) -> float:
    return float(bool(title) and title in text.lower())


def _covered(title: str, words: set[str]) -> float:
    t = _words(title)
    return len(t & words) / len(t) if t else 0.0


def lexical(q: str, d1: str, d2: str) -> list[float]:
    wq, w1, w2 = _words(q), _words(d1), _words(d2)
    t1, t2 = _title(d1), _title(d2)
    return (
        _overlap(wq, w1)
        + _overlap(wq, w2)
        + _overlap(w1, w2)
        + [_contains(t2, d1), _contains(t1, d2), _contains(t1, q), _contains(t2, q)]
        + [_covered(t2, w1), _covered(t1, w2), _covered(t1, wq), _covered(t2, wq)]
    )


def featurize(items: Sequence[Sequence[str]], emb: dict[str, np.ndarray]) -> np.ndarray:
    """One row of FEATURES per (q, d1, d2) or (q, d) item; `emb` maps every text to its unit vector."""
    rows = []
    for it in items:
        q, d1, d2 = (it[0], it[1], it[1]) if len(it) == 2 else it
        eq, e1, e2 = emb[q], emb[d1], emb[d2]
        rows.append([float(eq @ e1), float(eq @ e2), float(e1 @ e2), *lexical(q, d1, d2)])
    return np.asarray(rows, dtype=np.float32).reshape(-1, len(FEATURES))


class Embedder:
    """Frozen sentence embeddings (unit length) with an in-memory LRU and an optional on-disk store, so an
    interrupted training run resumes without embedding the same text twice."""

    def __init__(self, folder: str, store: Path | None = None, lru: int = 20000, batch_size: int = 32):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(folder, device="cpu")
        self.store, self.lru, self.batch_size = store, lru, batch_size
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        if store is not None and store.is_dir():
            for f in sorted(store.glob("[0-9]*.npz")):
                with np.load(f) as z:
                    self._remember(dict(zip(z["keys"].tolist(), z["vectors"])))

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()

    def _remember(self, by_key: dict[str, np.ndarray]) -> None:
        for k, v in by_key.items():
            self.cache[k] = v
            self.cache.move_to_end(k)
        while self.store is None and len(self.cache) > self.lru:
            self.cache.popitem(last=False)

    def embed(self, texts: Sequence[str], progress: bool = False, chunk: int = 256) -> dict[str, np.ndarray]:
        todo = list(dict.fromkeys(t for t in texts if self.key(t) not in self.cache))
        bar = None
        if progress and todo:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="embedding texts", unit="text")  # shows rate and ETA
        for s in range(0, len(todo), chunk):
            part = todo[s : s + chunk]
            vecs = self.model.encode(part, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True)
            got = {self.key(t): v.astype(np.float32) for t, v in zip(part, vecs)}
            if self.store is not None:  # one file per chunk: a kill loses at most the chunk in flight
                self.store.mkdir(parents=True, exist_ok=True)
                name = f"{time.time_ns()}-{os.getpid()}"  # unique: concurrent runs never overwrite each other
                np.savez(self.store / f".{name}.npz", keys=np.array(list(got)), vectors=np.stack(list(got.values())))
                os.replace(self.store / f".{name}.npz", self.store / f"{name}.npz")
            self._remember(got)
            if bar is not None:
                bar.update(len(part))
        if bar is not None:
            bar.close()
        return {t: self.cache[self.key(t)] for t in texts}


class MLP:
    """Standardise, ReLU hidden layers, sigmoid output: sklearn's MLPClassifier forward pass in numpy."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, weights: list[np.ndarray], biases: list[np.ndarray]):
        self.mean, self.scale, self.weights, self.biases = mean, scale, weights, biases

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, hidden: int, alpha: float, seed: int) -> MLP:
        from sklearn.neural_network import MLPClassifier
        from sklearn.preprocessing import StandardScaler

        scaler = StandardScaler().fit(x)
        net = MLPClassifier((hidden,), alpha=alpha, early_stopping=True, max_iter=500, random_state=seed)
        net.fit(scaler.transform(x), y)
        return cls(
            scaler.mean_.astype(np.float32),
            scaler.scale_.astype(np.float32),
            [w.astype(np.float32) for w in net.coefs_],
            [b.astype(np.float32) for b in net.intercepts_],
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return (1.0 / (1.0 + np.exp(-h[:, 0]))).astype(np.float32)

    def tensors(self) -> dict[str, np.ndarray]:
        out = {"mean": self.mean, "scale": self.scale}
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            out[f"w{i}"], out[f"b{i}"] = w, b
        return out

    @classmethod
    def from_tensors(cls, t: dict[str, np.ndarray]) -> MLP:
        n = sum(k.startswith("w") for k in t)
        return cls(t["mean"], t["scale"], [t[f"w{i}"] for i in range(n)], [t[f"b{i}"] for i in range(n)])


class FeatureClassifier(ThresholdClassifier):
    """Same surface as the cross-encoder `Classifier`: score, predict, threshold, meta, save."""

    def __init__(self, embedder: Embedder, mlp: MLP, meta: ClassifierMeta):
        self.embedder, self.mlp, self.meta = embedder, mlp, meta

    def score(self, items: Sequence[Sequence[str]], batch_size: int = 64) -> np.ndarray:
        if not items:
            return np.zeros(0, dtype=np.float32)
        for it in items:
            check_item(it)
        emb = self.embedder.embed([t for it in items for t in it])
        return self.mlp(featurize(items, emb))

    def save(self, folder: str | os.PathLike) -> Path:
        from safetensors.numpy import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.mlp.tensors(), str(folder / WEIGHTS))
        write_meta(folder, self.meta)
        return folder

    @classmethod
    def load(cls, folder: Path, meta: ClassifierMeta, cache_dir: str | None = None) -> FeatureClassifier:
        """`cache_dir` resolves the embedder by its model key when the training run's embedder folder is gone
        (None: the default paths.cache_dir)."""
        from safetensors.numpy import load_file

        from pipeline.assets.models import resolve_model
        from pipeline.config import PathsConfig

        if not (folder / WEIGHTS).is_file():
            raise ClassifierError(f"{folder} lacks {WEIGHTS} (a feature classifier's weights)")
        if list(meta.features) != list(FEATURES):
            raise ClassifierError(f"{folder}: saved features {meta.features} differ from this version's")
        saved = meta.training.get("embedder_folder", "")  # the folder it was trained with, where it still exists
        base = (
            saved
            if saved and Path(saved).is_dir()
            else resolve_model(meta.base_model, cache_dir or PathsConfig().cache_dir)
        )
        return cls(Embedder(base), MLP.from_tensors(load_file(str(folder / WEIGHTS))), meta)


def train_features(cfg, splits, base_folder: str) -> tuple[FeatureClassifier, dict]:
    """Embed every text once (stored under the cache, so a rerun resumes), then fit the MLP."""
    cc = cfg.classifier
    store = (
        Path(cfg.paths.cache_dir)
        / "classifier-embeddings"
        / hashlib.sha1(str(Path(base_folder).resolve()).encode()).hexdigest()[:16]
    )
    embedder = Embedder(base_folder, store=store)
    t0 = time.perf_counter()
    texts = [t for e in splits.train + splits.dev for t in e.item]
    emb = embedder.embed(texts, progress=True)
    t1 = time.perf_counter()
    x = featurize([e.item for e in splits.train], emb)
    mlp = MLP.fit(x, np.array([e.label for e in splits.train]), cc.mlp_hidden, cc.mlp_alpha, cc.seed)
    seconds = time.perf_counter() - t0
    meta = ClassifierMeta(
        base_model=cc.base_model,
        kind=KIND,
        features=list(FEATURES),
        threshold=cc.threshold,
        max_length=embedder.model.max_seq_length,
        input_format="features of (q, d1, d2); pairs (q, d) as (q, d, d)",
    )
    meta.training["embedder_folder"] = str(Path(base_folder).resolve())
    log_ = {
        "examples_seen": len(splits.train),
        "seconds": round(seconds, 1),
        "embedding_seconds": round(t1 - t0, 1),
        "texts": len(set(texts)),
        "examples_per_second": round(len(splits.train) / max(seconds, 1e-9), 2),
    }
    return FeatureClassifier(embedder, mlp, meta), log_
