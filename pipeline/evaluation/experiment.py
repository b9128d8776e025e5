"""An experiment: datasets x methods x a params grid, run through the answer job, then evaluated and reported.

    name: drrag-table5
    limit: 50                          # first N questions of every dataset (omit: all)
    datasets: [hotpotqa, 2wiki]        # kit dev sets, or {name: {file: ..., format: ..., corpus: ..., index: ...}}
    grid: {k: [3, 4, 6]}               # every method that has the param runs once per value
    methods:
      - bm25
      - {method: cfs, params: {classifier: models/drrag-clf}}
      - {method: sr-rag, label: sr-dense, params: {retriever: dense}, grid: {k: [3, 5]}}
    config: {generation: {backend: none}}   # dynrag configuration sections shared by every run
    baseline: bm25-k4                  # run the others are compared with (95% intervals, p); default: the first

Runs go to OUT/<dataset>/<label>[-<param><value>...] (OUT is `out:`, default runs/<name>). Each dataset's
index is OUT/indexes/<dataset> (or `indexes:`), built once from the dataset's corpus, by default its own
dev file's paragraphs. Every run resumes (`run_answer` skips questions that have a row), so a rerun of a
finished experiment answers nothing. One set of backends (model, index, classifier) serves all runs of a
dataset. Paths in `datasets` are relative to paths.data_dir (default ../shared/data, env DYNRAG_DATA).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.config import DynragConfig, config_from_data, with_values
from pipeline.errors import DynragError
from pipeline.evaluation.devsets import DEV_SETS, data_path, ensure_index

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetEntry(_Strict):
    file: str = Field(description="question file, relative to paths.data_dir or absolute")
    format: str | None = Field(None, description="question file format (default: auto)")
    corpus: str | None = Field(None, description="corpus file for the index (default: the question file)")
    corpus_format: str | None = Field(None, description="corpus format for the index build (default: auto)")
    index: str | None = Field(
        None, description="a prebuilt index folder (default: <indexes>/<dataset>, built if absent)"
    )


class MethodRuns(_Strict):
    method: str
    label: str | None = Field(None, description="run folder prefix (default: the method name)")
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="param -> values, one run per combination")


class Experiment(_Strict):
    name: str
    out: str | None = None
    indexes: str | None = None
    limit: int | None = Field(None, ge=1)
    datasets: dict[str, DatasetEntry]
    methods: list[MethodRuns] = Field(min_length=1)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    baseline: str | None = Field(
        None, description="label of the run every other is compared with, per dataset (default: the first run)"
    )

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, data: Any) -> Any:
        """`datasets: [hotpotqa]` names kit dev sets; `methods: [bm25]` names methods with no params."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        ds = data.get("datasets")
        if isinstance(ds, list):
            unknown = [d for d in ds if not isinstance(d, str) or d not in DEV_SETS]
            if unknown:
                raise ValueError(f"unknown dataset {unknown}; kit names: {', '.join(DEV_SETS)} (or give a mapping)")
            data["datasets"] = {d: {"file": DEV_SETS[d][0], "corpus_format": DEV_SETS[d][1]} for d in ds}
        data["methods"] = [{"method": m} if isinstance(m, str) else m for m in data.get("methods") or []]
        return data


