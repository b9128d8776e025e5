"""Committed batches merged into reader-sized parts (pipeline/io/merge.py), without a run: the growing part is
written over until it reaches part_mb, then the next starts; a merge holds one row group at a time; a batch of an
older dynrag (fewer columns) merges with its new columns as null."""

from __future__ import annotations

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_fixtures import fake_row

from pipeline.io import merge
from pipeline.io.merge import PartMerger, merged_keys
from pipeline.io.output import SCHEMA
from pipeline.io.part_store import PartWriteError


def _batch(fs, merger: PartMerger, key: str, ids: range, drop: str | None = None) -> str:
    rows = [fake_row(i, dataset="d", method="m", params={}, f1=1.0, total_s=1.0) for i in ids]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    path = merger.stage_path(key)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as fh:
        pq.write_table(table.drop_columns([drop]) if drop else table, fh)
    return path


def test_batches_merge_into_parts_of_part_mb(tmp_path, monkeypatch):
    monkeypatch.setattr(merge, "ROW_GROUP_ROWS", 7)
    fs = fsspec.filesystem("file")
    merger = PartMerger(fs, str(tmp_path), "r1", part_mb=0.03)
    written: list[str] = []
    for b in range(12):
        path = _batch(fs, merger, f"r1-b{b}", range(20 * b, 20 * b + 20), drop="latency_s" if b == 0 else None)
        if merger.add(path):
            written.append(merger.merge()[1])
    last = merger.merge()  # the close's merge (None when the last add merged)
    parts = sorted({*written, *([last[1]] if last else [])})
    sizes = [fs.size(p) for p in parts]
    assert len(parts) >= 2 and min(sizes[:-1]) >= 0.03 * 2**20, sizes  # every part but the last at least part_mb
    keys = [k for p in parts for k in merged_keys(fs, p)]
    assert keys == [f"r1-b{b}" for b in range(12)]  # each batch in exactly one part, in order
    tables = [pq.read_table(p) for p in parts]
    ids = [q for t in tables for q in t["question_id"].to_pylist()]
    assert ids == [f"q{i}" for i in range(240)]
    assert all(rg <= 7 for p in parts for rg in _row_groups(p))  # one row group in memory at a time
    assert tables[0]["latency_s"][:20].null_count == 20  # the older batch's missing column
    assert not list((tmp_path / "_committed").glob("*.parquet"))


def _row_groups(path: str) -> list[int]:
    f = pq.ParquetFile(path)
    return [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]


def test_a_new_run_removes_the_batches_a_part_holds_and_keeps_the_others(tmp_path):
    fs = fsspec.filesystem("file")
    first = PartMerger(fs, str(tmp_path), "r1", part_mb=128)
    for b in range(3):
        first.add(_batch(fs, first, f"r1-b{b}", range(10 * b, 10 * b + 10)))
    _, part = first.merge()
    # killed before removing the merged batches: two are still there, and one committed after the merge
    for b in (0, 1):
        _batch(fs, first, f"r1-b{b}", range(10 * b, 10 * b + 10))
    left = _batch(fs, first, "r1-b3", range(30, 40))
    again = PartMerger(fs, str(tmp_path), "r2", part_mb=128)
    assert again.recover([part]) == [left]
    assert sorted(p.name for p in (tmp_path / "_committed").iterdir()) == ["part-r1-b3.parquet"]


def test_a_merge_reads_ahead_in_order_and_fails_on_a_read_that_fails_or_hangs(tmp_path, monkeypatch):
    """The merge reads the next row group while it writes this one: the rows come in order, a read's error fails
    the merge (no part written), and a read stuck past READ_S fails it with one line instead of waiting."""
    import threading

    tables = [pa.table({"i": [i]}) for i in range(5)]
    assert [t["i"][0].as_py() for t in merge._read_ahead(iter(tables))] == [0, 1, 2, 3, 4]

    def failing():
        yield tables[0]
        raise OSError("the store said no")

    with pytest.raises(OSError, match="the store said no"):
        list(merge._read_ahead(failing()))

    stuck = threading.Event()

    def hanging():
        yield tables[0]
        stuck.wait(30)

    monkeypatch.setattr(merge, "READ_S", 0.2)
    with pytest.raises(OSError, match=r"the merge waited over 0 s for a row group"):
        list(merge._read_ahead(hanging()))
    stuck.set()

    fs = fsspec.filesystem("file")
    merger = PartMerger(fs, str(tmp_path), "r1", part_mb=1.0)
    merger.add(_batch(fs, merger, "r1-b0", range(10)))
    monkeypatch.setattr(merge, "_conform", lambda table: (_ for _ in ()).throw(ValueError("a bad batch")))
    with pytest.raises(PartWriteError, match="a bad batch"):
        merger.merge()
    assert not fs.exists(f"{tmp_path}/parts") or not fs.ls(f"{tmp_path}/parts")


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_later_merge_adds_its_batches_to_the_growing_part_without_decoding_it(tmp_path, monkeypatch, request, store):
    """The growing part's pages are copied as bytes (parquet_append), not read and written again: a merge costs
    the rows it adds, not the part (a 130 MB part's re-encoding was most of a 10^6-question run's tail). On S3
    (the session's moto server) the part is uploaded whole from a local file."""
    from pipeline.io.parquet_append import footer_of

    if store == "s3":
        fs, bucket = request.getfixturevalue("s3")
        base = f"{bucket}/out"
    else:
        fs, base = fsspec.filesystem("file"), str(tmp_path)
    merger = PartMerger(fs, base, "r1", part_mb=128)
    merger.add(_batch(fs, merger, "r1-b0", range(10)))
    _, part = merger.merge()
    before = fs.cat_file(part)
    decoded: list[str] = []
    real = merge._row_groups
    monkeypatch.setattr(merge, "_row_groups", lambda fs, inputs: (decoded.extend(inputs), real(fs, inputs))[1])
    merger.add(_batch(fs, merger, "r1-b1", range(10, 25)))
    merged, again = merger.merge()
    assert again == part and decoded == [merger.stage_path("r1-b1")]  # the part itself not decoded
    pages_end = footer_of(lambda at, n: before[at : at + n], len(before))[0]
    assert fs.cat_file(part)[:pages_end] == before[:pages_end]
    with fs.open(part, "rb") as fh:
        assert pq.read_table(fh)["question_id"].to_pylist() == [f"q{i}" for i in range(25)]
    assert merged_keys(fs, part) == ["r1-b0", "r1-b1"]
