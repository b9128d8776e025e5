"""A set of question ids held as one sorted array of fixed-width bytes: exact membership in O(log n), about
the ids' own length in memory (a Python set of 10^6 ids takes ~100 MB), and shipped to a Ray read task as one
buffer, not a pickled set of objects. What a resumed run skips (commit.py) travels as one."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa


class IdSet:
    def __init__(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray = ()):
        if isinstance(ids, (pa.Array, pa.ChunkedArray)):
            raw = ids.cast(pa.binary()).to_numpy(zero_copy_only=False)
        else:
            raw = np.array([i.encode() for i in ids], dtype=object)
        self.ids = np.unique(raw.astype(bytes)) if len(raw) else np.array([], dtype="S1")

    def __contains__(self, qid: object) -> bool:
        if not isinstance(qid, str) or not len(self.ids):
            return False
        key = qid.encode()
        if len(key) > self.ids.dtype.itemsize or key.endswith(b"\0"):
            return False
        i = int(np.searchsorted(self.ids, key))
        return i < len(self.ids) and self.ids[i] == key

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self):
        return (b.decode() for b in self.ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdSet):
            return bool(np.array_equal(self.ids, other.ids))
        if isinstance(other, (set, frozenset)):
            return len(other) == len(self) and all(q in self for q in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
