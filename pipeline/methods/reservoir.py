"""ERM4's Memory Knowledge Reservoir (Sec. 3.3) and Retrieval Trigger (Sec. 3.4).

The reservoir K = {k_1, ..., k_|K|} holds title-content pairs with the embedding of each title. A new
pair is added; a newer pair replaces an older one with the same title. The trigger counts, for a query
q_i, Pop(q_i) = |{k_j in K : S(q_i, title(k_j)) >= tau}| with S the cosine similarity, and answers q_i
from the reservoir when Pop(q_i) >= theta, from the external index otherwise.

Store: one SQLite file (WAL journal). Why SQLite: it is in the standard library, a file survives across
runs, and its write lock serialises writers of several processes (the engine actors of a Ray run on one
machine) so an upsert is one atomic statement under BEGIN IMMEDIATE: no read-modify-write in Python, no
lost update. WAL lets readers go on while one process writes. Similarity is exact numpy (a matrix
product over the title embeddings, re-read only when another connection committed): a reservoir is a
cache of what past questions retrieved (thousands of entries, not millions), and Pop needs an exact
">= tau" count, which FAISS's inner-product range_search does not give (it keeps only scores > radius).
Limit: SQLite's WAL needs every process on one host, so a Ray run keeps its engine actors on the
driver's host (`check_same_host`: an actor elsewhere refuses to start) rather than one file on a network
filesystem. Where a run's reservoir lives, and who may share it: `pipeline.methods.erm4`.

Methods reach it through the engine with `Call(backend="reservoir", op="lookup" | "add", items=[...])`,
batched across questions (`ReservoirBackend`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexing import Hit
from pipeline.backends import register_backend
from pipeline.errors import DynragError


class ReservoirError(DynragError, ValueError):
    """A reservoir file cannot be opened, or an entry does not fit it (wrong embedding size)."""


# -- the trigger (Sec. 3.4), pure functions -------------------------------------------------------------


def popularity(similarities: np.ndarray, tau: float) -> int:
    """Pop(q_i) = |{k_j : S(q_i, title(k_j)) >= tau}| over the similarities of q_i to every title."""
    return int(np.count_nonzero(np.asarray(similarities) >= tau))


def within_boundary(pop: int, theta: int) -> bool:
    """Sec. 3.4: q_i is within the system's knowledge boundary iff Pop(q_i) >= theta."""
    return pop >= theta


