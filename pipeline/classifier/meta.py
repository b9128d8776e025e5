"""What every kind of classifier shares: its folder's `dynrag-classifier.json` (ClassifierMeta, `write_meta`),
its error type, the check of a scored item and the threshold rule (`ThresholdClassifier.predict`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import DynragError

META = "dynrag-classifier.json"
FORMAT_VERSION = 1


class ClassifierError(DynragError, ValueError):
    """A classifier folder is missing or incomplete, or an input is malformed."""


@dataclass
class ClassifierMeta:
    base_model: str  # the fine-tuned encoder (cross-encoder) or the frozen embedder (features)
    kind: str = "cross-encoder"  # or "features" (pipeline.classifier.features)
    features: list[str] = field(default_factory=list)  # kind "features": the input features, in order
    max_length: int = 256
    max_query_tokens: int = 64
    threshold: float = 0.5
    pooling: str = "mean"
    format_version: int = FORMAT_VERSION
    input_format: str = "[CLS] q [SEP] d1 [SEP] d2 [SEP]; pairs [CLS] q [SEP] d [SEP]"
    document_format: str = "title: text (pipeline.classifier.data.format_document)"
    training: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def write_meta(folder: Path, meta: ClassifierMeta) -> None:
    (folder / META).write_text(json.dumps(asdict(meta), indent=1), encoding="utf-8")


class ThresholdClassifier:
    """The decision rule both kinds share: C(...) = positive where `score` >= the threshold."""

    meta: ClassifierMeta

    @property
    def threshold(self) -> float:
        return self.meta.threshold

    def score(self, items: Sequence[Sequence[str]], batch_size: int = 64):
        raise NotImplementedError

    def predict(self, items: Sequence[Sequence[str]], threshold: float | None = None, batch_size: int = 64):
        """True where C(...) = positive, i.e. P(positive) >= threshold (the model's own threshold by default)."""
        t = self.meta.threshold if threshold is None else threshold
        return self.score(items, batch_size) >= t


def saved_threshold(path: str | os.PathLike) -> float:
    """The decision threshold saved in a classifier folder; 0.5 for any other model folder."""
    meta = Path(path) / META
    if not meta.is_file():
        return 0.5
    return float(json.loads(meta.read_text(encoding="utf-8")).get("threshold", 0.5))


def check_item(item: Any) -> Sequence[str]:
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3) or not all(isinstance(x, str) for x in item):
        raise ClassifierError(f"an item is (question, doc) or (question, doc1, doc2) strings, got {_show(item)}")
    return item


def _show(item: Any) -> str:
    text = repr(item)
    return text if len(text) < 80 else text[:77] + "..."
