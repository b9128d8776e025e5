"""`DigestSet`: a set of 64-bit digests in about 8 bytes each (plus 8 for an attached value), for
checks that must span a whole corpus, such as duplicate passage ids, in bounded memory: a Python
dict spends ~100 bytes an entry, which for 21M passages is more than the corpus budget itself.

Recent additions sit in a small dict; every `run` of them becomes a sorted numpy run, and runs of
similar size are merged (a log-structured merge), so lookups cost a few binary searches.
"""

from __future__ import annotations

import numpy as np


class DigestSet:
    def __init__(self, run: int = 1 << 12):
        self._recent: dict[int, int] = {}
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted keys, values), largest first
        self._run = run

    def get(self, key: int) -> int | None:
        """The value stored with `key`, or None if it was never added."""
        if key in self._recent:
            return self._recent[key]
        k = np.uint64(key)
        for keys, values in self._runs:
            i = int(np.searchsorted(keys, k))
            if i < len(keys) and keys[i] == k:
                return int(values[i])
        return None

    def add(self, key: int, value: int = 0) -> None:
        self._recent[key] = value
        if len(self._recent) >= self._run:
            self._flush()

    def _flush(self) -> None:
        keys = np.fromiter(self._recent.keys(), dtype=np.uint64, count=len(self._recent))
        values = np.fromiter(self._recent.values(), dtype=np.uint64, count=len(self._recent))
        self._recent = {}
        self._runs.append(_sorted(keys, values))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (k1, v1), (k2, v2) = self._runs.pop(), self._runs.pop()
            self._runs.append(_sorted(np.concatenate([k2, k1]), np.concatenate([v2, v1])))

    def __len__(self) -> int:
        return len(self._recent) + sum(len(k) for k, _ in self._runs)


def _sorted(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]
