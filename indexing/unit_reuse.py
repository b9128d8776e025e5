"""An incremental build reads only the work units whose bytes changed; the others are taken as they were.

A version's manifest lists its units in corpus order (`units`: each unit's name, the sha256 of the bytes
its records come from (readers.unit_digest), its shard count (its shards follow in `shards`) and what
reading it counted). `UnitLedger.take` gives this build a unit of the previous version, without reading a
line of it, when

1. it has the same name (path and nominal byte range) and digest (of its bytes, and of the format, field
   names, bad-line rule, passage length and shard size they are read with): the same passages and shards;
2. each of its shards exists under `shards/` with this build's key (same settings and IVF template);
3. the duplicate rule gives it the same passages. A passage whose id an earlier unit holds is dropped
   (passages.py), so a unit's passages also depend on the units before it: they are the same when the unit
   dropped nothing then and none of its ids is held by an earlier unit now, or when every unit before it
   was taken in the same place.

Its shards' ids (`ids.npy`) then join the ids seen, as its passages would have. A unit taken and a unit
read give the same shards, so an incremental build still equals a full one (shards.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from indexing.digests import UNKNOWN, DigestSet
from indexing.passages import PassageStats
from indexing.readers import ReadStats

# what a unit entry counts, and where each count lives during a build
READ_COUNTS = ("records", "bad_lines")
PASSAGE_COUNTS = ("passages", "duplicates", "conflicting_duplicates", "empty")


def counts(read_stats: ReadStats, passage_stats: PassageStats) -> dict[str, int]:
    return {
        **{k: getattr(read_stats, k) for k in READ_COUNTS},
        **{k: getattr(passage_stats, k) for k in PASSAGE_COUNTS},
    }


def unit_entry(name: str, digest: str, shards: int, before: dict[str, int], after: dict[str, int]) -> dict:
    """The manifest's record of a unit read by this build: what it added to each count."""
    return {"unit": name, "sha256": digest, "shards": shards, **{k: after[k] - before[k] for k in before}}


def unit_entry_of(name: str, digest: str, shards: int, read: dict, passages: dict) -> dict:
    """The same record from a unit's own counts (a cluster build's unit task: ReadStats and PassageStats as
    dicts)."""
    return {
        "unit": name,
        "sha256": digest,
        "shards": shards,
        **{k: read[k] for k in READ_COUNTS},
        **{k: passages[k] for k in PASSAGE_COUNTS},
    }


class UnitLedger:
    """The previous version's units, for `take`; `shard_key` gives a shard's key in this build from its
    content hash."""

    def __init__(self, previous: dict, shard_key: Callable[[str], str], shards_dir: Path):
        self.shard_key, self.shards_dir = shard_key, shards_dir
        self.units: dict[str, tuple[int, dict, list[dict]]] = {}  # name -> (position, entry, its shards' metas)
        at = 0
        for i, entry in enumerate(previous.get("units") or []):
            self.units[entry["unit"]] = (i, entry, previous["shards"][at : at + entry["shards"]])
            at += entry["shards"]
        self.in_place = True  # every unit so far taken, each at its previous position

    def take(
        self, position: int, name: str, digest: str, seen: DigestSet, read_stats: ReadStats, passage_stats: PassageStats
    ) -> tuple[dict, list[dict]] | None:
        """The unit's manifest entry and shard metas when it can be taken (module doc), its ids added to
        `seen` and its counts to the stats; None: read it."""
        found = self.units.get(name)
        metas = self._take(position, found, seen) if found is not None and found[1]["sha256"] == digest else None
        self.in_place = self.in_place and metas is not None
        if metas is None or found is None:
            return None
        entry = found[1]
        for k in READ_COUNTS:
            setattr(read_stats, k, getattr(read_stats, k) + entry[k])
        for k in PASSAGE_COUNTS:
            setattr(passage_stats, k, getattr(passage_stats, k) + entry[k])
        return entry, metas

    def _take(self, position: int, found: tuple[int, dict, list[dict]], seen: DigestSet) -> list[dict] | None:
        """The unit's shard metas under this build's keys, its ids added to `seen`; None: it cannot be taken."""
        previous_position, entry, old = found
        metas = [{k: m[k] for k in ("passages", "content_hash", "first_id", "last_id")} for m in old]
        for m in metas:
            m["key"] = self.shard_key(m["content_hash"])
        dirs = [self.shards_dir / m["key"] for m in metas]
        if not all((d / "checksums.json").is_file() for d in dirs):
            return None
        ids = np.sort(np.concatenate([np.load(d / "ids.npy") for d in dirs] or [np.zeros(0)]))
        same_before = self.in_place and previous_position == position
        if not same_before and (entry["duplicates"] or seen.holds_any(ids)):
            return None
        seen.add_sorted(ids.astype(np.uint64), UNKNOWN)
        return metas
