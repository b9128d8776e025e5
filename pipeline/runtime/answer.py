"""Answer a dataset with a method: the function behind `dynrag answer` and the README demo.

    from pipeline.runtime.answer import run_answer
    summary = run_answer("../shared/data/hotpotqa/dev_400.jsonl", "runs/hotpot-sr", index="indexes/hotpot",
                         method="sr-rag", limit=20)
    summary["em"], summary["f1"], summary["time_per_question_s"]["total"]

Questions already answered under `out` (by id) are skipped, so rerunning after a kill resumes.

The runner is chosen once (runners.py: in this process, or on Ray's engine actors); this driver is the same
for both: it checks the inputs, takes the output's lock, opens the commit of the output (commit.py: the ids a
rerun skips), and commits each batch's staged attempt as its report comes, counting rows, skips and calls,
showing progress; then writes the summary.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sys
import time
import uuid
from typing import Any

from pipeline.config import Dtype, DynragConfig, resolve_dtype, resolved_yaml, run_params, with_values
from pipeline.engine.drain import Drain
from pipeline.errors import DynragError, first_line
from pipeline.io.commit import Committer
from pipeline.io.datasets import AnsweredIds, load_questions, pending_questions
from pipeline.io.output import batch_report, rate, read_json, write_json
from pipeline.io.output_lock import output_lock, state_lock
from pipeline.methods.registry import config_hash, get_method
from pipeline.runtime.gpu_plan import GpuPlanError
from pipeline.runtime.runners import Batches, make_runner
from pipeline.runtime.signals import Interrupted, stop_on_sigterm
from platform_shims.faults import fault_point
from platform_shims.raytools import await_ray_shutdown

log = logging.getLogger(__name__)

RUN_FILE = "run.json"  # the method and settings of the rows under an output folder
# generation settings that change what a method outputs (batching and cache sizes do not)
_OUTPUT_FIELDS = ("model", "backend", "dtype", "temperature", "top_p", "max_new_tokens", "max_model_len", "seed")


def generation_dtype(cfg: DynragConfig) -> Dtype:
    """generation.dtype resolved (resolve_dtype) for where the generator runs: the runner's (runners.py)."""
    g = cfg.generation
    if g.dtype != "auto" or g.backend == "none":
        return resolve_dtype(g.dtype, cuda=False)
    return resolve_dtype(g.dtype, cuda=make_runner(cfg).generator_on_gpu(cfg))


def run_settings(cfg: DynragConfig, params: Any) -> dict[str, Any]:
    """What decides a run's rows: the method, its parameters, and the generation and retrieval settings."""
    return {
        "method": cfg.method.name,
        "params": params.model_dump(mode="json"),
        "generation": {k: getattr(cfg.generation, k) for k in _OUTPUT_FIELDS},
        "retrieval": cfg.retrieval.model_dump(mode="json"),
    }


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    return {
        k2: v2
        for k, v in d.items()
        for k2, v2 in (_flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])
    }


def check_same_run(out: str, settings: dict[str, Any], chash: str) -> dict[str, Any] | None:
    """An output folder holds one method and configuration (RUN_FILE, written by its first run): a
    rerun that differs is refused, naming the settings that differ. Returns the folder's RUN_FILE (None
    for a new output)."""
    saved = read_json(out, RUN_FILE)
    if saved is None or saved["config_hash"] == chash:
        return saved
    old, new = _flat(saved["settings"]), _flat(settings)
    diff = "; ".join(
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)
    )
    raise DynragError(
        f"{out} holds rows of another configuration ({diff or 'config hash ' + saved['config_hash']}); "
        "rerun with its settings, or choose another --out"
    )


