"""What PyPI packages carry: the known models, prepared offline, and embedded text and questions."""

# the modules code outside assets/ may import
__all__ = [
    "embedded",
    "models",
]
