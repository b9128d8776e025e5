"""The engine: method programs' requests batched into backend calls, with all accounting."""

# the modules code outside engine/ may import
__all__ = [
    "continuous",
    "core",
    "drain",
    "requests",
    "search_cache",
    "streaming",
]
