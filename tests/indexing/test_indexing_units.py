"""Work units (indexing/corpus/readers.py plan_units): large files read as line-aligned byte ranges, and the
in-process build over them (shards restart at each unit; duplicates across units merged as in one read)."""

from __future__ import annotations

import dataclasses
import json
import random
import sys

import pytest

from indexing import build_index, open_index
from indexing.corpus.readers import ReadStats, Unit, plan_units, read_corpus
from indexing.settings import IndexSettings
from indexing.versions.manifest import read_manifest

WORDS = ["alpha", "beta", "gamma", "delta", "épée", "naïve", "北京", "😀", "straße", "x"]


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"r{i}", "title": f"Title {i} é", "text": " ".join(rng.choices(WORDS, k=rng.randint(1, 30)))}
        for i in range(n)
    ]


def write_jsonl(path, records, last_newline: bool = True):
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records) + ("\n" if last_newline else "")
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def read_units(units: list[Unit], fmt: str = "auto") -> list[list]:
    return [list(read_corpus(u, fmt)) for u in units]


def flat(per_unit: list[list]) -> list:
    return [r for unit in per_unit for r in unit]


@pytest.mark.parametrize("every", [1, 8])
@pytest.mark.parametrize("unit_bytes", [7, 64, 333, 1000])
def test_units_cover_every_line_once(tmp_path, unit_bytes, every):
    """Every record once, in order, whatever the unit size; the last line has no newline."""
    path = write_jsonl(tmp_path / "c.jsonl", rows(120), last_newline=False)
    whole = list(read_corpus(path))
    units = [dataclasses.replace(u, anchor_every=every) for u in plan_units([path], unit_bytes=unit_bytes)]
    assert len(units) == -(-len(open(path, "rb").read()) // unit_bytes)
    per_unit = read_units(units)
    assert flat(per_unit) == whole and len(whole) == 120
    assert whole[-1].source_id == "r119"
    if unit_bytes <= 64:
        assert sum(not u for u in per_unit) > 0  # units without an anchor line start read nothing


def test_a_multibyte_character_at_a_boundary(tmp_path):
    data = "".join(json.dumps({"id": str(i), "text": "😀" * 20}, ensure_ascii=False) + "\n" for i in range(6))
    path = tmp_path / "emoji.jsonl"
    path.write_bytes(data.encode("utf-8"))
    raw = path.read_bytes()
    cut = raw.index("😀".encode()) + 2  # inside the 4-byte character
    assert raw[cut] & 0xC0 == 0x80  # a continuation byte
    units = [Unit(str(path), 0, cut), Unit(str(path), cut, None)]
    per_unit = read_units(units)
    assert [len(u) for u in per_unit] == [1, 5]  # the straddled line stays whole in the first unit
    assert flat(per_unit) == list(read_corpus(str(path))) and per_unit[0][0].text == "😀" * 20


def test_tsv_units_take_the_header_of_the_file(tmp_path):
    lines = ["title\tid\ttext"] + [f'T{i}\t{i}\t"passage {i} über"' for i in range(50)]
    path = tmp_path / "psgs.tsv"
    path.write_text("\n".join(lines), encoding="utf-8")  # no final newline
    units = plan_units([str(path)], unit_bytes=100)
    per_unit = read_units(units)
    assert len(units) > 5 and all(per_unit[1:])
    assert flat(per_unit) == list(read_corpus(str(path)))
    assert flat(per_unit)[-1].source_id == "49" and flat(per_unit)[-1].title == "T49"


def test_errors_in_a_later_unit_name_the_byte(tmp_path):
    path = tmp_path / "c.jsonl"
    good = write_jsonl(path, rows(20))
    offset = path.stat().st_size
    with open(path, "a", encoding="utf-8") as f:
        f.write("{broken\n")
    units = plan_units([good], unit_bytes=200)
    with pytest.raises(Exception, match=rf"c\.jsonl:byte {offset}: invalid JSON"):
        read_units(units)
    stats = ReadStats()
    assert len(flat([list(read_corpus(u, on_bad_line="skip", stats=stats)) for u in units])) == 20
    assert stats.skipped == [
        f"{good}:byte {offset}: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
    ]


def test_jsonl_without_ids_stays_without_ids_in_later_units(tmp_path):
    """Whether a generic JSONL file has ids is decided by its first record, for every unit."""
    recs = [{"title": "t", "text": f"no id {i}"} for i in range(10)] + [{"id": "late", "title": "t", "text": "x"}]
    path = write_jsonl(tmp_path / "c.jsonl", recs)
    per_unit = read_units(plan_units([path], unit_bytes=40), "jsonl")
    assert [r.source_id for r in flat(per_unit)] == [None] * 11


def test_compressed_and_json_files_stay_one_unit(tmp_path):
    import gzip

    big = write_jsonl(tmp_path / "c.jsonl", rows(40))
    with gzip.open(tmp_path / "c.jsonl.gz", "wb") as f:
        f.write(open(big, "rb").read())
    (tmp_path / "d.json").write_text(json.dumps([{"title": "a", "text": "b"}] * 40))
    units = plan_units([str(tmp_path / "c.jsonl.gz"), str(tmp_path / "d.json"), big], unit_bytes=500)
    assert [str(u) for u in units[:2]] == [str(tmp_path / "c.jsonl.gz"), str(tmp_path / "d.json")]
    assert len(units) > 4 and str(units[2]) == f"{big}[0:500]"


def test_parquet_units_are_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = rows(100)
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(recs), path, row_group_size=10)
    units = plan_units([str(path)], unit_bytes=600)
    per_unit = read_units(units)
    assert len(units) > 3 and sum(bool(u) for u in per_unit) > 3
    assert flat(per_unit) == list(read_corpus(str(path))) and len(flat(per_unit)) == 100


