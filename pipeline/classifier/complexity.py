"""Adaptive-RAG's query-complexity classifier (Jeong et al., NAACL 2024, "Adaptive-RAG: Learning to Adapt
Retrieval-Augmented Large Language Models through Question Complexity", Sec. 3.2-3.3).

Labels: A (the model answers alone), B (single-step retrieval), C (multi-step). As in the paper (Sec. 3.3) a
question's label is silver where runs of the three strategies exist - the simplest strategy that answers it
correctly (no-retrieval -> A, sr-rag -> B, ircot -> C; `--silver` answer folders, EM) - else its dataset's
inductive bias: single-hop sets (squad, nq_open, triviaqa) B, multi-hop sets (hotpotqa, 2wikimultihopqa,
musique) C. The paper fine-tunes T5-Large; here a multinomial logistic regression over the frozen sentence
embedding of the question (`classifier.base_model`) trains in about a minute on a CPU. The kit has no training
split for the single-hop sets: their dev files are sampled (`--per-dataset` each), so do not evaluate
adaptive-rag on the same sampled questions.

Folder: `dynrag-complexity.json` (kind, embedder, labels, metrics) and `complexity.safetensors` (weights;
inference is numpy, nothing is unpickled).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.classifier.features import Embedder
from pipeline.classifier.meta import ClassifierError
from pipeline.config import DynragConfig, save_resolved
from pipeline.engine.requests import Question

LABELS = ("A", "B", "C")
META = "dynrag-complexity.json"
WEIGHTS = "complexity.safetensors"
SINGLE_HOP = {
    "squad": "squad/dev_qa_10570.jsonl",
    "nq_open": "nq_open/dev_3610.jsonl",
    "triviaqa": "triviaqa/sample_150.json",
}
MULTI_HOP = {
    "hotpotqa": "hotpotqa/train_100.json",
    "2wikimultihopqa": "2wikimultihopqa/train_500.json",
    "musique": "musique/train_100.json",
}
STRATEGY = {"no-retrieval": "A", "sr-rag": "B", "ircot": "C"}  # simplest first


def kit_questions(data_dir: str | Path, per_dataset: int) -> list[tuple[Question, str]]:
    """(question, inductive-bias label) for up to `per_dataset` questions of each kit file, in file order."""
    from pipeline.io.datasets import load_questions

    out = []
    for files, bias in ((SINGLE_HOP, "B"), (MULTI_HOP, "C")):
        for name, rel in files.items():
            path = Path(data_dir) / rel
            if not path.exists():
                raise ClassifierError(f"kit file {path} is missing (paths.data_dir)")
            got = [q for q in load_questions(str(path)) if q.error is None and q.question][:per_dataset]
            out += [(Question(q.id, q.question, q.answers, dataset=name), bias) for q in got]
    return out


def silver_labels(folders: Sequence[str]) -> dict[str, str]:
    """question text -> the simplest strategy's label that answered it (EM) in the answer output `folders`."""
    import polars as pl

    correct: dict[str, set[str]] = {}
    for folder in folders:
        parts = sorted(Path(folder).glob("parts/*.parquet"))
        if not parts:
            raise ClassifierError(f"--silver {folder}: no answer rows (parts/*.parquet)")
        df = pl.read_parquet(parts, columns=["question", "method", "em"])
        for q, method, em in df.iter_rows():
            if method in STRATEGY and em:
                correct.setdefault(q, set()).add(STRATEGY[method])
    return {q: min(labels) for q, labels in correct.items()}


