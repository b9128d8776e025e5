"""Vectors given with the corpus (`dynrag index build --vectors FILE`), taken instead of embedding.

The file: a `.npy` array of shape (rows, d), float32 or float16 in C order, or a FAISS Flat index
(IndexFlatIP, IndexFlatL2: its vectors stored as added, row i the i-th). Rows are read with plain reads
at their offset, a bounded span at a time: never the whole file (21M x 768 float32 is 64 GB), nor mapped
into the process (touched pages of a mapping count in the build's resident memory). Other FAISS indexes are
refused: compressed codes give back approximations, an IDMap reorders rows, and asking some of them for
their vectors aborts the process.

Rows and records. Row i belongs to the corpus's i-th record, counted over all sources in the order given,
as the readers yield records (a DPR TSV or JSONL line is one record; a header or a blank line is none).
- A record dropped as a duplicate (its id seen before), or without text, keeps its row, unused.
- A malformed line skipped with --skip-bad-lines keeps its row too (the file was made from the corpus as
  written), so it never shifts the rows after it.
- The counts must match: the file has as many rows as the corpus has records, skipped bad lines included,
  else one error line (which also catches a file made with the bad lines left out). A file too short is
  found at its first missing row, a file too long at the end of stage 1, before any FAISS or Lucene work.
- A record of more than `index.passage_words` words would be split into passages that cannot share one
  vector: refused, naming the record.

Normalisation. The vectors are stored as given by default: inner product is then the model's own score
(DPR ranks by the inner product of unnormalised vectors; e5's vectors are normalised already). Queries are
L2-normalised, which scales all scores of a query alike and changes no ranking. `normalize=True`
L2-normalises the given vectors (a cosine model whose vectors were saved raw).

Shard keys. A shard's content hash folds in a digest of its vectors as stored in the file, so a shard is
reused only with the very vectors it was built from: a changed row rebuilds the shard that holds it, a file
rewritten or appended to with the corpus rebuilds only the shards whose rows changed. Each build reads the
rows of every shard for this: a sequential read of the whole file and its SHA-1 (measured: 0.16-0.2 GB/s in
50k-row shards on 2 cores under a load of 8, warm page cache). The settings record that the vectors were given,
so they never mix with embedded ones (build.py refuses a build without --vectors over such an index).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexing.corpus.passages import Passage, parent_id
from indexing.corpus.readers import ReadStats, Record
from indexing.errors import IndexingError

READ_BYTES = 64 << 20  # the largest span of rows read at once
FAISS_FLAT = (b"IxFI", b"IxF2", b"IxFl")  # the fourcc of IndexFlatIP, IndexFlatL2, IndexFlat (other metrics)


class VectorsError(IndexingError):
    """The vectors file is unreadable or does not fit the corpus or the query model."""


@dataclass(frozen=True)
class VectorFile:
    """Rows of `dim` values of `dtype`, stored contiguously from byte `offset` of the file at `path`."""

    path: str
    rows: int
    dim: int
    dtype: np.dtype
    offset: int

    @classmethod
    def open(cls, path: str | os.PathLike) -> VectorFile:
        p = Path(path)
        try:
            with open(p, "rb") as f:
                head = f.read(64)
            size = p.stat().st_size
        except OSError as exc:
            raise VectorsError(f"vectors {path}: cannot read ({exc.strerror or exc})") from None
        if head.startswith(b"\x93NUMPY"):
            vf = cls._npy(str(p))
        elif head[:4] in FAISS_FLAT and len(head) >= 16:
            vf = cls._faiss_flat(str(p), head, size)
        else:
            raise VectorsError(
                f"vectors {path}: neither a .npy array nor a FAISS Flat index (IndexFlatIP, IndexFlatL2); other "
                "FAISS indexes do not hold their vectors exactly and in row order: export the vectors to .npy"
            )
        if vf.offset + vf.rows * vf.row_bytes > size:
            raise VectorsError(f"vectors {path}: truncated ({size} bytes for {vf.rows} rows of {vf.dim})")
        return vf

    @classmethod
    def _npy(cls, path: str) -> VectorFile:
        try:
            header = np.load(path, mmap_mode="r")  # parses the header; maps, reads no row
        except (OSError, ValueError) as exc:
            raise VectorsError(f"vectors {path}: not a readable .npy array ({exc})") from None
        shape, dtype, offset = header.shape, header.dtype, int(header.offset)
        fortran = header.ndim == 2 and header.shape[1] > 1 and not header.flags.c_contiguous
        del header
        if len(shape) != 2 or shape[1] < 1:
            raise VectorsError(f"vectors {path}: shape {shape}, expected (records, dimension)")
        if dtype.kind != "f" or dtype.itemsize not in (2, 4):
            raise VectorsError(f"vectors {path}: {dtype} values; dynrag takes float32 or float16")
        if fortran:
            raise VectorsError(f"vectors {path}: stored in Fortran order; save it in C order (np.ascontiguousarray)")
        return cls(path, int(shape[0]), int(shape[1]), dtype, offset)

    @classmethod
    def _faiss_flat(cls, path: str, head: bytes, size: int) -> VectorFile:
        """faiss write_index of an IndexFlat: fourcc, d (int32), ntotal (int64), the rest of the header,
        then the codes as a length (uint64, in floats) and ntotal x d float32 values, ending the file."""
        dim = int.from_bytes(head[4:8], "little", signed=True)
        rows = int.from_bytes(head[8:16], "little", signed=True)
        offset = size - rows * max(dim, 0) * 4
        ok = dim > 0 and rows >= 0 and offset >= 16 + 8
        if ok:
            with open(path, "rb") as f:
                f.seek(offset - 8)
                ok = int.from_bytes(f.read(8), "little") == rows * dim
        if not ok:
            raise VectorsError(f"vectors {path}: not a well-formed FAISS Flat index (header d={dim}, ntotal={rows})")
        return cls(path, rows, dim, np.dtype("<f4"), offset)

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of `rows` (any order), as stored (dtype), reading spans of at most READ_BYTES."""
        out = np.empty((len(rows), self.dim), self.dtype)
        order = np.argsort(rows, kind="stable")
        ranked = rows[order]
        span = max(1, READ_BYTES // self.row_bytes)
        with open(self.path, "rb") as f:
            i = 0
            while i < len(ranked):
                start = int(ranked[i])
                j = int(np.searchsorted(ranked, start + span))
                stop = int(ranked[j - 1]) + 1
                f.seek(self.offset + start * self.row_bytes)
                block = np.fromfile(f, self.dtype, count=(stop - start) * self.dim).reshape(-1, self.dim)
                out[order[i:j]] = block[ranked[i:j] - start]
                i = j
        return out


@dataclass(frozen=True)
class RowPassage(Passage):
    """A passage with the row of the given vectors that belongs to its record."""

    row: int = -1


class GivenVectors:
    """One build's vectors file: numbers the corpus's records, attaches rows to passages, and gives each
    shard its key part and its vectors (see the module doc)."""

    def __init__(self, file: VectorFile, normalize: bool, read_stats: ReadStats, passage_words: int, base: int = 0):
        self.file, self.normalize = file, normalize
        self.read_stats, self.passage_words = read_stats, passage_words
        self.base = base  # the row of the first record numbered here (a work unit's: records and bad lines before it)
        self.records = 0  # yielded so far
        self.row = -1  # the row of the record passages are being cut from
        self.taken = 0  # vectors written for shards this build makes

    def settings(self) -> dict:
        """What the index's settings record (part of the embedding hash, so of every shard key)."""
        return {"given": True, "normalize": self.normalize}

    def describe(self) -> dict:
        f = self.file
        return {"file": f.path, "rows": f.rows, "dim": f.dim, "dtype": str(f.dtype), "taken": self.taken}

    def _count_error(self, records: int) -> VectorsError:
        bad = self.read_stats.bad_lines
        return VectorsError(
            f"vectors {self.file.path} has {self.file.rows} rows, the corpus has {records} records"
            + (f" ({bad} of them bad lines skipped, which keep their rows)" if bad else "")
        )

    def number(self, records: Iterable[Record]) -> Iterator[Record]:
        """`records`, noting each one's row; past the file's last row, count the rest and refuse."""
        it = iter(records)
        for rec in it:
            self.row = self.base + self.records + self.read_stats.bad_lines
            self.records += 1
            if self.row >= self.file.rows:
                rest = sum(1 for _ in it)
                raise self._count_error(self.base + self.records + rest + self.read_stats.bad_lines)
            yield rec

    def attach(self, passages: Iterable[Passage]) -> Iterator[RowPassage]:
        """The passages of `number`'s records with their rows; a record cut into several is refused."""
        last = -1
        for p in passages:
            if self.row == last:
                raise VectorsError(
                    f"corpus record {self.row} (id {parent_id(p.id)!r}) has more than index.passage_words="
                    f"{self.passage_words} words: its passages cannot share its one vector; raise "
                    "index.passage_words (--set index.passage_words=N)"
                )
            last = self.row
            yield RowPassage(p.id, p.title, p.text, self.row)

    def check_count(self) -> None:
        """After the whole corpus: the file must not have more rows than records."""
        if self.records + self.read_stats.bad_lines != self.file.rows:
            raise self._count_error(self.records + self.read_stats.bad_lines)

    def shard(self, content: str, group: list[RowPassage]) -> tuple[str, np.ndarray]:
        """The shard's content hash with the digest of its vectors folded in, and its vectors."""
        raw = self.file.read(np.fromiter((p.row for p in group), np.int64, len(group)))
        digest = hashlib.sha1(raw.data, usedforsecurity=False).hexdigest()  # SHA-NI: ~2x blake2b's speed
        return hashlib.sha256(f"{content}:vectors:{digest}".encode()).hexdigest(), raw

    def as_stored(self, raw: np.ndarray) -> np.ndarray:
        """Vectors as a shard stores them: float32, L2-normalised with `normalize`."""
        vecs: np.ndarray = raw.astype(np.float32)
        if self.normalize:
            norms = np.linalg.norm(vecs, axis=1, keepdims=True)
            vecs /= np.where(norms > 0, norms, 1)
        return vecs

    def stored(self, rows: list[int]) -> np.ndarray:
        """The vectors of `rows` as a shard stores them (an IVF template's training sample)."""
        return self.as_stored(self.file.read(np.asarray(rows, dtype=np.int64)))

    def save(self, group: list[RowPassage], raw: np.ndarray, stage: Path) -> None:
        """Write a staged shard's `vectors.npy`: in its store's row order (id-hash order, store.py)."""
        from indexing.shards.store import id_hashes, save_array

        save_array(
            stage / "vectors.npy", self.as_stored(raw[np.argsort(id_hashes([p.id for p in group]), kind="stable")])
        )
        self.taken += len(group)
