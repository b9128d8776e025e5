"""The data kit's multi-hop dev sets and the per-dataset indexes the evaluation jobs and experiments use.

Each dev set's own context paragraphs form its corpus (the setting PAIRS calls "their original corpus";
the papers' Wikipedia is not in the kit). An index is built once under INDEXES/<dataset> and reused.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import DynragConfig
from pipeline.errors import DynragError

log = logging.getLogger(__name__)

# name -> (dev file under paths.data_dir, corpus reader format)
DEV_SETS = {
    "hotpotqa": ("hotpotqa/dev_400.jsonl", "hotpotqa"),
    "2wiki": ("2wikimultihopqa/dev_124.jsonl", "2wiki"),
    "musique": ("musique/dev_150.jsonl", "musique"),
}


def data_path(cfg: DynragConfig, rel: str) -> Path:
    """A file relative to paths.data_dir (or absolute) that must exist."""
    path = Path(rel) if Path(rel).is_absolute() else Path(cfg.paths.data_dir) / rel
    if not path.is_file():
        raise DynragError(f"{path} not found (paths.data_dir={cfg.paths.data_dir}; set DYNRAG_DATA)")
    return path


def ensure_index(corpus: Path, fmt: str | None, index_dir: Path, cfg: DynragConfig) -> str:
    """The index at `index_dir`, built there from `corpus` first if it has no published version."""
    if not (index_dir / "CURRENT").is_file():
        from indexing import build_index

        log.info("building the index %s from %s", index_dir, corpus)
        build_index([str(corpus)], str(index_dir), cfg.index_settings(), fmt=fmt or "auto")
    return str(index_dir)


def dev_file(cfg: DynragConfig, dataset: str) -> Path:
    if dataset not in DEV_SETS:
        raise DynragError(f"unknown dev set {dataset!r}; pick from {', '.join(DEV_SETS)}")
    return data_path(cfg, DEV_SETS[dataset][0])


def dev_index(cfg: DynragConfig, dataset: str, indexes: Path) -> str:
    """The index of the dev set's paragraphs at INDEXES/<dataset>, built first if absent."""
    return ensure_index(dev_file(cfg, dataset), DEV_SETS[dataset][1], indexes / dataset, cfg)
