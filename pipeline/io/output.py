"""Per-question output rows and their Parquet part files (the contract with users, DESIGN.md).

Rows live in `<out>/parts/part-*.parquet`, and that folder holds each question once, as any Parquet reader
counts it (pyarrow, polars, DuckDB, Spark). Writers never write there: each write attempt of a batch is
staged under `<out>/_attempts/` (`PartWriter`), and the job's driver commits one attempt per batch into
parts/ and removes the others (commit.py, as Hadoop's and Spark's output committers finish a write). The
output is keyed by question id: `answered_ids(out)` lists the ids already written and a resumed run answers
only the others. `summarize(out, parts=...)` reads the parts a run's driver committed, or all parts. Local paths and fsspec URIs (s3://, gs://) both work.

Time columns: `time_<stage>_s` is the question's share of the batched calls it took part in (its cost;
`time_total_s` their sum), while `latency_s` is its own wall time from its first request to its answer,
queueing behind other questions included (parts written before it existed read it as null).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from indexing.corpus.passages import parent_id
from pipeline.engine.core import STAGES, Outcome, Trace
from pipeline.errors import first_line
from pipeline.io.part_store import (  # noqa: F401  (transient: part of this module's API)
    ATTEMPTS,
    PartWriteError,
    batch_key,
    transient,
    with_retries,
)
from pipeline.text.metrics import answer_metrics, support_recall

log = logging.getLogger(__name__)

DOC = pa.struct(
    [
        ("id", pa.string()),
        ("title", pa.string()),
        ("score", pa.float64()),
        ("rank", pa.int32()),
        ("step", pa.string()),
        ("path", pa.string()),
        ("round", pa.int32()),
        ("kept", pa.bool_()),
        ("at_s", pa.float64()),
    ]
)  # at_s: seconds from the question's first request to this retrieval
GEN = pa.struct([("stage", pa.string()), ("text", pa.string())])

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("dataset", pa.string()),
        ("question_id", pa.string()),
        ("question", pa.string()),
        ("gold_answers", pa.list_(pa.string())),
        ("gold_supporting_titles", pa.list_(pa.string())),
        ("method", pa.string()),
        ("method_params", pa.string()),
        ("config_hash", pa.string()),
        ("model", pa.string()),
        ("prediction", pa.string()),
        ("raw_output", pa.string()),
        ("generations", pa.list_(GEN)),
        ("retrieved", pa.list_(DOC)),
        ("docs_in_prompt", pa.int32()),
        ("passages_in_prompt", pa.int32()),
        ("llm_calls", pa.int32()),
        ("retrieval_calls", pa.int32()),
        ("classifier_calls", pa.int32()),
        ("embedding_calls", pa.int32()),
        ("retrieval_triggered", pa.bool_()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        *[(f"time_{s}_s", pa.float64()) for s in STAGES],
        ("time_total_s", pa.float64()),
        ("latency_s", pa.float64()),
        ("em", pa.float64()),
        ("f1", pa.float64()),
        ("acc", pa.float64()),
        ("precision", pa.float64()),
        ("recall", pa.float64()),
        ("support_recall", pa.float64()),
        ("support_recall_retrieved", pa.float64()),
        ("error", pa.string()),
        ("extra", pa.string()),
        ("finished_at", pa.float64()),  # when the question's program ended (seconds since the epoch)
        ("error_kind", pa.string()),  # "input": the question's own fault, final; "system": a rerun retries the question
        # a prompt did not fit generation.max_model_len and the method went on without it (it answered with what it
        # had, or dropped what its reference drops: the row's extra says which); older parts read it as null
        ("window_full", pa.bool_()),
        ("retrieval_cache_hits", pa.int32()),  # of retrieval_calls, those served by the retrieval cache
        ("cached_prompt_tokens", pa.int64()),  # of prompt_tokens, those served by the generator's prefix cache
    ]
)


def finished_at(t: Trace) -> float:
    """When the question's program ended, in seconds since the epoch (its trace's clock is the engine's,
    perf_counter); now where it never ran (an error row written for it), and never later than now."""
    now = time.time()
    return now if t.finished is None else min(now, now - (time.perf_counter() - t.finished))


def make_row(o: Outcome, *, run_id: str, method: str, params_json: str, chash: str, model: str) -> dict[str, Any]:
    q, a, t = o.question, o.answer, o.trace
    kept_ids = {h.id for h in a.used_docs} if a else set()
    retrieved = [{**d, "kept": d["id"] in kept_ids} for d in t.retrieved]
    prediction = a.prediction if a else ""
    metrics = (
        answer_metrics(prediction, q.answers)
        if a and not o.error
        else dict.fromkeys(("em", "f1", "acc", "precision", "recall"))
    )
    final = [(h.id, h.title) for h in a.used_docs] if a else []
    gold = (q.supporting_titles, q.supporting_ids)
    triggered = a.retrieval_triggered if a and a.retrieval_triggered is not None else t.retrieval_calls > 0
    row = {
        "run_id": run_id,
        "dataset": q.dataset,
        "question_id": q.id,
        "question": q.question,
        "gold_answers": list(q.answers),
        "gold_supporting_titles": list(q.supporting_titles),
        "method": method,
        "method_params": params_json,
        "config_hash": chash,
        "model": model,
        "prediction": prediction,
        "raw_output": a.raw_output if a else "",
        "generations": t.generations,
        "retrieved": retrieved,
        "docs_in_prompt": len({parent_id(pid) for pid, _ in final}),
        "passages_in_prompt": len(final),
        "llm_calls": t.llm_calls,
        "retrieval_calls": t.retrieval_calls,
        "classifier_calls": t.classifier_calls,
        "embedding_calls": t.embedding_calls,
        "retrieval_triggered": bool(triggered),
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        **{f"time_{s}_s": t.time[s] for s in STAGES},
        "time_total_s": sum(t.time.values()),
        "latency_s": t.latency_s,
        **metrics,
        # gold-document recall is defined for rows that retrieved (None otherwise, or without labels)
        "support_recall": support_recall(final, *gold) if a and t.retrieve_rounds else None,
        "support_recall_retrieved": support_recall([(d["id"], d["title"]) for d in t.retrieved], *gold)
        if a and t.retrieve_rounds
        else None,
        "error": o.error,
        "extra": _extra(a, t),
        "finished_at": finished_at(t),
        "error_kind": o.error_kind,
        "window_full": t.window_full > 0,
        "retrieval_cache_hits": t.retrieval_cache_hits,
        "cached_prompt_tokens": t.cached_prompt_tokens,
    }
    return row


def _extra(a, t) -> str | None:
    extra = dict(a.extra) if a and a.extra else {}
    if t.backend_calls:
        extra["backend_calls"] = dict(t.backend_calls)
    if t.look_ahead_searches:  # answer.look_ahead: queries searched ahead, and those the method then asked for
        extra["look_ahead"] = {"searched": t.look_ahead_searches, "used": t.look_ahead_used}
    return json.dumps(extra, default=str) if extra else None


def _fs(out: str):
    import fsspec

    fs, path = fsspec.core.url_to_fs(out)
    return fs, path.rstrip("/")


def _is_local(fs) -> bool:
    proto = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in proto or "local" in proto


def write_part(out: str, rows: list[dict[str, Any]], key: str | None = None) -> str | None:
    """Write rows as the committed part `parts/part-<key>.parquet` (a fresh key when None), atomically; returns its
    path. Only a driver that commits writes here (commit.py; the fixtures of tests and benches too)."""
    if not rows:
        return None
    fs, base = _fs(out)
    name = f"part-{key or time.strftime('%Y%m%d-%H%M%S') + '-' + uuid.uuid4().hex[:8]}.parquet"
    return write_table(fs, f"{base}/parts/{name}", pa.Table.from_pylist(rows, schema=SCHEMA))


def write_table(fs: Any, path: str, table: pa.Table) -> str:
    """Write `table` as the Parquet file `path`, whole or not at all (`write_file`)."""
    return write_file(fs, path, lambda sink: pq.write_table(table, sink))


def write_file(fs: Any, path: str, write: Any) -> str:
    """Write the file `path` with `write(sink)` (`sink`: a local path), whole or not at all: local, a fresh
    temporary file fsynced and renamed into place; an object store, a local temporary file uploaded whole once
    written (one PUT, or a multipart upload that shows nothing until complete; a failed streamed upload could
    leave part of it; nothing held in memory: a 128 MB part in a buffer took twice that). A transient storage
    error is retried (`with_retries`); one that persists is a PartWriteError naming the store and the error."""
    folder = path.rsplit("/", 1)[0]

    def attempt() -> None:
        fs.makedirs(folder, exist_ok=True)
        if _is_local(fs):
            tmp = f"{folder}/.{path.rsplit('/', 1)[1]}.{uuid.uuid4().hex[:8]}.tmp"  # one per writer
            try:
                write(tmp)
                with open(tmp, "rb+") as fh:  # durable before it becomes visible
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:  # a full disk, a bad row, an interrupt: no partial file left behind
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:
            with tempfile.TemporaryDirectory(prefix="dynrag-upload-") as spool:
                local = f"{spool}/{path.rsplit('/', 1)[1]}"
                write(local)
                fs.put_file(local, path)

    try:
        with_retries(f"writing {path}", attempt)
    except Exception as exc:
        raise PartWriteError(f"cannot write {_store(fs, path)}: {first_line(exc)}") from exc
    return path


def _store(fs: Any, path: str) -> str:
    return path if _is_local(fs) else fs.unstrip_protocol(path)


class PartWriter:
    """Writes one run's batches as staged attempts, from the driver (in-process) or from each Ray engine actor.

    Before its first attempt it writes `header` (file name -> text: the settings of a new output folder), so
    a folder holding rows always says which configuration wrote them.

    Each write is a new object `<out>/_attempts/<run id>-<batch key>-<token>.parquet`, where no reader of
    parts/ looks: the driver commits it (commit.py). So an attempt never replaces another, and a zombie writer
    (an engine actor thought dead that finishes late) writes only where nothing reads."""

    def __init__(self, out: str, run_id: str, header: dict[str, str] | None = None):
        self.out, self.run_id, self.header = out, run_id, dict(header or {})

    def write(self, rows: list[dict[str, Any]], batch_ids: list[str] | None = None) -> str | None:
        """Stages `rows` as one attempt of the batch `batch_ids` (its question ids, else the rows' own ids);
        returns its path (None for no rows)."""
        if not rows:
            return None
        fs, base = _fs(self.out)
        for name, text in self.header.items():
            try:
                write_text(self.out, name, text)
            except Exception as exc:
                raise PartWriteError(f"cannot write {_store(fs, base)}/{name}: {first_line(exc)}") from exc
        self.header = {}
        ids = batch_ids if batch_ids is not None else [r["question_id"] for r in rows]
        name = f"{self.run_id}-{batch_key(ids)}-{uuid.uuid4().hex[:8]}.parquet"
        return write_table(fs, f"{base}/{ATTEMPTS}/{name}", pa.Table.from_pylist(rows, schema=SCHEMA))


def batch_report(
    rows: list[dict[str, Any]], skipped: int, calls: dict[str, int], part: str | None = None
) -> dict[str, Any]:
    """What an answer job's driver learns of one written batch: its rows and error rows, the questions
    skipped as already answered since the previous report, the backend calls made (by kind) and, when
    rows were written, `part`: the path of their staged attempt (which the driver commits, commit.py)."""
    from pipeline.io.tally import Tally

    report = {
        "rows": len(rows),
        "errors": sum(r["error"] is not None for r in rows),
        "skipped": skipped,
        "calls": calls,
    }
    if rows:  # the batch's share of the run's summary, which the driver folds as it commits (commit.py)
        report["tally"] = Tally.of_table(pa.Table.from_pylist(rows, schema=SCHEMA)).to_json()
    if part:
        report["part"] = part
    return report


def part_files(out: str) -> list[str]:
    fs, base = _fs(out)
    if not fs.exists(f"{base}/parts"):
        return []
    return sorted(
        p
        for p in fs.ls(f"{base}/parts", detail=False)
        if p.rsplit("/", 1)[-1].startswith("part-") and p.endswith(".parquet")
    )


def read_parts(out: str, columns: list[str] | None = None, parts: list[str] | None = None) -> pa.Table:
    """Every row of the part files `parts` (else all listed now) as stored, one Arrow table: what any Parquet
    reader of parts/ counts."""
    fs, _ = _fs(out)
    files = part_files(out) if parts is None else list(parts)
    tables = [
        t
        for t in (with_retries(f"reading {f}", functools.partial(_read_part, fs, f, columns)) for f in files)
        if t is not None
    ]
    if not tables:
        return SCHEMA.empty_table() if columns is None else pa.schema([SCHEMA.field(c) for c in columns]).empty_table()
    return pa.concat_tables(tables, promote_options="default")  # older parts: newer columns as null


def keep_one(table: pa.Table) -> pa.Table:
    """The rows of `table` (with question_id, finished_at and error) that a question keeps where it has several
    (an output folder written before parts were committed): an answer over an error row, then the last
    finished; `table`'s order otherwise."""
    import polars as pl

    keep = (
        pl.from_arrow(table.select(["question_id", "finished_at", "error"]))
        .with_row_index()
        .with_columns(ok=pl.col("error").is_null())
        .sort(["ok", "finished_at"], maintain_order=True)
        .unique("question_id", keep="last")["index"]
        .sort()
    )
    return table.take(keep.to_arrow())


def read_rows(out: str, columns: list[str] | None = None, parts: list[str] | None = None) -> pa.Table:
    """The rows under `out` (the part files `parts`, else all listed now), one per question id (`keep_one`: the
    driver commits each question once, and a rerun repairs a folder that holds one twice, commit.py)."""
    key = ["question_id", "finished_at", "error"]
    read = None if columns is None else [*columns, *(c for c in key if c not in columns)]
    table = read_parts(out, read, parts)
    return keep_one(table).select(columns or table.column_names)


def _read_part(fs: Any, path: str, columns: list[str] | None) -> pa.Table | None:
    """A part's rows; None for a part that is gone (a rerun's repair removed it since it was listed)."""
    for again in (False, True):
        try:
            with fs.open(path, "rb") as fh:
                return pq.read_table(fh, columns=columns)
        except FileNotFoundError:
            if again or _is_local(fs):
                break
            # a listing of parts/ cached before this part was written hides it (s3fs): look again
            fs.invalidate_cache(path.rsplit("/", 1)[0])
    log.debug("part %s is gone", path)
    return None


def answered_ids(out: str, parts: list[str] | None = None) -> set[str]:
    """Ids that a rerun skips: every row but an error row that is not the question's own (error_kind "system",
    or an error in a part older than error_kind). `parts`: the part files to read (default: a listing now)."""
    rows = read_rows(out, ["question_id", "error", "error_kind"], parts).to_pydict()
    return {q for q, err, kind in zip(*rows.values()) if err is None or kind == "input"}


def summarize(
    out: str, *, parts: list[str] | None = None, wall_time_s: float | None = None, new_rows: int | None = None
) -> dict[str, Any]:
    """The summary of the rows of `parts`, else of every part listed under `out` now, recounted from the rows
    (a run's driver folds the same figures batch by batch instead, commit.py): `Tally.summary`'s figures and
    `duplicate_ids`, rows on disk beyond one a question."""
    from pipeline.io.tally import Tally

    raw = read_parts(out, parts=parts)
    kept = keep_one(raw)
    return {
        **Tally.of_table(kept).summary(),
        "duplicate_ids": raw.num_rows - kept.num_rows,
        **rate(wall_time_s, new_rows),
    }


def rate(wall_time_s: float | None, new_rows: int | None) -> dict[str, Any]:
    """A run's own figures: its wall seconds, the rows it wrote, and its questions per second."""
    if wall_time_s is None:
        return {}
    figures: dict[str, Any] = {"wall_time_s": round(wall_time_s, 2), "new_rows": new_rows}
    if new_rows:
        figures["questions_per_s"] = round(new_rows / wall_time_s, 3)
        figures["wall_s_per_question"] = round(wall_time_s / new_rows, 4)
    return figures


def write_json(out: str, name: str, data: dict) -> str:
    return write_text(out, name, json.dumps(data, indent=2, default=str))


def read_json(out: str, name: str) -> Any:
    """A small JSON file under `out`, or None when there is none."""
    fs, base = _fs(out)
    try:
        with fs.open(f"{base}/{name}", "r") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def write_text(out: str, name: str, text: str) -> str:
    """Write one small file under `out` (a local folder or an fsspec URI); atomic where local, one PUT on
    an object store; retried on a transient storage error (`with_retries`)."""
    fs, base = _fs(out)
    target = f"{base}/{name}"

    def attempt() -> None:
        fs.makedirs(base, exist_ok=True)
        if _is_local(fs):
            tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"  # one per writer: Ray actors write the same header
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, target)
        else:
            fs.pipe_file(target, text.encode("utf-8"))

    with_retries(f"writing {target}", attempt)
    return target
