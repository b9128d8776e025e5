"""Corpus in, indexes out: readers, 100-word passages, shards, FAISS + Lucene, manifests.

    from indexing import build_index, open_index
    report = build_index(["psgs_w100.tsv"], "idx", cfg)          # incremental when idx holds an index
    index = open_index("idx", cfg)                               # a consistent view of the published version
    index.search(["who wrote Hamlet?"], k=10, retriever="bm25")  # -> list[list[Hit]]; or retriever="dense"
    index.passages(["123"]); index.info()
"""

from indexing.hits import Hit


def build_index(*args, **kwargs):
    from indexing.build import build_index as _build

    return _build(*args, **kwargs)


def open_index(*args, **kwargs):
    from indexing.index import open_index as _open

    return _open(*args, **kwargs)


build_index.__doc__ = "See indexing.build.build_index."
open_index.__doc__ = "See indexing.index.open_index."

__all__ = ["Hit", "build_index", "open_index"]
