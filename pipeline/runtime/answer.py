"""Answer a dataset with a method: the function behind `dynrag answer` and the README demo.

    from pipeline.runtime.answer import run_answer
    summary = run_answer("../shared/data/hotpotqa/dev_400.jsonl", "runs/hotpot-sr", index="indexes/hotpot",
                         method="sr-rag", limit=20)
    summary["em"], summary["f1"], summary["time_per_question_s"]["total"]

Questions already answered under `out` (by id) are skipped, so rerunning after a kill resumes.

In-process the driver reads the questions, runs the engine and writes each batch as a part. With
`runtime.mode=ray` the driver reads only the dataset's first record (to fail fast on a missing or
unreadable file) and the answered ids; the questions stream from the file through Ray Data and the
engine actors write the parts (ray_runner.py); so a Ray rerun with nothing left to answer still starts
Ray and the engine actors (not their models), where in-process nothing starts. Either way the driver
gets one small report per batch (`batch_report`), from which it shows progress and sums the counts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Generator
from typing import Any

from indexing.faults import fault_point
from pipeline.config import Dtype, DynragConfig, resolve_dtype, resolved_yaml, run_params
from pipeline.engine.drain import Drain
from pipeline.errors import DynragError, first_line
from pipeline.io.commit import Committer
from pipeline.io.datasets import load_questions, pending_questions
from pipeline.io.output import PartWriter, batch_report, read_json, summarize, write_json
from pipeline.io.output_lock import output_lock, state_lock
from pipeline.methods.registry import config_hash, get_method
from pipeline.runtime.gpu_plan import GpuPlanError, replica_gpu_plan
from pipeline.runtime.signals import Interrupted, stop_on_sigterm

log = logging.getLogger(__name__)

RUN_FILE = "run.json"  # the method and settings of the rows under an output folder
# generation settings that change what a method outputs (batching and cache sizes do not)
_OUTPUT_FIELDS = ("model", "backend", "dtype", "temperature", "top_p", "max_new_tokens", "max_model_len", "seed")


def generation_dtype(cfg: DynragConfig) -> Dtype:
    """generation.dtype resolved (resolve_dtype) for where the generator runs: with runtime.mode=ray on the
    engine replicas, on a GPU when they ask for one (so a GPU config that ray.gpu_fallback runs on CPU keeps
    bfloat16: give such a run an explicit dtype, as cluster/dynrag-local.yaml does); else in this process."""
    g = cfg.generation
    if g.dtype != "auto" or g.backend == "none":
        return resolve_dtype(g.dtype, cuda=False)
    if cfg.runtime.mode == "ray":
        from pipeline.runtime.ray_resources import replica_gpu_request

        return resolve_dtype(g.dtype, cuda=replica_gpu_request(cfg) > 0)
    from indexing.device import cuda_available

    return resolve_dtype(g.dtype, cuda=cuda_available())


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
    cfg = (cfg or DynragConfig()).model_copy(deep=True)
    cfg.generation.dtype = generation_dtype(cfg)  # the rows, their config hash and the actors see one dtype
    if method:
        cfg.method.name = method
    if dataset_format:
        cfg.dataset.format = dataset_format  # type: ignore[assignment]  # a str, checked on assignment (validate_assignment)
    spec = get_method(cfg.method.name)
    params = spec.params(cfg.method.params, cfg)
    bound = params.for_output(out)  # what the program runs with: the run's own state (ERM4's reservoir)
    with contextlib.ExitStack() as stack:
        questions = load_questions(dataset, cfg)
        stack.callback(questions.close)
        first = list(itertools.islice(questions, 1))  # a missing, empty or unreadable dataset fails here
        if cfg.runtime.mode == "ray":  # the actors read the dataset themselves (ray_questions.py)
            questions.close()
        if backends is None:
            backends = preflight(cfg, index, stack)
        settings = run_settings(cfg, params)
        chash = config_hash(*settings.values())
        saved = check_same_run(out, settings, chash)
        stack.enter_context(output_lock(out))
        drain = replica.drain_flag if replica is not None else Drain(cfg.answer.drain_s)
        for path in bound.state_files():
            stack.enter_context(state_lock(path))
        stack.enter_context(stop_on_sigterm(drain))
        todo = None if cfg.runtime.mode == "ray" else itertools.chain(first, questions)
        return _run_answer(
            dataset,
            out,
            todo,
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


def preflight(cfg: DynragConfig, index: str | None, stack: contextlib.ExitStack, generator: Any = None) -> Any:
    """Fail at once, before any row is written, on what would otherwise turn every row into an error
    row: an index that cannot be opened and searched (a missing or corrupt file, no published version),
    a missing model. Returns the run's backends (closed by `stack`; None in Ray mode, where the actors
    build their own).

    In-process, the check is made on the run's own backends: their retriever is built now and searched
    once, and the run goes on with it (the index is opened once). With Ray, the driver (often a head node
    with no GPU nor disk to spare) reads the index's manifest only (and, for a local folder, each file's
    size under index.verify=size): nothing of the index nor of the model is downloaded onto it; pulling,
    loading and searching the index, and resolving the model, are left to the actors (or the retrieval
    pool), on their own nodes. The
    index's BM25 analyzer is written into `cfg`, so the run's resolved config holds what search used.
    `generator`: one already started (the demo starts it while the index builds), closed with the backends."""
    backends = None
    try:
        manifest, retriever = open_run_index(index, cfg, stack) if index else ({}, None)
        if cfg.runtime.mode != "ray":
            from pipeline.backends import Backends

            backends = Backends(cfg, retriever=retriever, generator=generator, methods=[cfg.method.name])
            stack.callback(backends.close)
            plan = replica_gpu_plan(cfg, retriever)  # None without CUDA; refuses a plan that does not fit
            if retriever is not None:
                retriever.place(plan.index if plan else None)
                retriever.search(["preflight"], 1, cfg.retrieval.retriever)
    except GpuPlanError:
        raise  # its own message: the GPU's parts in GiB
    except Exception as exc:
        raise DynragError(f"cannot use the index {index}: {first_line(exc)}") from exc
    if index:
        from indexing.sparse import index_analyzer

        analyzer = index_analyzer(manifest["settings"])  # what BM25 searches with: the run's config records it
        cfg.index.bm25_stemmer, cfg.index.bm25_stopwords = analyzer["stemmer"], analyzer["stopwords"]
    if cfg.generation.backend != "none":
        from pipeline.assets.models import KNOWN_MODELS, ModelNotFound, resolve_model

        name = cfg.generation.model
        if cfg.runtime.mode != "ray":
            resolve_model(name, cfg.paths.cache_dir)
        elif name not in KNOWN_MODELS and not name.startswith((".", "/", "~")) and name.count("/") != 1:
            # Ray: the name's form only; the replicas resolve (download) it on their own nodes
            raise ModelNotFound(f"model {name!r} is not a known model, a folder, nor a hub name of the form org/name")
    return backends


def open_run_index(index: str, cfg: DynragConfig, stack: contextlib.ExitStack) -> tuple[dict, Any]:
    """backends.retrieval.open_run_index, its retriever (if any) closed by `stack`."""
    from pipeline.backends.retrieval import open_run_index as open_index

    manifest, retriever = open_index(index, cfg)
    if retriever is not None:
        stack.callback(retriever.close)
    return manifest, retriever


def _run_answer(
    dataset,
    out,
    questions,
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
    committer = Committer(out, run_id)  # the summary counts the parts at the start and those committed, no listing
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
    try:
        if cfg.runtime.mode == "ray":
            from indexing import pin_index
            from pipeline.runtime.ray_runner import answer_with_ray

            reports = answer_with_ray(
                dataset,
                out,
                cfg,
                pin_index(index) if index else None,  # one version for every replica, whatever is published
                row_args,
                header=header,
                done=done,
                limit=limit,
                params=bound.model_dump(mode="json"),
                drain=drain,
            )
        else:
            counts: dict[str, int] = {}
            todo = pending_questions(questions, done, limit, counts)
            head = list(itertools.islice(todo, 1))  # nothing to answer: no engine (nor model) starts
            if head:
                reports = _answer_local(
                    itertools.chain(head, todo),
                    counts,
                    PartWriter(out, run_id, header),
                    cfg,
                    spec,
                    bound,
                    row_args,
                    backends,
                    drain,
                    replica,
                )
            else:
                reports = (r for r in [batch_report([], counts["skipped"], {})])
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
        committer.close()
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
        "runtime": cfg.runtime.mode,
        "skipped_already_answered": skipped,
        "backend_batch_calls": batch_calls,
        **summarize(out, parts=committer.parts, wall_time_s=wall, new_rows=written),
    }
    write_json(out, "summary.json", summary)
    return summary


def _answer_local(
    todo, counts, writer, cfg, spec, params, row_args, backends, drain, shared=None
) -> Generator[dict[str, Any], None, None]:
    """Answer `todo` (pending_questions, counting into `counts`) through one Replica (replica.py) in batches of
    `answer.batch_questions`, holding as many at once as a Ray engine actor does (`batches_held`), each
    written as one part by `writer`; yields each batch's report as it is written. `backends` stay open
    (their owner closes them); the generation model is loaded first (one error, not one per row).
    `shared`: a started Replica serving other runs too, which answers this run's batches and stays open."""
    import concurrent.futures as cf
    import functools

    from pipeline.runtime.replica import Replica, Run, batches_held

    size = cfg.answer.batch_questions
    replica = shared or Replica(cfg, spec, params, backends, writer, row_args, drain=drain).start()
    answer = functools.partial(replica.answer, run=Run(spec.program, params, writer, row_args))
    held = batches_held(cfg, size)
    pool = cf.ThreadPoolExecutor(held, thread_name_prefix="dynrag-batch")
    reported = 0  # questions skipped as answered, reported so far
    try:
        batches, pending = _batched(todo, size), set[cf.Future]()
        while True:
            while len(pending) < held and not drain.requested:
                batch = next(batches, None)
                if batch is None:
                    break
                pending.add(pool.submit(answer, batch))
            if not pending:
                break
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in done:
                report = future.result()
                report["skipped"], reported = counts["skipped"] - reported, counts["skipped"]
                yield report
        if counts.get("skipped", 0) > reported:
            yield batch_report([], counts["skipped"] - reported, {})
    finally:
        if shared is None:  # (a shared replica's batches in flight finish and are written; its owner closes it)
            replica.close()  # on an interrupt, the batches in flight end with what finished
        pool.shutdown(wait=True, cancel_futures=True)


def _batched(items, n: int):
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch
