"""The method programs, one module per paper, each beside its own math; `registry` names them."""

# the modules code outside methods/ may import
__all__ = [
    "erm4_authors",
    "prompts",
    "registry",
    "reservoir",
    "search_agent",
    "search_o1",
    "search_r1",
]