def test_an_inserted_line_moves_no_later_boundary_with_anchors(tmp_path):
    """Units start at anchor lines: a line inserted near the start of the file leaves the later units'
    lines as they were, while plain line alignment (every line an anchor) moves most boundaries."""
    recs = rows(2000, seed=1)
    path = write_jsonl(tmp_path / "a.jsonl", recs)
    inserted = {"id": "new", "title": "t", "text": "inserted " * 9}
    edited = write_jsonl(tmp_path / "b.jsonl", recs[:3] + [inserted] + recs[3:])

    def unit_ids(p, every):
        units = [dataclasses.replace(u, anchor_every=every) for u in plan_units([p], unit_bytes=10_000)]
        return [[r.source_id for r in u] for u in read_units(units)]

    before, after = unit_ids(path, 32), unit_ids(edited, 32)
    assert len(before) == len(after) > 20 and before[1:] == after[1:]
    assert after[0] == before[0][:3] + ["new"] + before[0][3:]
    plain_before, plain_after = unit_ids(path, 1), unit_ids(edited, 1)
    assert sum(x != y for x, y in zip(plain_before[1:], plain_after[1:])) > len(before) // 2


# ---- the in-process build over units ----


def settings(unit_bytes: int, shard_size: int = 20) -> IndexSettings:
    return IndexSettings(embedding={"model": "hash"}, index={"shard_size": shard_size, "unit_bytes": unit_bytes})


def index_passages(root, ids):
    with open_index(root, settings(0)) as idx:
        return [(h.id, h.title, h.text) if h else None for h in idx.passages(ids)]


def test_build_over_units_holds_the_passages_of_one_unit(tmp_path):
    """One file as 1 unit and as many: the same passages; duplicates across units are merged (the first
    occurrence kept); shards restart at each unit; an edit rebuilds one shard, as a full build makes it."""
    recs = rows(200, seed=2)
    recs[150] = {**recs[10], "text": "a later duplicate id with other text"}
    recs[160] = dict(recs[20])
    recs[100]["text"] = "alpha beta"
    path = write_jsonl(tmp_path / "c.jsonl", recs)
    whole = build_index([path], tmp_path / "whole", settings(0))
    units = build_index([path], tmp_path / "units", settings(4000))
    assert whole["units"] == 1 and units["units"] > 5
    for k in ("passages", "records", "duplicates_merged", "conflicting_duplicates"):
        assert units[k] == whole[k], k
    assert whole["duplicates_merged"] == 2 and whole["conflicting_duplicates"] == 1
    ids = [r["id"] for r in recs]
    assert index_passages(tmp_path / "units", ids) == index_passages(tmp_path / "whole", ids)
    assert index_passages(tmp_path / "units", ["r10"])[0][2] == recs[10]["text"]
    m = read_manifest(tmp_path / "units")
    assert m["build"]["units"] == units["units"] and units["shards"] > whole["shards"]

    recs[100]["text"] = "omega beta"  # the same length: no unit boundary moves (see the test above)
    write_jsonl(tmp_path / "c.jsonl", recs)
    again = build_index([path], tmp_path / "units", settings(4000))
    assert again["shards_built"] == 1 and again["passages_embedded"] == 1
    fresh = build_index([path], tmp_path / "fresh", settings(4000))
    assert [s["key"] for s in read_manifest(tmp_path / "fresh")["shards"]] == [
        s["key"] for s in read_manifest(tmp_path / "units")["shards"]
    ]
    assert fresh["shards_built"] == fresh["shards"]


