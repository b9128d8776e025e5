"""dynrag's engine, methods, evaluation and configuration."""

import os

# Arrow's default pool (mimalloc in the wheels) keeps freed pages: an index build reading and
# writing thousands of shard files grew by ~30 MiB that way. Arrow reads this once, when pyarrow is
# first imported, so it is set here, in the package every entry point imports first.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

# its layers (README "Layout"): code outside pipeline/ enters each by that layer's own __all__
__all__ = [
    "assets",
    "backends",
    "classifier",
    "config",
    "engine",
    "errors",
    "evaluation",
    "io",
    "methods",
    "runtime",
    "text",
]
