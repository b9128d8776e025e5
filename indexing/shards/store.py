"""A shard's passages on disk, read one hit at a time: nothing of the text stays in memory.

    shards/<key>/passages.arrow   Arrow IPC file (id, title, text), uncompressed, record batches of 64 rows
    shards/<key>/ids.npy          uint64 id hashes (`id_hash`), sorted: row r of the shard has ids[r]
    versions/vN/id_shards/        the version's id hash -> shard map (`write_id_shards`, `IdShards`):
      hashes.npy  shards.npy        every passage's id hash, sorted, and the ordinal of its shard (uint32)

Rows are stored in id-hash order, so `ids.npy` is both the sort key and the row map: an id is found
by a binary search in the memory-mapped array (8 bytes a passage on disk, pages touched on demand),
and FAISS row r of the shard is row r here. A hit's text is read with one `pread` of its 64-row
batch (~40 KB): the page cache may hold it, the process does not.

Shards follow the corpus order, not the hash order, so an id alone does not name its shard: the
version's id map does (12 bytes a passage, memory-mapped, written at publish by merging the shards'
sorted `ids.npy` a hash range at a time). A lookup is one binary search in the map and one in the
shard it names, whatever the number of shards. Two ids of one version may share a 64-bit hash
across shards (about one chance in 10^5 at 21M passages; within a shard `write_store` refuses it):
the map then lists each of their shards, and the stored id tells which row is the one asked for.

Why this store (measured on 100k passages of 100 words, 10k random hits, docs/scale.md): the same
file memory-mapped made every touched page resident (+65 MiB for 67 MB of text); zstd-compressed
batches halve the disk (358 vs 680 bytes a passage) but cost 146 us a hit against 11; Lucene stored
fields through pyserini cost 100-230 us a hit over JNI.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from indexing.corpus.passages import id_hash
from indexing.errors import IndexingError

ROWS_PER_BATCH = 64
ID_MAP_BUCKET = 1 << 20  # passages merged at a time into the version's id map: ~40 MiB of numpy work


def id_hashes(ids: list[str]) -> np.ndarray:
    return np.fromiter((id_hash(i) for i in ids), dtype=np.uint64, count=len(ids))


def write_store(passages: list, shard_dir: Path) -> None:
    """Write `passages` (objects with id, title, text) in id-hash order; `passages.arrow` last, so its
    presence means the store is complete."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    keys = id_hashes([p.id for p in passages])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    same = np.flatnonzero(keys[1:] == keys[:-1])
    if len(same):  # 64-bit hashes: about one chance in 10^10 for a 50k-passage shard
        raise IndexingError(
            f"passage ids {sorted(p.id for p in passages if id_hash(p.id) == keys[same[0]])} share "
            "a 64-bit hash; rename one"
        )
    ps = [passages[i] for i in order]
    table = pa.table({"id": [p.id for p in ps], "title": [p.title for p in ps], "text": [p.text for p in ps]})
    table = table.replace_schema_metadata({"rows_per_batch": str(ROWS_PER_BATCH)})
    save_array(shard_dir / "ids.npy", keys)

    def arrow(f: BinaryIO) -> None:
        with ipc.new_file(f, table.schema) as w:
            w.write_table(table, max_chunksize=ROWS_PER_BATCH)

    _atomic(shard_dir / "passages.arrow", arrow)


def save_array(path: Path, array: np.ndarray) -> None:
    """Write `array` as the .npy file `path` atomically: a reader or a resumed build never sees half of it."""
    _atomic(path, lambda f: np.save(f, array))


