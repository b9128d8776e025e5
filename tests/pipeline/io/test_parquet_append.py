"""Rows added to a Parquet file without decoding it (pipeline/io/parquet_append.py): the footer's Thrift codec
gives back the bytes it read, and the appended file reads, with pyarrow and with polars (another reader of
Parquet, in Rust), as the two tables one after the other: values, nulls, nested lists of structs, statistics and
page indexes where their offsets moved."""

from __future__ import annotations

import io

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.parquet_append import appended, decode_footer, encode_footer, footer_of

DOC = pa.struct([("id", pa.string()), ("score", pa.float64()), ("kept", pa.bool_())])
SCHEMA = pa.schema([("qid", pa.string()), ("n", pa.int64()), ("ok", pa.bool_()), ("docs", pa.list_(DOC))])


def _table(start: int, n: int, meta: dict) -> pa.Table:
    rows = [
        {
            "qid": f"q{i}",
            "n": None if i % 7 == 0 else i * 1_000_003,
            "ok": i % 3 == 0,
            "docs": [{"id": f"d{i}-{j}", "score": j / 3, "kept": j % 2 == 0} for j in range(i % 4)],
        }
        for i in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA.with_metadata(meta))


def _file(table: pa.Table, **kw) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=50, **kw)
    return sink.getvalue()


def _footer(data: bytes) -> bytes:
    return footer_of(lambda at, n: data[at : at + n], len(data))[1]


@pytest.mark.parametrize("kw", [{}, {"write_page_index": True, "use_dictionary": False, "compression": "zstd"}])
def test_a_footer_decodes_and_encodes_to_the_same_bytes(kw):
    footer = _footer(_file(_table(0, 120, {"k": "v" * 40}), **kw))
    assert encode_footer(decode_footer(footer)) == footer


@pytest.mark.parametrize("kw", [{}, {"use_dictionary": False, "compression": "zstd"}])
def test_appended_rows_read_as_both_tables_in_order_with_pyarrow_and_polars(tmp_path, kw):
    old, new = _table(0, 130, {"keys": "a"}), _table(130, 75, {"keys": "a,b"})
    old_bytes = _file(old, **kw)
    out = tmp_path / "both.parquet"
    with out.open("wb") as sink:
        added = _file(new, **kw)
        appended(io.BytesIO(old_bytes), len(old_bytes), io.BytesIO(added), len(added), sink)

    whole = out.read_bytes()
    old_end = footer_of(lambda at, n: old_bytes[at : at + n], len(old_bytes))[0]
    assert whole[:old_end] == old_bytes[:old_end]  # the old pages copied as they are
    both = pq.read_table(out)
    assert both.schema.metadata[b"keys"] == b"a,b"  # the new rows' footer's metadata
    assert both.equals(pa.concat_tables([old, new]).replace_schema_metadata(both.schema.metadata))
    meta = pq.read_metadata(out)
    assert meta.num_rows == 205 and [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
        50, 50, 30, 50, 25,
    ]  # fmt: skip
    stats = meta.row_group(3).column(1).statistics  # the new rows' footer's statistics
    assert (stats.min, stats.max) == (130 * 1_000_003, 179 * 1_000_003)
    assert meta.row_group(3).column(1).data_page_offset > old_end  # their pages' offsets moved past the old
    assert pq.ParquetFile(out).read_row_group(4)["qid"].to_pylist() == [f"q{i}" for i in range(180, 205)]
    frame = pl.read_parquet(out)
    assert frame["qid"].to_list() == [f"q{i}" for i in range(205)]
    assert frame["docs"].list.len().sum() == sum(i % 4 for i in range(205))
    assert frame["n"].null_count() == sum(1 for i in range(205) if i % 7 == 0)


def test_rows_of_another_schema_are_refused(tmp_path):
    old_bytes = _file(_table(0, 10, {}))
    other = io.BytesIO()
    pq.write_table(pa.table({"qid": ["x"]}), other)
    with pytest.raises(ValueError, match="another schema"):
        appended(io.BytesIO(old_bytes), len(old_bytes), other, len(other.getvalue()), io.BytesIO())
    indexed = _file(_table(0, 10, {}), write_page_index=True)  # a page index holds offsets this does not move
    with pytest.raises(ValueError, match="page index"):
        appended(io.BytesIO(old_bytes), len(old_bytes), io.BytesIO(indexed), len(indexed), io.BytesIO())
    with pytest.raises(ValueError, match="not a Parquet file"):
        appended(io.BytesIO(b"x" * 20), 20, other, len(other.getvalue()), io.BytesIO())