# -- the store (Sec. 3.3) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knowledge:
    title: str
    content: str
    embedding: np.ndarray  # of the title, L2-normalised (cosine = inner product)
    source_id: str = ""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS knowledge (
    title TEXT PRIMARY KEY, content TEXT NOT NULL, source_id TEXT NOT NULL, embedding BLOB NOT NULL,
    version INTEGER NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def _unit(vec: Any) -> np.ndarray:
    v = np.asarray(vec, dtype=np.float32).reshape(-1)
    n = float(np.linalg.norm(v))
    if not np.isfinite(n) or n == 0.0:
        raise ReservoirError("a title embedding is zero or not finite")
    return v if abs(n - 1.0) <= 1e-4 else v / n  # already unit vectors (Embed) are kept bit-exact


class Reservoir:
    """A persistent reservoir in one SQLite file; safe to open from several processes at once."""

    def __init__(self, path: str | Path, timeout_s: float = 120.0):
        self.path = Path(path)
        if "://" in str(path):
            raise ReservoirError(f"reservoir {path}: a local file path is needed (SQLite)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.Error as err:
            raise ReservoirError(f"cannot open the reservoir {self.path}: {err}") from None
        self._cache: tuple[int, int, tuple] | None = None  # (data_version, own writes, snapshot)
        self._own_writes = 0

    # -- writing ---------------------------------------------------------------------------------
    def upsert(self, entries: Sequence[Knowledge]) -> int:
        """Add the pairs in one transaction; a pair replaces the entry with its title (later ones win).
        Returns the reservoir's version after the write (it counts every pair ever written)."""
        entries = list(entries)
        if not entries:
            return self.version()
        rows = [(e.title.strip(), e.content, e.source_id or "", _unit(e.embedding)) for e in entries]
        if any(not t for t, *_ in rows):
            raise ReservoirError("a knowledge title is empty")
        self.db.execute("BEGIN IMMEDIATE")  # the write lock first: concurrent writers queue here
        try:
            dim = self._meta("dim")
            for _, _, _, v in rows:
                if dim is None:
                    dim = v.size
                    self.db.execute("INSERT INTO meta(key, value) VALUES ('dim', ?)", (dim,))
                if v.size != dim:
                    raise ReservoirError(f"embedding of size {v.size}; this reservoir holds size {dim}")
            version = self._meta("version") or 0
            now = time.time()
            for title, content, sid, v in rows:
                version += 1
                self.db.execute(
                    "INSERT INTO knowledge(title, content, source_id, embedding, version, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(title) DO UPDATE SET content=excluded.content, "
                    "source_id=excluded.source_id, embedding=excluded.embedding, version=excluded.version, "
                    "updated_at=excluded.updated_at",
                    (title, content, sid, v.tobytes(), version, now),
                )
            self.db.execute(
                "INSERT INTO meta(key, value) VALUES ('version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (version,),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self._own_writes += 1
        return version

    # -- reading ---------------------------------------------------------------------------------
    def _meta(self, key: str) -> int | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def version(self) -> int:
        return self._meta("version") or 0

    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM knowledge").fetchone()[0])

    def get(self, title: str) -> tuple[str, str] | None:
        """(content, source_id) of the entry with this title, or None."""
        row = self.db.execute("SELECT content, source_id FROM knowledge WHERE title = ?", (title.strip(),)).fetchone()
        return None if row is None else (row[0], row[1])

    def _snapshot(self) -> tuple[list[str], list[str], list[str], np.ndarray]:
        """(titles, contents, source ids, title matrix), re-read only after a commit by anyone."""
        dv = int(self.db.execute("PRAGMA data_version").fetchone()[0])  # changes on others' commits
        if self._cache is None or self._cache[:2] != (dv, self._own_writes):
            rows = self.db.execute(
                "SELECT title, content, source_id, embedding FROM knowledge ORDER BY title"
            ).fetchall()
            mat = (
                np.stack([np.frombuffer(r[3], dtype=np.float32) for r in rows])
                if rows
                else np.zeros((0, 0), dtype=np.float32)
            )
            self._cache = (
                dv,
                self._own_writes,
                ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], mat),
            )
        return self._cache[2]

    def similarities(self, query_vecs: np.ndarray) -> np.ndarray:
        """S(q_i, title(k_j)) for every query row and entry: shape (queries, |K|)."""
        titles, _, _, mat = self._snapshot()
        q = np.atleast_2d(np.asarray(query_vecs, dtype=np.float32))
        if not titles:
            return np.zeros((q.shape[0], 0), dtype=np.float32)
        if q.shape[1] != mat.shape[1]:
            raise ReservoirError(f"query embedding of size {q.shape[1]}; this reservoir holds size {mat.shape[1]}")
        return q @ mat.T

    def lookup(self, query_vec: np.ndarray, tau: float, limit: int | None = None) -> tuple[int, list[Hit]]:
        """(Pop(q), the entries with S >= tau, most similar first, at most `limit`)."""
        titles, contents, ids, _ = self._snapshot()
        sims = self.similarities(_unit(query_vec))[0]
        pop = popularity(sims, tau)
        order = [j for j in np.argsort(-sims, kind="stable") if sims[j] >= tau][:limit]
        return pop, [Hit(ids[j] or f"memory:{titles[j]}", titles[j], contents[j], float(sims[j])) for j in order]

    def close(self) -> None:
        self.db.close()


RUN_RESERVOIR = "erm4-reservoir.sqlite"


def run_reservoir_path(out: str) -> str:
    """A run's own reservoir: a file in its (local) output folder, so a resume of the run keeps it."""
    return os.path.abspath(os.path.join(out, RUN_RESERVOIR))


@register_backend("reservoir")
class ReservoirBackend:
    """`Call(backend="reservoir", op=..., items=[...])`: one call serves every waiting question.

    - `lookup`: items {"store": path|None, "vector": title-space query embedding, "tau": float,
      "limit": int|None} -> {"pop": Pop(q), "hits": [Hit, ...]} each
    - `add`: items {"store", "title", "content", "id", "vector"} -> the reservoir version after the write;
      one transaction per store for the whole batch
    `store` is the bound parameters' path (Erm4Params.for_output: the run's own, or a named shared one).
    """

    def __init__(self, cfg, backends=None):
        self.cfg = cfg
        self._stores: dict[str, Reservoir] = {}

    def store(self, path: str | None) -> Reservoir:
        if not path:
            raise ReservoirError("no reservoir named: ERM4's parameters are bound to a run by run_answer (for_output)")
        key = str(Path(path).resolve())
        if key not in self._stores:
            self._stores[key] = Reservoir(key)
        return self._stores[key]

    def lookup(self, items: list[dict]) -> list[dict]:
        out = []
        for it in items:
            pop, hits = self.store(it.get("store")).lookup(it["vector"], float(it["tau"]), it.get("limit"))
            out.append({"pop": pop, "hits": hits})
        return out

    def add(self, items: list[dict]) -> list[int]:
        by_store: dict[str | None, list[int]] = {}
        for i, it in enumerate(items):
            by_store.setdefault(it.get("store"), []).append(i)
        result = [0] * len(items)
        for path, idx in by_store.items():
            version = self.store(path).upsert(
                [
                    Knowledge(items[i]["title"], items[i]["content"], items[i]["vector"], items[i].get("id", ""))
                    for i in idx
                ]
            )
            for i in idx:
                result[i] = version
        return result

    def close(self) -> None:
        for s in self._stores.values():
            s.close()
        self._stores.clear()