def run_answer(
    dataset: str,
    out: str,
    *,
    index: str | None = None,
    method: str | None = None,
    limit: int | None = None,
    cfg: DynragConfig | None = None,
    dataset_format: str | None = None,
    backends: Any = None,
    progress: bool | None = None,
    replica: Any = None,
) -> dict[str, Any]:
    """Answer `dataset` into Parquet rows under `out`; returns the run summary (also in out/summary.json).

    The summary holds rows/answered/errors, mean em/f1/acc/precision/recall, support_recall, calls and
    tokens per question, `time_per_question_s` per stage, wall_time_s and questions_per_s of this run.
    Whole-input faults (dataset, index, model, configuration, an output of another configuration) are
    raised before anything is written. One job at a time per `out` (output_lock.py); SIGTERM
    drains (signals.py: no new question, those in flight finished for up to answer.drain_s and written,
    then Interrupted); a second SIGTERM or Ctrl-C stops after the rows written so far; a rerun answers the rest.
    `replica`: a started shared Replica (replica.py) whose engine answers this run's questions beside other runs'
    (in-process only; `backends` must be its backends); its drain is this run's.
    """
    cfg = cfg or DynragConfig()
    # the run's own copy with what it derives (one dtype for the rows, their config hash and the actors; preflight
    # adds the index's analyzer): a configuration is never changed once made
    given = {"method.name": method, "dataset.format": dataset_format}
    cfg = with_values(cfg, {"generation.dtype": generation_dtype(cfg), **{k: v for k, v in given.items() if v}})
    spec = get_method(cfg.method.name)
    params = spec.params(cfg.method.params, cfg)
    bound = params.for_output(out)  # what the program runs with: the run's own state (ERM4's reservoir)
    runner = make_runner(cfg)
    with contextlib.ExitStack() as stack:
        answered = AnsweredIds()  # the run's answered ids, once its output is open: their records are not parsed
        questions = load_questions(dataset, cfg, answered=answered)
        stack.callback(questions.close)
        first = list(itertools.islice(questions, 1))  # a missing, empty or unreadable dataset fails here
        if not runner.in_process:  # its actors read the dataset themselves (ray_questions.py)
            questions.close()
        if backends is None:
            cfg, backends = preflight(cfg, index, stack)
        settings = run_settings(cfg, params)
        chash = config_hash(*settings.values())
        saved = check_same_run(out, settings, chash)
        stack.enter_context(output_lock(out))
        drain = replica.drain_flag if replica is not None else Drain(cfg.answer.drain_s)
        for path in bound.state_files():
            stack.enter_context(state_lock(path))
        stack.enter_context(stop_on_sigterm(drain))
        todo = itertools.chain(first, questions) if runner.in_process else None
        return _run_answer(
            runner,
            dataset,
            out,
            todo,
            answered,
            index=index,
            spec=spec,
            params=params,
            bound=bound,
            settings=settings,
            chash=chash,
            new_output=saved is None,
            limit=limit,
            cfg=cfg,
            backends=backends,
            progress=progress,
            drain=drain,
            replica=replica,
        )


def preflight(
    cfg: DynragConfig, index: str | None, stack: contextlib.ExitStack, generator: Any = None
) -> tuple[DynragConfig, Any]:
    """Fail at once, before any row is written, on what would otherwise turn every row into an error
    row: an index that cannot be opened and searched (a missing or corrupt file, no published version),
    a missing model. Returns the run's configuration and its backends (closed by `stack`; None in Ray mode,
    where the actors build their own).

    In-process, the check is made on the run's own backends: their retriever is built now and searched
    once, and the run goes on with it (the index is opened once). With Ray, the driver (often a head node
    with no GPU nor disk to spare) reads the index's manifest only (and, for a local folder, each file's
    size under index.verify=size): nothing of the index nor of the model is downloaded onto it; pulling,
    loading and searching the index, and resolving the model, are left to the actors (or the retrieval
    pool), on their own nodes. The
    run's configuration is `cfg` with the index's BM25 analyzer, so that its resolved config holds what search
    used (`cfg` itself is left as it is). `generator`: one already started (the demo starts it while the index
    builds), closed with the backends."""
    from indexing.shards.sparse import index_analyzer

    runner = make_runner(cfg)
    try:
        manifest, retriever = runner.open_index(index, cfg, stack) if index else ({}, None)
        if index:
            analyzer = index_analyzer(manifest["settings"])
            cfg = with_values(
                cfg, {"index.bm25_stemmer": analyzer["stemmer"], "index.bm25_stopwords": analyzer["stopwords"]}
            )
        backends = runner.backends(cfg, retriever, generator, stack)
    except GpuPlanError:
        raise  # its own message: the GPU's parts in GiB
    except Exception as exc:
        raise DynragError(f"cannot use the index {index}: {first_line(exc)}") from exc
    if cfg.generation.backend != "none":
        runner.check_model(cfg)
    return cfg, backends


