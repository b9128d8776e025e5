"""What a plain Parquet reader sees of an answer job's output: pyarrow.dataset over `<out>/parts/`, no dynrag
reader and no dedup. Every exactly-once assertion counts rows here."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads


def rows_on_disk(out: str | Path, columns: tuple[str, ...] = ("question_id", "error")) -> pa.Table:
    """Every row of `<out>/parts/` as pyarrow.dataset reads the folder (a local path or an fsspec URI)."""
    import fsspec
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, path = fsspec.core.url_to_fs(str(out))
    folder = f"{path.rstrip('/')}/parts"
    if not fs.exists(folder):
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    dataset = pads.dataset(folder, format="parquet", filesystem=PyFileSystem(FSSpecHandler(fs)))
    return dataset.to_table(columns=list(columns))


def assert_each_question_once(out: str | Path, n: int, errors: int = 0) -> pa.Table:
    """`<out>/parts/` holds n rows, n distinct questions, `errors` error rows, and no attempt is left staged."""
    import fsspec

    rows = rows_on_disk(out)
    ids = rows["question_id"].to_pylist()
    assert (len(ids), len(set(ids))) == (n, n), f"{len(ids)} rows on disk for {len(set(ids))} questions (want {n})"
    assert rows["error"].null_count == n - errors, [e for e in rows["error"].to_pylist() if e][:3]
    fs, path = fsspec.core.url_to_fs(str(out))
    fs.invalidate_cache()
    staged = fs.ls(f"{path.rstrip('/')}/_attempts", detail=False) if fs.exists(f"{path.rstrip('/')}/_attempts") else []
    assert not staged, f"attempts left staged: {staged[:3]}"
    return rows


def committed_files(out: str | Path) -> list[str]:
    """The files of rows the driver has committed: parts/ and the batches committed since the last merge
    (`_committed/`, which no reader of parts/ sees; pipeline/io/merge.py merges them at the job's close, or the
    next run does)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(str(out))
    fs.invalidate_cache()
    found = []
    for folder in ("parts", "_committed"):
        where = f"{path.rstrip('/')}/{folder}"
        if fs.exists(where):
            found += [p for p in fs.ls(where, detail=False) if p.endswith(".parquet") and "/." not in p]
    return sorted(found)


def committed_rows(out: str | Path, columns: tuple[str, ...] = ("question_id", "error")) -> pa.Table:
    """Every row of `committed_files(out)` as pyarrow reads them (a job killed between a merge's write and its
    removal of the merged batches shows those batches twice: parts/ alone is what readers count)."""
    import fsspec
    import pyarrow.parquet as pq

    fs, _ = fsspec.core.url_to_fs(str(out))
    tables = [pq.read_table(f, columns=list(columns), filesystem=fs) for f in committed_files(out)]
    return pa.concat_tables(tables) if tables else pa.table({c: pa.array([], pa.string()) for c in columns})
