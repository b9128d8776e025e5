"""An incremental build reads only the work units whose bytes changed; the others are taken as they were.

A version's manifest lists its units in corpus order (`units`: each unit's name, its digest (the sha256 of
the bytes its records come from, readers.unit_digest, with the format, field names, bad-line rule, passage
length and shard size they are read with), its shard count (its shards follow in `shards`) and what reading
it counted). A unit of this build is taken from the previous version, without reading a line of it, when

1. it has the same name (path and nominal byte range) and digest: the same passages and shards;
2. each of its shards exists under `shards/` with this build's key (same settings and IVF template);
3. the duplicate rule gives it the same passages. A passage whose id an earlier unit holds is dropped, so a
   unit's passages also depend on the units before it: they are the same when the unit dropped nothing then
   and none of its ids is held by an earlier unit now, or when every unit before it was taken in the same
   place.

The scan round checks 1 and 2 on the unit's worker (unit_work.scan_unit) and gives its ids from its shards'
stores; the driver checks 3 after the dedup round (build.py). A unit taken and a unit read give the same
shards, so an incremental build still equals a full one (shards.py).
"""

from __future__ import annotations

from collections.abc import Callable

from indexing.builder.unit_work import PreviousUnit
from indexing.corpus.passages import PassageStats
from indexing.corpus.readers import ReadStats

# what a unit entry counts, and where each count lives during a build
READ_COUNTS = ("records", "bad_lines")
PASSAGE_COUNTS = ("passages", "duplicates", "conflicting_duplicates", "empty")


def unit_entry_of(name: str, digest: str, shards: int, read: dict, passages: dict) -> dict:
    """The manifest's record of a unit read by this build, from its counts (ReadStats, PassageStats as dicts)."""
    return {
        "unit": name,
        "sha256": digest,
        "shards": shards,
        **{k: read[k] for k in READ_COUNTS},
        **{k: passages[k] for k in PASSAGE_COUNTS},
    }


def add_counts(read_stats: ReadStats, passage_stats: PassageStats, counts: dict) -> None:
    """Add a unit's counts (an entry, or a task's) to the build's."""
    for k in READ_COUNTS:
        setattr(read_stats, k, getattr(read_stats, k) + counts[k])
    for k in PASSAGE_COUNTS:
        setattr(passage_stats, k, getattr(passage_stats, k) + counts[k])


def previous_units(previous: dict, shard_key: Callable[[str], str]) -> dict[str, PreviousUnit]:
    """The previous version's units by name, each with its shards' metas under this build's keys."""
    units, at = {}, 0
    for i, entry in enumerate(previous.get("units") or []):
        old = previous["shards"][at : at + entry["shards"]]
        metas = [{k: m[k] for k in ("passages", "content_hash", "first_id", "last_id")} for m in old]
        for m in metas:
            m["key"] = shard_key(m["content_hash"])
        units[entry["unit"]] = PreviousUnit(i, entry, tuple(metas))
        at += entry["shards"]
    return units
