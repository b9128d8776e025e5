"""What PyPI packages carry: the known models, prepared offline, and embedded text and questions."""
