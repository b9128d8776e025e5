"""The retrieval cache: hits of queries already searched, shared by every run and round on one set of backends.

A query's hits depend on the index version searched, the retriever (bm25, dense, ...), the search settings
(`scope`: the index and retrieval configuration) and k. An entry keeps the hits of the largest k searched so
far; a request for k or fewer takes their first k, as the engine already does when it searches a batch at the
batch's largest k and cuts each question's list to its own k. Least recently used entries go first beyond
`size` queries. Thread-safe: the engine's retrieval lane and other engines' lanes may use it at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class SearchCache:
    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[tuple, tuple[int, list]] = OrderedDict()  # key -> (k searched, hits)
        self._lock = threading.Lock()

    def get(self, scope: Any, retriever: str, query: str, k: int) -> list | None:
        """The first `k` hits of `query`, or None when it was not searched with k or more."""
        key = (scope, retriever, query)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] < k:
                return None
            self._entries.move_to_end(key)
            return list(entry[1][:k])

    def put(self, scope: Any, retriever: str, query: str, k: int, hits: list) -> None:
        if self.size <= 0:
            return
        key = (scope, retriever, query)
        with self._lock:
            old = self._entries.get(key)
            if old is None or old[0] < k:
                self._entries[key] = (k, list(hits))
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
