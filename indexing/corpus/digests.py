"""`DigestSet`: a set of 64-bit digests in about 12 bytes each (8 for the digest, 4 for an attached
32-bit value), for checks that must span a whole corpus, such as duplicate passage ids, in bounded
memory: a Python dict spends ~100 bytes an entry, which for 21M passages is more than the corpus
budget itself.

Recent additions sit in a dict; every `run` of them (65,536 by default: ~6 MB of dict) becomes a sorted numpy
run, and runs of similar size are merged (a log-structured merge), so lookups cost a few binary searches, one
numpy call each: with runs of 4,096 they were a third of reading a passage (200k passages: 3.2 s, 2.8 with
65,536). 2^18 gained 0.1 s more, but test_faults_memory's build then grew 32.0 MiB, over its 24 MiB budget. A merge
interleaves two sorted runs by binary search (no argsort, no concatenated copy): its transient memory
is the merged run plus 8 bytes a key of the smaller run.
"""

from __future__ import annotations

import numpy as np

VALUE_MASK = 0xFFFFFFFF  # values are kept to their low 32 bits
UNKNOWN = VALUE_MASK  # the value of keys added without one (`add_sorted` of a reused unit's ids)


class DigestSet:
    def __init__(self, run: int = 1 << 16):
        self._recent: dict[int, int] = {}
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted uint64 keys, uint32 values), largest first
        self._run = run

    def get(self, key: int) -> int | None:
        """The value stored with `key` (its low 32 bits), or None if it was never added."""
        if key in self._recent:
            return self._recent[key]
        k = np.uint64(key)
        for keys, values in self._runs:
            i = int(np.searchsorted(keys, k))
            if i < len(keys) and keys[i] == k:
                return int(values[i])
        return None

    def add(self, key: int, value: int = 0) -> None:
        self._recent[key] = value & VALUE_MASK
        if len(self._recent) >= self._run:
            self._flush()

    def add_sorted(self, keys: np.ndarray, value: int = 0) -> None:
        """Add sorted, distinct uint64 `keys` at once (a shard's `ids.npy`), each with `value`."""
        if len(keys):
            self._runs.append((np.asarray(keys, np.uint64), np.full(len(keys), value & VALUE_MASK, np.uint32)))
            self._settle()

    def holds_any(self, keys: np.ndarray) -> bool:
        """Whether any of the uint64 `keys` was added."""
        keys = np.asarray(keys, np.uint64)
        if self._recent and np.isin(keys, np.fromiter(self._recent, np.uint64, len(self._recent))).any():
            return True
        for run, _ in self._runs:
            at = np.minimum(np.searchsorted(run, keys), len(run) - 1)  # runs are never empty
            if (run[at] == keys).any():
                return True
        return False

    def _flush(self) -> None:
        keys = np.fromiter(self._recent.keys(), dtype=np.uint64, count=len(self._recent))
        values = np.fromiter(self._recent.values(), dtype=np.uint32, count=len(self._recent))
        self._recent = {}
        order = np.argsort(keys)
        self._runs.append((keys[order], values[order]))
        self._settle()

    def _settle(self) -> None:
        """Merge the newest runs while the one before is at most twice as large (runs stay largest first)."""
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            newer, older = self._runs.pop(), self._runs.pop()
            self._runs.append(_merge(older, newer))

    def __len__(self) -> int:
        return len(self._recent) + sum(len(k) for k, _ in self._runs)


def _merge(older: tuple[np.ndarray, np.ndarray], newer: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One sorted run of both; a key in both keeps both entries, the older first (lookups find it)."""
    (ok, ov), (nk, nv) = older, newer
    at = np.searchsorted(ok, nk, side="right") + np.arange(len(nk))  # each newer key's place in the merged run
    keys: np.ndarray = np.empty(len(ok) + len(nk), np.uint64)
    values: np.ndarray = np.empty(len(ok) + len(nk), np.uint32)
    keys[at], values[at] = nk, nv
    rest: np.ndarray = np.ones(len(keys), bool)
    rest[at] = False
    keys[rest], values[rest] = ok, ov
    return keys, values
