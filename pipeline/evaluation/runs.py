"""Finished runs on disk: find the answer job's output folders and summarize each one.

A run folder is what `dynrag answer --out DIR` (or `run_answer`) writes: `DIR/parts/*.parquet` and
`DIR/config.resolved.yaml`. Given any folders, `load_runs` finds the run folders at or below them
(e.g. `runs/drrag-table5` holds `<dataset>/<method>-k<k>` runs) and summarizes each with
`pipeline.io.output.summarize`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import run_params
from pipeline.errors import DynragError
from pipeline.io.output import part_files, read_rows, summarize


@dataclass
class Run:
    path: str
    label: str  # the run's folder name (e.g. "cfs-k4"), unique within its dataset
    dataset: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)  # method params, k resolved from the config
    summary: dict[str, Any] = field(default_factory=dict)  # answer metrics None when nothing generated


ANSWER_METRICS = ("em", "f1", "acc", "precision", "recall")


def extra_summary(run_dir: str, keys: list[str]) -> dict[str, Any]:
    """Per key of the methods' own `extra` fields, over the run's error-free rows: the mean of a count
    (DRAGIN's generated tokens, ERM4's knowledge counts), the first value of a label (DRAGIN's
    entropy kind); None where no row has the key."""
    values: dict[str, list] = {k: [] for k in keys}
    for r in read_rows(run_dir, ["extra", "error"]).to_pylist():
        if r["error"] is None and r["extra"]:
            extra = json.loads(r["extra"])
            for k in keys:
                if extra.get(k) is not None:
                    values[k].append(extra[k])
    numeric = lambda v: all(isinstance(x, (int, float)) for x in v)  # noqa: E731  (bool is an int)
    return {k: (sum(v) / len(v) if numeric(v) else v[0]) if v else None for k, v in values.items()}


def natural_key(path: str) -> list:
    """Sort key that orders numbers by value: bm25-k3 < bm25-k4 < bm25-k10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def find_run_folders(root: str) -> list[str]:
    """`root` itself when it holds parts, else every folder below it (local paths) that does."""
    if part_files(root):
        return [root]
    if "://" in root:
        raise DynragError(f"{root}: no parts/*.parquet there (give the run folder itself for remote paths)")
    base = Path(root)
    if not base.is_dir():
        raise DynragError(f"{root}: no such folder")
    found = sorted(
        (str(p.parent) for p in base.rglob("parts") if p.is_dir() and part_files(str(p.parent))), key=natural_key
    )
    if not found:
        raise DynragError(f"{root}: no runs found (no parts/*.parquet at or below it)")
    return found


def resolved_config(run_dir: str) -> dict[str, Any]:
    """The run's saved `config.resolved.yaml` as a dict ({} when absent)."""
    import fsspec
    import yaml

    path = f"{run_dir.rstrip('/')}/config.resolved.yaml"
    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return {}
    with fs.open(p, "r") as fh:
        return yaml.safe_load(fh) or {}


def load_run(path: str, label: str | None = None) -> Run:
    first = read_rows(path, ["dataset", "method", "method_params"]).slice(0, 1).to_pylist()
    if not first:
        raise DynragError(f"{path}: the run has no rows")
    r, config = first[0], resolved_config(path)
    summary = summarize(path)
    if config.get("generation", {}).get("backend") == "none":  # empty answers: EM/F1 would read as 0, not unknown
        summary.update(dict.fromkeys(ANSWER_METRICS))
    return Run(
        path=path,
        label=label or Path(path.rstrip("/")).name,
        dataset=r["dataset"],
        method=r["method"],
        params=run_params(r["method_params"], config),
        summary=summary,
    )


def load_runs(roots: list[str]) -> list[Run]:
    """Every run at or below `roots`; labels made unique per dataset by prefixing parent folders."""
    runs = [load_run(p) for root in roots for p in find_run_folders(root)]
    seen: dict[tuple[str, str], int] = {}
    for r in runs:
        seen[(r.dataset, r.label)] = seen.get((r.dataset, r.label), 0) + 1
    for r in runs:
        if seen[(r.dataset, r.label)] > 1:
            r.label = "/".join(Path(r.path).parts[-3:])
    return runs
