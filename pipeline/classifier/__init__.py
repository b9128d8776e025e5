"""The DR-RAG classifier C(q, d1, d2) -> positive/negative (Hei et al., Sec. 2.2.2, Eq. 2; App. A.1).

- `data`: training examples from multi-hop supporting labels, split by question.
- `model`: the cross-encoder (`Classifier.load(path).score(items)`), which also scores pairs (q, d).
- `train`: fine-tuning and evaluation, behind `dynrag train-classifier`.
"""

from pipeline.classifier.data import format_document
from pipeline.classifier.model import Classifier, ClassifierMeta

__all__ = ["Classifier", "ClassifierMeta", "format_document"]