def load_experiment(path: str) -> Experiment:
    """The experiment file, validated, every run's method params included (so a typo fails before any run)."""
    from pipeline.methods.registry import get_method

    p = Path(path)
    if not p.is_file():
        raise DynragError(f"experiment file not found: {p}")
    try:
        exp = Experiment.model_validate(yaml.safe_load(p.read_text(encoding="utf-8")) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise DynragError(f"experiment file {p}: {exc}") from None
    labels = []
    for spec in exp.methods:
        for label, params in grid_runs(spec, exp.grid):
            get_method(spec.method).params(params)
            labels.append(label)
    if twice := sorted({lab for lab in labels if labels.count(lab) > 1}):
        raise DynragError(f"experiment file {p}: runs named {twice} more than once (give the methods a `label`)")
    if exp.baseline is not None and exp.baseline not in labels:
        raise DynragError(f"experiment file {p}: baseline {exp.baseline!r} is none of the runs ({', '.join(labels)})")
    return exp


def grid_runs(spec: MethodRuns, shared_grid: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, params) of every run of one method: its params, times its grid and the shared grid's params
    that the method accepts. Labels are `<label>` then `-<param><value>` per grid param (a k grid gives
    `bm25-k3`, as eval-drrag names its runs)."""
    from pipeline.methods.registry import get_method

    accepted = get_method(spec.method).params_model.model_fields
    grid = {**{k: v for k, v in shared_grid.items() if k in accepted}, **spec.grid}
    runs = []
    for values in itertools.product(*grid.values()):
        chosen = dict(zip(grid, values))
        suffix = "".join(f"-{name}{value}" for name, value in chosen.items())
        runs.append(((spec.label or spec.method) + suffix, {**spec.params, **chosen}))
    return runs


@dataclass(frozen=True)
class MethodRun:
    """One run of a method on a dataset: rows under `<out>/<label>`."""

    label: str
    method: str
    params: dict[str, Any]


def run_methods(
    questions: str,
    index: str | None,
    runs: list[MethodRun],
    cfg: DynragConfig,
    out: Path,
    *,
    limit: int | None = None,
    dataset_format: str | None = None,
    each=None,
    backends=None,
) -> list[dict]:
    """The one runner of the experiment grid and the papers' eval jobs: every run answers `questions`
    through the answer job (resumable rows under `<out>/<label>`), all sharing one set of backends (one
    engine, index, classifier: `backends`, or a set made here and closed at the end); returns each run's
    summary with its `label`, in the order of `runs`. With answer.runs=concurrent (the default, in-process)
    the runs are answered together through one engine (`concurrent_runs`); else one after another.
    `each(run, summary)` is called after every run, in order (e.g. to print a table line)."""
    from pipeline.backends import Backends
    from pipeline.methods.registry import all_one_call
    from pipeline.runtime.runners import make_runner

    runner = make_runner(cfg)
    own = backends is None and runner.in_process  # (on Ray each engine actor builds its own)
    backends = Backends(cfg, index, one_call=all_one_call([r.method for r in runs])) if own else backends
    together = len(runs) > 1 and cfg.answer.runs == "concurrent" and not _share_state(runs, cfg, out)

    def one(r: MethodRun, replica=None) -> dict:
        from pipeline.runtime.answer import run_answer

        s = run_answer(
            str(questions),
            str(out / r.label),
            index=index,
            method=r.method,
            limit=limit,
            cfg=with_values(cfg, {"method.params": dict(r.params)}),
            dataset_format=dataset_format,
            backends=backends,
            progress=False,
            replica=replica,
        )
        s["label"] = r.label
        log.info(
            "%s: %d new rows (%d already there), F1 %s, gold-doc recall %s",
            out / r.label,
            s.get("new_rows") or 0,
            s["skipped_already_answered"],
            s["f1"],
            s["support_recall"],
        )
        return s

    summaries = []
    try:
        results = concurrent_runs(runs, one, cfg, runner, backends, out) if together else (one(r) for r in runs)
        for r, s in zip(runs, results):
            summaries.append(s)
            if each is not None:
                each(r, s)
    finally:
        if own:
            backends.close()
    return summaries


def _share_state(runs: list[MethodRun], cfg: DynragConfig, out: Path) -> bool:
    """Whether two runs name one state file (ERM4's reservoir): one job at a time holds it, so they run in turn."""
    from pipeline.methods.registry import get_method

    files = [
        f for r in runs for f in get_method(r.method).params(r.params, cfg).for_output(str(out / r.label)).state_files()
    ]
    if len(files) != len(set(files)):
        log.info("runs share a state file (%s): answered one after another", ", ".join(sorted(set(files))))
        return True
    return False


def concurrent_runs(runs: list[MethodRun], one, cfg: DynragConfig, runner, backends, out: Path) -> Iterator[dict]:
    """`one(run, shared)` for every run at once, each in its own thread, all answered by what the runner shares
    (runners.py: in-process one Replica over `backends`, one engine and admission queue; on Ray one set of
    engine actors): every run's questions in one stream, batched together; yields the summaries in the order of
    `runs`. SIGTERM drains them all (each run raises Interrupted after writing what finished, as alone); a
    failed run's error is raised once the runs before it are yielded."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.engine.drain import Drain
    from pipeline.runtime.signals import stop_on_sigterm

    drain = Drain(cfg.answer.drain_s)
    shared = runner.shared([str(out / r.label) for r in runs], cfg, backends, drain)

    def each(r: MethodRun) -> dict:
        try:
            return one(r, shared)
        finally:  # the runs start together: a run that ended (or had nothing to answer, or failed) is not awaited
            if hasattr(shared, "withdraw"):
                shared.withdraw(str(out / r.label))

    pool = ThreadPoolExecutor(len(runs), thread_name_prefix="dynrag-run")
    try:
        with stop_on_sigterm(drain):
            futures = [pool.submit(each, r) for r in runs]
            for f in futures:
                yield f.result()
    finally:
        shared.close()  # runs still in flight (an error, an interrupt) end with what finished, written
        pool.shutdown(wait=True, cancel_futures=True)


def run_dataset(exp: Experiment, name: str, ds: DatasetEntry, cfg: DynragConfig, out: Path) -> list[dict]:
    """Every run of the grid on one dataset, sharing one set of backends; returns the run summaries."""
    questions = data_path(cfg, ds.file)
    corpus = data_path(cfg, ds.corpus or ds.file)
    index = ds.index or ensure_index(corpus, ds.corpus_format, Path(exp.indexes or out / "indexes") / name, cfg)
    cfg = with_values(cfg, {"dataset.name": cfg.dataset.name or name})  # rows carry the experiment's dataset name
    runs = [
        MethodRun(label, spec.method, params) for spec in exp.methods for label, params in grid_runs(spec, exp.grid)
    ]
    return run_methods(str(questions), index, runs, cfg, out / name, limit=exp.limit, dataset_format=ds.format)


def run_experiment(path: str, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Run (or resume) the experiment file at `path`; returns the output folder, run summaries and report paths."""
    from pipeline.evaluation.comparison import comparisons, markdown, write_comparison
    from pipeline.evaluation.report import write_report
    from pipeline.evaluation.runs import load_runs
    from pipeline.evaluation.table import evaluate

    exp = load_experiment(path)
    cfg = config_from_data(exp.config, [*overrides, "answer.progress=false"])
    out = Path(exp.out or Path("runs") / exp.name)
    summaries = [s for name, ds in exp.datasets.items() for s in run_dataset(exp, name, ds, cfg, out)]
    run_dirs = [s["out"] for s in summaries]
    text, tables = evaluate(run_dirs, str(out))
    baseline = exp.baseline or grid_runs(exp.methods[0], exp.grid)[0][0]
    compared = comparisons(load_runs(run_dirs), baseline)
    text += "\n" + markdown(compared)
    tables += write_comparison(compared, str(out))
    html = write_report(run_dirs, str(out / "report.html"), title=f"experiment {exp.name}", baseline=baseline)
    return {"out": str(out), "summaries": summaries, "table": text, "files": [*tables, html]}
