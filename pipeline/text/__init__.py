"""Text below every other layer: SQuAD answer normalisation and the answer metrics (EM, F1, accuracy,
gold-document recall), used by the methods, the output rows and the evaluation alike."""

# the modules code outside text/ may import
__all__ = [
    "metrics",
]
