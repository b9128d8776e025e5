"""Cross-encoder scoring of text pairs or triples (DR-RAG's classifier C(q, d1, d2), the knowledge
filter, rerankers). A classifier name maps to a model folder in `scoring.classifiers`; methods that
train their own classifier register the folder there (or pass a path as the name).

A pair (a, b) is encoded as the two segments; a triple (q, d1, d2) as (q, d1 [SEP] d2). The score is
the logit of the last class (the positive one) for a multi-class head, or the single logit.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import DynragConfig
from pipeline.errors import DynragError

log = logging.getLogger(__name__)


class ScorerError(DynragError, LookupError):
    pass


class CrossEncoderScorer:
    def __init__(self, cfg: DynragConfig):
        self.cfg = cfg
        self._loaded: dict[str, tuple] = {}

    def _load(self, name: str):
        if name in self._loaded:
            return self._loaded[name]
        path = self.cfg.scoring.classifiers.get(name) or (name if Path(name).is_dir() else None)
        if not path:
            raise ScorerError(f"no classifier {name!r}: set scoring.classifiers.{name}=<model folder> "
                              "(train one with the method's training job)")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path).eval()
        self._loaded[name] = (tok, model, torch)
        return self._loaded[name]

    def score(self, items: list[tuple[str, ...]], classifier: str = "default") -> list[float]:
        tok, model, torch = self._load(classifier)
        sep = f" {tok.sep_token} " if tok.sep_token else " \n "
        firsts = [it[0] for it in items]
        seconds = [sep.join(it[1:]) if len(it) > 1 else "" for it in items]
        scores: list[float] = []
        bs = self.cfg.scoring.batch_size
        for s in range(0, len(items), bs):
            enc = tok(firsts[s:s + bs], seconds[s:s + bs], truncation=True, max_length=self.cfg.scoring.max_length,
                      padding=True, return_tensors="pt")
            with torch.no_grad():
                logits = model(**enc).logits
            scores.extend(logits[:, -1].float().tolist())
        return scores