def held_out(qid: str, fraction: float, seed: int) -> bool:
    h = hashlib.sha256(f"{seed}:{qid}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class ComplexityClassifier:
    """question -> (label, probability) with a linear softmax over its frozen embedding."""

    def __init__(self, embedder: Embedder, coef: np.ndarray, intercept: np.ndarray, meta: dict):
        self.embedder, self.coef, self.intercept, self.meta = embedder, coef, intercept, meta

    def probabilities(self, questions: Sequence[str]) -> np.ndarray:
        emb = self.embedder.embed(list(questions))
        x = np.stack([emb[q] for q in questions]) if questions else np.zeros((0, self.coef.shape[1]), np.float32)
        return softmax(x @ self.coef.T + self.intercept)

    def predict(self, questions: Sequence[str]) -> list[tuple[str, float]]:
        p = self.probabilities(questions)
        return [(LABELS[int(i)], float(row[i])) for row, i in zip(p, p.argmax(axis=1))]

    def save(self, folder: Path) -> None:
        from safetensors.numpy import save_file

        save_file({"coef": self.coef, "intercept": self.intercept}, str(folder / WEIGHTS))
        (folder / META).write_text(json.dumps(self.meta, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, folder: str | Path, cache_dir: str | None = None) -> ComplexityClassifier:
        from safetensors.numpy import load_file

        from pipeline.assets.models import resolve_model
        from pipeline.config import PathsConfig

        folder = Path(folder)
        if not (folder / META).is_file():
            raise ClassifierError(
                f"{folder} is not a complexity classifier (no {META}); "
                "train one with `dynrag train-classifier --task complexity --out DIR`"
            )
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        w = load_file(str(folder / WEIGHTS))
        return cls(
            Embedder(resolve_model(meta["embedder"], cache_dir or PathsConfig().cache_dir)),
            w["coef"],
            w["intercept"],
            meta,
        )


def train_complexity(
    cfg: DynragConfig,
    out_dir: str | Path,
    *,
    silver: Sequence[str] = (),
    per_dataset: int = 300,
    overwrite: bool = False,
) -> dict:
    """Label, embed, fit, evaluate on held-out questions (`classifier.dev_fraction`), write the folder."""
    from sklearn.linear_model import LogisticRegression

    from pipeline.assets.models import resolve_model
    from pipeline.classifier.train import write_atomically

    cc, out = cfg.classifier, Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ClassifierError(f"output folder {out} exists and is not empty (pass --overwrite to replace it)")
    t0 = time.perf_counter()
    items = kit_questions(cfg.paths.data_dir, per_dataset)
    by_text = silver_labels(silver)
    labels = np.array([LABELS.index(by_text.get(q.question, bias)) for q, bias in items])
    texts = [q.question for q, _ in items]
    embedder = Embedder(resolve_model(cc.base_model, cfg.paths.cache_dir))
    emb = embedder.embed(texts, progress=True)
    x = np.stack([emb[t] for t in texts])
    dev = np.array([held_out(f"{q.dataset}:{q.id}", cc.dev_fraction, cc.seed) for q, _ in items])
    present = sorted(set(labels[~dev].tolist()))
    if len(present) < 2:
        raise ClassifierError("complexity: the training questions hold fewer than two labels")
    lr = LogisticRegression(C=1.0, max_iter=2000, random_state=cc.seed).fit(x[~dev], labels[~dev])
    coef = np.zeros((len(LABELS), x.shape[1]), np.float32)  # absent labels never win
    intercept: np.ndarray = np.full(len(LABELS), -1e4, np.float32)
    rows = lr.coef_ if len(present) > 2 else np.stack([-lr.coef_[0] / 2, lr.coef_[0] / 2])
    icpt = lr.intercept_ if len(present) > 2 else np.array([-lr.intercept_[0] / 2, lr.intercept_[0] / 2])
    coef[present], intercept[present] = rows, icpt
    clf = ComplexityClassifier(embedder, coef, intercept, {"kind": "complexity", "embedder": cc.base_model})
    pred = np.array([LABELS.index(label) for label, _ in clf.predict([t for t, d in zip(texts, dev) if d])])
    gold = labels[dev]
    majority = Counter(labels[~dev].tolist()).most_common(1)[0][0]
    result = {
        "task": "complexity",
        "train": {"questions": int((~dev).sum()), "labels": _count(labels[~dev])},
        "dev": {
            "questions": int(dev.sum()),
            "labels": _count(gold),
            "accuracy": float((pred == gold).mean()) if len(gold) else None,
            "majority_label": LABELS[majority],
            "majority_baseline_accuracy": float((gold == majority).mean()) if len(gold) else None,
        },
        "silver_labelled": sum(q.question in by_text for q, _ in items),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    clf.meta["metrics"] = result

    def write(folder: Path) -> None:
        clf.save(folder)
        (folder / "metrics.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
        save_resolved(cfg, folder)

    write_atomically(out, overwrite, write)
    return result


def _count(labels: np.ndarray) -> dict[str, int]:
    return {LABELS[k]: int(v) for k, v in sorted(Counter(labels.tolist()).items())}
