"""Committed batches merged into part files sized for their readers (`answer.part_mb`, 128 MB by default), as
Spark and Delta size theirs: a 10^6-question run is a few files, not one a batch.

The driver commits a batch by moving its accepted attempt to `<out>/_committed/part-<run id>-<batch key>.parquet`
(a leading _: no reader of parts/ looks there); once a quarter of `part_mb` has been committed (and at the
close), `merge` writes them, after the rows of the run's part still growing, as that part under parts/: one
file written whole over the old one (atomic rename, or one PUT), whose footer names every batch it holds
(`dynrag.batches`). The growing part's pages are copied as bytes, not decoded (parquet_append.py): a merge
costs the rows it adds. Then the merged batches are removed. So parts/ shows each question once at every
moment, and a part grows only while it is below `part_mb`: every part of a run but its last is at least that.

A job killed after writing a part and before removing its batches leaves batches that the part holds: the next
run's `recover` removes them (the footer says which), and merges the others (committed, never merged).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from indexing.shards.native_memory import release_free_memory
from pipeline.io.output import SCHEMA, write_file
from pipeline.io.parquet_append import appended
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)

COMMITTED = "_committed"
BATCHES = b"dynrag.batches"  # a part's footer: the keys of the batches merged into it
MERGE_SHARE = 4  # merge once part_mb / MERGE_SHARE is committed: rows visible every 32 MB at the default
READ_S = 300.0  # the longest a merge waits for one row group of its inputs (a stuck store fails the merge)
ROW_GROUP_ROWS = 16_384  # a merged part's row group (~11 MB of sr-rag rows in Arrow): a merge holds one, not the part


def batch_key_of(path: str) -> str:
    """`<run id>-<batch key>` of a committed batch's file."""
    return path.rsplit("/", 1)[-1].removeprefix("part-").removesuffix(".parquet")


def merged_keys(fs: Any, part: str) -> list[str]:
    """The batches a part's footer says it holds (none for a part written one batch a file)."""
    with fs.open(part, "rb") as fh:
        meta = pq.read_schema(fh).metadata or {}
    return json.loads(meta[BATCHES]) if BATCHES in meta else []


def write_merged(fs: Any, target: str, inputs: list[str], keys: list[str], base: str | None = None) -> None:
    """`inputs` written as the one Parquet file `target` (whole or not at all), row group by row group: a merge
    holds ROW_GROUP_ROWS rows in memory at most, whatever the part's size. Its footer names `keys`. With
    `base` (a part this run wrote), the file is `base`'s pages as they are, then the rows of `inputs`
    (parquet_append: `base` is not decoded, so a merge costs the rows it adds, not the part)."""
    schema = SCHEMA.with_metadata({BATCHES: json.dumps(keys)})

    def encode(sink: Any) -> None:
        held: list[pa.Table] = []
        with pq.ParquetWriter(sink, schema) as writer:
            for table in _read_ahead(_row_groups(fs, inputs)):
                held.append(table)
                if sum(t.num_rows for t in held) >= ROW_GROUP_ROWS:
                    writer.write_table(pa.concat_tables(held), ROW_GROUP_ROWS)
                    held = []
            if held:
                writer.write_table(pa.concat_tables(held), ROW_GROUP_ROWS)

    if base is None:
        write_file(fs, target, encode)
        return
    with tempfile.TemporaryFile(prefix="dynrag-merge-") as added:  # on local disk, not held in memory
        encode(added)
        size = added.tell()

        def write(sink: Any) -> None:
            with fs.open(base, "rb") as old, open(sink, "wb") as out:
                appended(old, fs.size(base), added, size, out)

        write_file(fs, target, write)


def _row_groups(fs: Any, inputs: list[str]) -> Iterator[pa.Table]:
    """Each row group of each input, in SCHEMA's columns."""
    for path in inputs:
        with fs.open(path, "rb") as fh:
            f = pq.ParquetFile(fh)
            for i in range(f.num_row_groups):
                yield _conform(f.read_row_group(i, use_threads=False))  # Arrow's threads: 1.5x slower on 2 cores


