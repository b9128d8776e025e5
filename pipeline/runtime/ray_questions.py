"""The questions of an answer job as a Ray Data dataset (`runtime.mode=ray`).

    ds = question_dataset(dataset, cfg, done, limit, batch=256)

The file streams through dynrag's own loader (`load_questions`: every format, fsspec URIs, `dpr:` sets)
and `pending_questions`, exactly as an in-process run reads it: a bad line is the same error row with the
same `dynrag:line-N` id, duplicate ids are found over the whole file, `limit` takes the first `limit`
questions of the file (error rows count, blank lines do not) and the ids in `done` (answered under the
output) are dropped. One read task streams it: a remote file (s3://, gs://, ...) on any worker, a local
file (or `dpr:` set) on the driver's node, where it was found, asking for no CPU there (a large cluster's
head node, where the driver runs, has none, as Ray's docs advise). Ray's
`read_text`/`read_parquet` are not used: `read_text` reads a whole file at once and decodes it as UTF-8 (one bad byte fails
every row), splits lines at other characters than the loader (U+2028, form feeds) and numbers none, and
ids, duplicates and the format are decided in file order anyway, so a file is one sequential read.

Rows: one row a batch, the unit of everything the driver does (DESIGN.md, "The unit of work on a cluster is a
batch"): `qs` (up to `batch` Questions of one run, each as JSON), `skipped` (questions of that run dropped as
answered since its previous batch) and `run` (which of the job's runs it is for: an experiment answers its
runs over one file at once, each with its own answered ids). Each row is a block of its own, so Ray Data
schedules, accounts and keeps stats per batch (10^6 questions in batches of 256: 3,907 blocks, not 10^6), an
engine actor's call is exactly one batch, and its report leaves the actor as soon as the call returns. The
skips after a run's last batch come as a final row with no questions, so the engine actors' reports add up to
the in-process count. The read depends only on the file and `done`, so a retried read task yields the same
rows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Container, Iterator

import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from pipeline.config import DynragConfig
from pipeline.io.id_set import IdSet


def question_dataset(
    source: str, cfg: DynragConfig, done: Container[str] | list[Container[str]], limit: int | None, batch: int
):
    """The pending questions of `source` as a dataset of batches, `qs` / `skipped` / `run` rows (module docstring).
    `done`: the ids answered under the output, or one such set per run (an experiment's runs over one file)."""
    import ray

    src = QuestionSource(source, cfg, done, limit, batch)
    # no CPU asked: one light read that must never wait for CPUs the engine and pool actors hold (a job sized
    # to its cluster, the replicas and pools taking every CPU, deadlocked reading its questions from s3://)
    # every row (a batch) its own block, for this dataset only (its own copy of the context; Ray Data merges a
    # task's output into blocks of up to 128 MiB): an engine actor's bundle is then exactly one batch, a call to
    # each, and each call's report leaves its actor as a block of its own when the call returns, never held back
    # by another batch of the same task (one a drained replica holds, to be answered elsewhere)
    ds = ray.data.read_datasource(src, num_cpus=0, override_num_blocks=1)
    ds.context.target_max_block_size = 1
    return ds


class QuestionSource(Datasource):
    def __init__(
        self, source: str, cfg: DynragConfig, done: Container[str] | list[Container[str]], limit: int | None, batch: int
    ):
        super().__init__()
        self.source, self.cfg_json = source, cfg.model_dump(mode="json")
        # a resumed run's answered ids travel to the read task once, each run's as one buffer (IdSet)
        self.done = [_ids(d) for d in done] if isinstance(done, list) else [_ids(done)]
        self.limit, self.batch = limit, batch

    @property
    def supports_distributed_reads(self) -> bool:
        """False for a local file (or `dpr:` set): Ray then reads it on the driver's node, where it was found."""
        from indexing.versions.remote import is_remote

        return is_remote(self.source)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context=None
    ) -> list[ReadTask]:
        meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=[self.source])
        return [ReadTask(self.read_blocks, meta)]

    def read_blocks(self) -> Iterator[pa.Table]:
        """The file read once; each run's pending questions (those it has not answered) in batches of `batch`, a
        row each with its skips since its previous batch, yielded as it fills; then each run's rest (its last
        questions and skips) as a last row of that run."""
        from pipeline.io.datasets import ANSWERED, load_questions

        cfg = DynragConfig.model_validate(self.cfg_json)
        questions = load_questions(self.source, cfg, answered=AnsweredByAll(self.done))
        skipped, pending = [0] * len(self.done), [list[str]() for _ in self.done]
        try:
            for q in itertools.islice(questions, self.limit):  # (pending_questions' limit; each run's skips below)
                text = None  # serialized once some run has it to answer (a resume skips most questions)
                for run, done in enumerate(self.done):
                    if q is ANSWERED or q.id in done:
                        skipped[run] += 1
                        continue
                    text = text or json.dumps(q.to_dict())
                    pending[run].append(text)
                    if len(pending[run]) == self.batch:
                        yield batch_row(pending[run], skipped[run], run)
                        pending[run], skipped[run] = [], 0
            for run, (qs, n) in enumerate(zip(pending, skipped)):
                if qs or n:
                    yield batch_row(qs, n, run)
        finally:
            questions.close()


class AnsweredByAll:
    """The ids every run has answered: their records need no more reading than their id (load_questions)."""

    def __init__(self, done: list[IdSet]):
        self.done = done

    def __len__(self) -> int:
        return min(len(d) for d in self.done)

    def __contains__(self, qid: object) -> bool:
        return all(qid in d for d in self.done)


def _ids(done: Container[str]) -> IdSet:
    return done if isinstance(done, IdSet) else IdSet(done)


def batch_row(qs: list[str], skipped: int, run: int) -> pa.Table:
    """One batch of a run as the one-row block the engine actors take (module docstring)."""
    return pa.table(
        {
            "qs": pa.array([qs], pa.list_(pa.string())),
            "skipped": pa.array([skipped], pa.int64()),
            "run": pa.array([run], pa.int64()),
        }
    )
