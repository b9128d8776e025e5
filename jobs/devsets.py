"""The data kit's multi-hop dev sets and their per-dataset indexes, shared by the paper evaluation jobs.

Each dev set's own context paragraphs form its corpus (the papers retrieve from Wikipedia; the kit's dev
files carry the paragraphs their questions need plus distractors). The index is built once under
INDEXES/<dataset> and reused by every later run.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.errors import DynragError

log = logging.getLogger(__name__)

# name -> (dev file under paths.data_dir, corpus reader format)
DEV_SETS = {"hotpotqa": ("hotpotqa/dev_400.jsonl", "hotpotqa"),
            "2wiki": ("2wikimultihopqa/dev_124.jsonl", "2wiki"),
            "musique": ("musique/dev_150.jsonl", "musique")}


def csv_choice(text: str, known) -> list[str]:
    """A comma-separated command-line list, checked against `known` (None: anything)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if known is not None and t not in known]
    if bad or not items:
        raise DynragError(f"unknown or empty choice {bad or text!r}" + (f"; pick from {', '.join(known)}" if known else ""))
    return items


def dev_file(cfg, dataset: str) -> Path:
    if dataset not in DEV_SETS:
        raise DynragError(f"unknown dev set {dataset!r}; pick from {', '.join(DEV_SETS)}")
    path = Path(cfg.paths.data_dir) / DEV_SETS[dataset][0]
    if not path.is_file():
        raise DynragError(f"{path} not found (paths.data_dir={cfg.paths.data_dir}; set DYNRAG_DATA)")
    return path


def dev_index(cfg, dataset: str, indexes: Path) -> str:
    """The index of the dev set's paragraphs at INDEXES/<dataset>, built there first if it is not yet."""
    index_dir = indexes / dataset
    if (index_dir / "CURRENT").is_file():
        return str(index_dir)
    from indexing import build_index

    source = dev_file(cfg, dataset)
    log.info("building the %s corpus index at %s from %s", dataset, index_dir, source)
    build_index([str(source)], str(index_dir), cfg, fmt=DEV_SETS[dataset][1])
    return str(index_dir)