def _read_ahead(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """`tables`, the next one read in a thread while the caller encodes this one (pyarrow leaves the GIL to both):
    a merge of a 114 MB part took 2.9 s instead of 4.6 on 2 idle cores. One table is read ahead, no more; a read
    that takes over READ_S fails the merge (merged again by the next run, `recover`)."""
    reader = cf.ThreadPoolExecutor(1, thread_name_prefix="dynrag-merge-read")
    try:
        coming = reader.submit(next, tables, None)
        while True:
            try:
                table = coming.result(timeout=READ_S)  # (a read's own error is raised here)
            except cf.TimeoutError:
                raise OSError(
                    f"the merge waited over {READ_S:.0f} s for a row group of its committed batches"
                ) from None
            if table is None:
                return
            coming = reader.submit(next, tables, None)
            yield table
    finally:
        reader.shutdown(wait=False, cancel_futures=True)  # a read still running ends on its own


def _conform(table: pa.Table) -> pa.Table:
    """A row group in SCHEMA's columns (a part of an older dynrag: its newer columns as null)."""
    n = table.num_rows
    columns = [table[f.name] if f.name in table.column_names else pa.nulls(n, f.type) for f in SCHEMA]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


class PartMerger:
    def __init__(self, fs: Any, base: str, run_id: str, part_mb: float):
        self.fs, self.base, self.run_id = fs, base, run_id
        self.part_bytes = max(1, int(part_mb * 2**20))
        self.staged: list[str] = []  # committed batches not yet in a part
        self.staged_bytes = 0
        self.growing: str | None = None  # this run's part, below part_mb: the next merge writes over it
        self.seq = 0

    def stage_path(self, key: str) -> str:
        return f"{self.base}/{COMMITTED}/part-{key}.parquet"

    def recover(self, parts: list[str]) -> list[str]:
        """At the start: an earlier run's committed batches still staged, less those a part holds already (removed
        now); they are merged with this run's first merge."""
        folder = f"{self.base}/{COMMITTED}"
        self.fs.invalidate_cache(folder)
        staged = sorted(self.fs.ls(folder, detail=False)) if self.fs.exists(folder) else []
        staged = [p for p in staged if p.endswith(".parquet") and not p.rsplit("/", 1)[-1].startswith(".")]
        if not staged:
            return []
        held = {k for p in parts for k in merged_keys(self.fs, p)}
        for path in [p for p in staged if batch_key_of(p) in held]:
            self.fs.rm(path)
        self.staged = [p for p in staged if batch_key_of(p) not in held]
        self.staged_bytes = sum(self.fs.size(p) for p in self.staged)
        return self.staged

    def add(self, path: str) -> bool:
        """A batch committed to `path`; whether enough is staged for a merge."""
        self.staged.append(path)
        self.staged_bytes += self.fs.size(path)
        return self.staged_bytes * MERGE_SHARE >= self.part_bytes

    def drop(self, path: str) -> None:
        """A file removed, every row of it superseded: no longer merged, nor merged into."""
        if path in self.staged:
            self.staged.remove(path)
        if path == self.growing:
            self.growing = None

    def merge(self) -> tuple[list[str], str] | None:
        """Merge the staged batches into the run's growing part (module docstring); returns (the files merged,
        the part), or None when nothing is staged."""
        if not self.staged:
            return None
        # a batch another job on this object-store output merged already (it took it for an earlier run's) is
        # gone: its rows are in that job's part
        staged = [p for p in self.staged if self.fs.exists(p)]
        inputs = [*([self.growing] if self.growing else []), *staged]
        keys = (merged_keys(self.fs, self.growing) if self.growing else []) + [batch_key_of(p) for p in staged]
        if not staged:
            self.staged, self.staged_bytes = [], 0
            return None
        target = self.growing or f"{self.base}/parts/part-{self.run_id}-{self.seq:05d}.parquet"
        fault_point("commit.merging")
        write_merged(self.fs, target, staged, keys, base=self.growing)
        release_free_memory()  # the merge's row groups and encoder buffers back to the system, not kept free
        fault_point("commit.merged")
        for path in self.staged:
            self._remove(path)
        merged, self.staged, self.staged_bytes = inputs, [], 0
        if self.fs.size(target) >= self.part_bytes:
            self.growing, self.seq = None, self.seq + 1
        else:
            self.growing = target
        return merged, target

    def _remove(self, path: str) -> None:
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # left staged: the next run's recover removes it (the part's footer names it)
            log.warning("could not remove %s (%s: %s)", path, type(exc).__name__, exc)
