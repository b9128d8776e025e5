"""Cross-encoder scoring of pairs (q, d) or triples (q, d1, d2): DR-RAG's classifier C(q, d1, d2),
rerankers and the knowledge filter. Every score is P(positive) in [0, 1].

A classifier name resolves, in order, to: `scoring.classifiers[name]`; for "default", `classifier.path`;
else the name itself as a folder. A folder written by `dynrag train-classifier` (it holds
`dynrag-classifier.json`) loads with `pipeline.classifier.Classifier`; any other folder is read as a
transformers sequence-classification model (a hub reranker such as bge-reranker-base downloaded on a
cluster): softmax of the last class, or the sigmoid of a single logit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import DynragConfig
from pipeline.errors import DynragError

log = logging.getLogger(__name__)


class ScorerError(DynragError, LookupError):
    pass


def classifier_path(cfg: DynragConfig, name: str) -> str:
    path = cfg.scoring.classifiers.get(name) or (cfg.classifier.path if name == "default" else None)
    if not path and Path(name).is_dir():
        path = name
    if not path:
        raise ScorerError(
            f"no classifier {name!r}: pass a model folder as the name, or set "
            f"scoring.classifiers.{name}=<folder> (train one with `dynrag train-classifier`)"
        )
    if not Path(path).is_dir():
        raise ScorerError(f"classifier {name!r}: {path} is not a folder")
    return str(path)


class _SequenceClassifier:
    """A transformers AutoModelForSequenceClassification folder."""

    def __init__(self, path: str, cfg: DynragConfig):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, trust_remote_code=cfg.generation.trust_remote_code
        ).eval()
        self.max_length = cfg.scoring.max_length

    def score(self, items, batch_size: int) -> list[float]:
        sep = f" {self.tok.sep_token} " if self.tok.sep_token else " \n "
        firsts = [it[0] for it in items]
        seconds = [sep.join(it[1:]) for it in items]
        out: list[float] = []
        for s in range(0, len(items), batch_size):
            enc = self.tok(
                firsts[s : s + batch_size],
                seconds[s : s + batch_size],
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
            with self.torch.inference_mode():
                logits = self.model(**enc).logits.float()
            probs = logits.sigmoid()[:, 0] if logits.shape[-1] == 1 else logits.softmax(-1)[:, -1]
            out.extend(probs.tolist())
        return out


class CrossEncoderScorer:
    def __init__(self, cfg: DynragConfig):
        self.cfg = cfg
        self._loaded: dict[str, object] = {}

    def model(self, name: str):
        if name not in self._loaded:
            path = classifier_path(self.cfg, name)
            if (Path(path) / "dynrag-classifier.json").is_file():
                from pipeline.classifier.model import Classifier

                self._loaded[name] = Classifier.load(
                    path, device=self.cfg.classifier.device, cache_dir=self.cfg.paths.cache_dir
                )
            else:
                self._loaded[name] = _SequenceClassifier(path, self.cfg)
            log.info("classifier %r loaded from %s", name, path)
        return self._loaded[name]

    def threshold(self, name: str) -> float:
        """The decision threshold saved with a trained classifier (0.5 for other models)."""
        m = self.model(name)
        return float(getattr(m, "threshold", 0.5))

    def score(self, items: list[tuple[str, ...]], classifier: str = "default") -> list[float]:
        from pipeline.classifier.meta import check_item

        for it in items:
            check_item(it)
        return [float(x) for x in self.model(classifier).score(items, batch_size=self.cfg.scoring.batch_size)]
