"""The DR-RAG classifier C(q, d1, d2) -> positive/negative (Hei et al., Sec. 2.2.2, Eq. 2; App. A.1).

- `data`: training examples from multi-hop supporting labels, split by question.
- `model`: the cross-encoder, which also scores pairs (q, d); `Classifier.load(path).score(items)` loads a
  folder of either kind.
- `features`: the default kind, a small MLP over frozen-embedding and lexical features.
- `meta`: what both kinds share (dynrag-classifier.json, the item check, the threshold rule).
- `train`: training of either kind, evaluation and threshold tuning, behind `dynrag train-classifier`.
"""

from pipeline.classifier.data import format_document
from pipeline.classifier.model import Classifier, ClassifierMeta

# its names, and the modules code outside classifier/ may import
__all__ = ["Classifier", "ClassifierMeta", "format_document", "complexity", "data", "meta", "model", "train"]