def _run_answer(
    runner,
    dataset,
    out,
    questions,
    answered,
    *,
    index,
    spec,
    params,
    bound,
    settings,
    chash,
    new_output,
    limit,
    cfg,
    backends,
    progress,
    drain,
    replica=None,
) -> dict[str, Any]:
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    show = cfg.answer.progress if progress is None else progress

    t0 = time.perf_counter()
    committer = Committer(
        out, run_id, cfg.answer.part_mb
    )  # the summary counts the parts at the start and those committed, no listing
    done = committer.open()
    row_args = dict(
        run_id=run_id, method=spec.name, params_json=params.model_dump_json(), chash=chash, model=cfg.generation.model
    )
    # a new folder's configuration, written with its first rows
    saved = {"method": spec.name, "config_hash": chash, "settings": settings}
    header = (
        {RUN_FILE: json.dumps(saved, indent=2, default=str), "config.resolved.yaml": resolved_yaml(cfg)}
        if new_output
        else None
    )

    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=limit, unit="q", desc=f"{spec.name}", dynamic_ncols=True)
    written = skipped = 0
    batch_calls: dict[str, int] = {}
    answered.ids = done  # the dataset's reader parses no answered record from now on
    try:
        counts: dict[str, int] = {}
        pending = None
        if questions is not None:  # streamed by this driver (a runner that reads no dataset itself)
            todo = pending_questions(questions, done, limit, counts)
            head = list(itertools.islice(todo, 1))
            pending = itertools.chain(head, todo) if head else None
        if questions is not None and pending is None:  # nothing to answer: no engine (nor model) starts
            reports: Any = (r for r in [batch_report([], counts["skipped"], {})])
        else:
            job = Batches(dataset, out, index, pending, counts, cfg, spec, bound, row_args, header, done, limit)
            reports = runner.answer(job, backends=backends, drain=drain, replica=replica)
        with contextlib.closing(reports):
            for report in committer.each(reports):  # each batch's attempt committed, another of it dropped
                written += report["rows"]
                skipped += report["skipped"]
                for kind, n in report["calls"].items():
                    batch_calls[kind] = batch_calls.get(kind, 0) + n
                if report["rows"]:
                    fault_point("answer.part_written", until=lambda: drain.requested)
                    if bar is not None:
                        bar.update(report["rows"])
        if drain.requested:  # drained: every finished answer is written; the rest is the rerun's
            raise Interrupted("stopped by SIGTERM")
    except KeyboardInterrupt as stop:
        log.warning(
            "%s: %d rows of this run are under %s; rerun the same command to answer the rest",
            stop or "interrupted",
            written,
            out,
        )
        raise
    finally:
        committer.close(failing=sys.exc_info()[0] is not None)  # a failing job's own error stands
        await_ray_shutdown()  # a local Ray the job started went down meanwhile (ray_runner.py)
        if bar is not None:
            bar.close()
    if skipped:
        log.info("resumed: %d questions already had a row under %s", skipped, out)
    wall = time.perf_counter() - t0
    summary = {
        "run_id": run_id,
        "out": out,
        "dataset": dataset,
        "method": spec.name,
        "method_params": run_params(params.model_dump(mode="json"), cfg.model_dump(mode="json")),
        "config_hash": chash,
        "model": cfg.generation.model,
        "runtime": runner.name,
        "skipped_already_answered": skipped,
        "backend_batch_calls": batch_calls,
        **committer.summary(),  # folded batch by batch as they committed (commit.py): no part read here
        **rate(wall, written),
    }
    write_json(out, "summary.json", summary)
    return summary