def _atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def read_table(shard_dir: Path) -> Any:
    """The whole shard as one Arrow table, memory-mapped (for builds, which read every row anyway)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    return ipc.open_file(pa.memory_map(str(shard_dir / "passages.arrow"))).read_all()


class PassageStore:
    """One shard's store, opened on first use; `find` and `get` are safe to call from several threads."""

    def __init__(self, shard_dir: Path):
        self.dir = shard_dir
        self._keys: Any = None  # the sorted id hashes (memory-mapped) and the Arrow reader, set by _open
        self._reader: Any = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        import pyarrow as pa
        import pyarrow.ipc as ipc

        with self._lock:
            if self._reader is None:
                self._keys = np.load(self.dir / "ids.npy", mmap_mode="r")
                reader = ipc.open_file(pa.OSFile(str(self.dir / "passages.arrow")))  # reads, not a mapping
                self._batch = int(reader.schema.metadata[b"rows_per_batch"])
                self._reader = reader

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Row of each id hash in this shard, or -1."""
        if self._reader is None:
            self._open()
        # an array of positions: numpy's stub takes the scalar overload when the first argument is untyped
        pos: np.ndarray = np.searchsorted(self._keys, hashes)  # type: ignore[assignment]
        ok: np.ndarray = pos < len(self._keys)
        ok[ok] = self._keys[pos[ok]] == hashes[ok]
        return np.where(ok, pos, -1)

    def get(self, row: int) -> tuple[str, str, str]:
        """(id, title, text) of one row."""
        if self._reader is None:
            self._open()
        batch = self._reader.get_batch(row // self._batch)
        i = row % self._batch
        return tuple(batch.column(c)[i].as_py() for c in range(3))


def write_id_shards(shard_dirs: list[Path], out: Path, bucket: int = ID_MAP_BUCKET) -> None:
    """Write the id map of a version whose shards (in order) are `shard_dirs` into the folder `out`:
    hashes.npy (every id hash, sorted; equal hashes in shard order) and shards.npy (each one's shard
    ordinal). The shards' sorted, memory-mapped ids are merged one hash range of about `bucket` passages
    at a time, written as it goes: memory stays ~40 bytes x `bucket` whatever the corpus size."""
    keys = [np.load(d / "ids.npy", mmap_mode="r") for d in shard_dirs]
    total = sum(len(k) for k in keys)
    n_ranges = max(1, -(-total // bucket))
    out.mkdir(parents=True, exist_ok=True)
    cursor = [0] * len(keys)

    def write(f: BinaryIO, dtype: str) -> None:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (total,)}
        )

    with open(out / ".hashes.npy.tmp", "wb") as fh, open(out / ".shards.npy.tmp", "wb") as fs:
        write(fh, "<u8")
        write(fs, "<u4")
        for r in range(n_ranges):
            stop = None if r == n_ranges - 1 else np.uint64(((r + 1) << 64) // n_ranges)
            parts: list[np.ndarray] = []
            owners: list[np.ndarray] = []
            for si, k in enumerate(keys):
                end = len(k) if stop is None else int(np.searchsorted(k, stop))
                parts.append(k[cursor[si] : end])
                owners.append(np.full(end - cursor[si], si, dtype="<u4"))
                cursor[si] = end
            hashes, shards = np.concatenate(parts), np.concatenate(owners)
            order = np.argsort(hashes, kind="stable")
            fh.write(hashes[order].astype("<u8").tobytes())
            fs.write(shards[order].tobytes())
    for name in ("hashes.npy", "shards.npy"):
        os.replace(out / f".{name}.tmp", out / name)


class IdShards:
    """A version's id map (`write_id_shards`), memory-mapped on first use: where to look for an id hash."""

    def __init__(self, folder: Path):
        self.dir = folder
        self._hashes: Any = None
        self._shards: Any = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        with self._lock:
            if self._shards is None:
                self._hashes = np.load(self.dir / "hashes.npy", mmap_mode="r")
                self._shards = np.load(self.dir / "shards.npy", mmap_mode="r")

    def locate(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first, end) positions of each hash's entries: its candidate shards are `shard_at(first..end-1)`
        (none for a hash this version does not hold; one unless ids share a hash)."""
        if self._shards is None:
            self._open()
        first: np.ndarray = np.searchsorted(self._hashes, hashes, side="left")  # type: ignore[assignment]
        end: np.ndarray = np.searchsorted(self._hashes, hashes, side="right")  # type: ignore[assignment]
        return first, end

    def shard_at(self, positions: np.ndarray) -> np.ndarray:
        if self._shards is None:
            self._open()
        return np.asarray(self._shards[positions], dtype=np.int64)


class EveryShard:
    """`IdShards` for a version published without an id map (before it existed): every shard, in order, is
    a candidate for every id (a rebuild adds the map)."""

    def __init__(self, n_shards: int):
        self.n = n_shards

    def locate(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(len(hashes), dtype=np.int64), np.full(len(hashes), self.n, dtype=np.int64)

    def shard_at(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)