def test_cluster_dedup_drops_ids_an_earlier_unit_holds():
    """cluster_build's dedup round over one hash range: per unit, the ids an earlier unit holds, with the text
    digest of the first occurrence (the build task compares its own), whatever the order units arrive in."""
    import numpy as np

    from indexing.builder.unit_work import UNREAD_DIGEST, dedup_range

    def pairs(*rows):
        return np.array(rows, dtype=np.uint64).reshape(-1, 2)

    units = [pairs((1, 10), (5, 50)), pairs((1, 10), (3, 30)), pairs(), pairs((1, 11), (3, 30), (7, 70))]
    drops = dedup_range(*units)
    assert [d.tolist() for d in drops] == [[], [[1, 10]], [], [[1, 10], [3, 30]]]
    assert dedup_range(units[3], units[0])[1].tolist() == [[1, 11]]  # the first unit given wins
    # a unit taken unread has no text digests (UNREAD_DIGEST): its ids still drop later ones
    unread = pairs((1, UNREAD_DIGEST), (3, UNREAD_DIGEST))
    assert [d.tolist() for d in dedup_range(unread, units[3])] == [[], [[1, UNREAD_DIGEST], [3, UNREAD_DIGEST]]]
    assert [d.tolist() for d in dedup_range(units[3], unread)] == [[], [[1, 11], [3, 30]]]


def test_unchanged_units_are_taken_unread(tmp_path):
    """A rebuild reads only the units whose bytes changed (unit_reuse.py), and still equals a full build:
    an append re-reads the last unit; an edit that gives an earlier unit an id a later unit holds re-reads
    that later unit too (its passage is now a duplicate), and no other."""
    recs = rows(300, seed=3)
    path = write_jsonl(tmp_path / "c.jsonl", recs)
    first = build_index([path], tmp_path / "index", settings(4000))
    assert first["units"] > 6 and "units_reused" not in first

    def rebuild_and_compare(name: str) -> dict:
        again = build_index([path], tmp_path / "index", settings(4000))
        fresh = build_index([path], tmp_path / name, settings(4000))
        keys = [[s["key"] for s in read_manifest(tmp_path / d)["shards"]] for d in ("index", name)]
        assert keys[0] == keys[1]
        for k in ("passages", "records", "duplicates_merged", "conflicting_duplicates"):
            assert again[k] == fresh[k], k
        ids = [r["id"] for r in recs]
        assert index_passages(tmp_path / "index", ids) == index_passages(tmp_path / name, ids)
        return again

    recs += rows(330, seed=4)[300:]
    write_jsonl(tmp_path / "c.jsonl", recs)
    appended = rebuild_and_compare("fresh-append")
    assert appended["units_reused"] == first["units"] - 1
    # new reading or splitting rules (RULES_VERSION raised): no unit is taken with passages cut by the old ones
    import indexing.builder.local

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexing.builder.local, "RULES_VERSION", indexing.builder.local.RULES_VERSION + 1)
        upgraded = build_index([path], tmp_path / "index", settings(4000))
    assert "units_reused" not in upgraded and upgraded["passages"] == appended["passages"]

    holder = next(
        i
        for i, u in enumerate(plan_units([path], unit_bytes=4000))
        if any(r.source_id == "r290" for r in read_corpus(u))
    )
    recs[150] = {**recs[150], "id": "r290"}  # same length: no boundary moves; r290 is now a duplicate
    write_jsonl(tmp_path / "c.jsonl", recs)
    edited = rebuild_and_compare("fresh-edit")
    assert edited["units_reused"] == edited["units"] - 2 and edited["conflicting_duplicates"] == 1
    assert index_passages(tmp_path / "index", ["r290"])[0][2] == recs[150]["text"]
    assert (
        holder
        > [
            i
            for i, u in enumerate(plan_units([path], unit_bytes=4000))
            if any(r.source_id == "r290" for r in read_corpus(u))
        ][0]
    )


def test_a_unit_task_names_its_host_while_another_thread_is_still_importing_ray(monkeypatch):
    """`dynrag demo` builds its index while a thread imports vLLM, which imports Ray: the build's `node()` saw a
    half-imported `ray` in sys.modules and failed with AttributeError (found by `make demo` in a fresh clone)."""
    import socket
    import types

    from indexing.builder.unit_work import node

    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))  # as sys.modules holds it mid-import
    assert node() == socket.gethostname()
