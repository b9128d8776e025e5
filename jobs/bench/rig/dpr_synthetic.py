"""A DPR-shaped synthetic corpus (`dynrag bench scale --corpus dpr-synthetic`): one TSV as DPR's
psgs_w100.tsv, header `id\\ttext\\ttitle`, ids 1..N, the text quoted as DPR quotes it.

- Text: 100 words a passage, each drawn independently from a Zipf distribution, p(rank r) ~ 1 / r^ZIPF_S
  with ZIPF_S = 1.0 over VOCABULARY = 1,000,000 words. The 33 most frequent words are Lucene's English
  stop words (28% of the words, as "the", "of", "and" in English text); the others are made-up lower-case
  words whose length grows with their rank (3 + 0.3 log2 r letters, at most 12; 5.0 letters a word on
  average by frequency): about 600 bytes of text a passage, 13.6 GB for DPR's 21,015,324 rows (13 GB for DPR's file).
- Titles: 1-3 capitalised vocabulary words (ranks beyond the stop words) per article; an article is
  1-7 consecutive passages (3.5 on average), as DPR cuts articles into 100-word passages.

Generated in blocks of BLOCK rows with numpy (each block seeded by (seed, block number), so the file
does not depend on anything but its parameters), written to a temporary name and renamed; a sidecar
`<file>.params.json` records the parameters and the size, and a file whose sidecar matches is reused.
`append_rows` adds rows N+1.. (another seed) for the incremental-rebuild figure.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np

VOCABULARY = 1_000_000
ZIPF_S = 1.0
WORDS = 100
BLOCK = 10_000
QUANTILES = 1 << 20
FORMAT = 1  # of the generator: a change of the bytes it writes bumps it (sidecars then no longer match)
LUCENE_STOP_WORDS = tuple(  # Lucene's English stop words (Anserini's default set), given ranks 1-33 in this order
    "the of and to in a is was for on as with by that it at be are an this or not but their they these there "
    "then will such no into if".split()
)


def params(rows: int, seed: int = 0) -> dict:
    return {"format": FORMAT, "rows": rows, "seed": seed, "vocabulary": VOCABULARY, "zipf_s": ZIPF_S, "words": WORDS}


class Vocabulary:
    """The words by rank as one byte buffer: word r is buf[start[r] : start[r] + length[r]], followed by a space."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng([seed, 1])
        ranks: np.ndarray = np.arange(1, VOCABULARY + 1, dtype=np.float64)
        lengths: np.ndarray = np.minimum(12, 3 + np.floor(0.3 * np.log2(ranks))).astype(np.int64)
        stop = [w.encode() for w in LUCENE_STOP_WORDS]
        words: list[bytes] = list(stop)
        for n_letters in np.unique(lengths[len(stop) :]):
            need = int((lengths[len(stop) :] == n_letters).sum())
            picks: np.ndarray = rng.choice(
                26**n_letters, size=need + len(stop), replace=False
            )  # letters as base-26 numbers
            letters = (picks[:, None] // 26 ** np.arange(n_letters, dtype=np.int64)) % 26 + ord("a")
            made = [w for w in letters.astype(np.uint8).view(f"S{n_letters}").ravel() if w not in stop]
            words += made[:need]
        pieces = [w + b" " for w in words]
        self.length = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))  # with the space
        self.start = np.concatenate([[0], np.cumsum(self.length)[:-1]])
        self.buf = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        self.words = words
        cdf = np.cumsum(ranks**-ZIPF_S)
        self.cdf = cdf / cdf[-1]
        # the rank at each of 2^20 evenly spaced quantiles: a draw between two that agree is that rank
        self.quantile_rank = np.asarray(np.searchsorted(self.cdf, np.arange(QUANTILES + 1) / QUANTILES, side="right"))

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Word ranks (0-based) drawn from the Zipf distribution: by inverse CDF, looked up in the quantile
        table, searched only where the table does not decide (a fifth of the draws; 1.5x faster than all)."""
        u = rng.random(shape)
        bucket = (u * QUANTILES).astype(np.int64)
        ranks = self.quantile_rank[bucket]
        open_ = ranks != self.quantile_rank[bucket + 1]
        ranks[open_] = np.searchsorted(self.cdf, u[open_], side="right")
        return ranks

    def expected_bytes(self, rows: int) -> int:
        """The size of a TSV of `rows` rows, within a fraction of a percent."""
        p = np.diff(np.concatenate([[0.0], self.cdf]))
        text = WORDS * float(p @ self.length) - 1
        title = 2 * float(self.length[len(LUCENE_STOP_WORDS) : 50_000].mean())  # 2 words, spaces, on average
        return int(rows * (text + len(str(rows)) + 5 + title))  # + id, 2 tabs, 2 quotes, newline


def _block(vocab: Vocabulary, first_id: int, rows: int, rng: np.random.Generator) -> bytes:
    """`rows` TSV lines with ids from `first_id`: the words gathered from the vocabulary's buffer at once."""
    ranks = vocab.sample(rng, (rows, WORDS))
    lengths: np.ndarray = vocab.length[ranks]
    lengths[:, -1] -= 1  # no space after a passage's last word
    body: np.ndarray = np.repeat(
        vocab.start[ranks].ravel() - np.cumsum(lengths.ravel()) + lengths.ravel(), lengths.ravel()
    )
    body += np.arange(len(body))
    text = vocab.buf[body]
    # the title changes with each article: 1-7 passages each, 1-3 words of rank beyond the stop words
    starts: np.ndarray = np.cumsum(rng.integers(1, 8, size=rows))
    title_of_row = np.asarray(np.searchsorted(starts, np.arange(rows), side="right"))
    n_titles = int(title_of_row[-1]) + 1
    title_words: np.ndarray = rng.integers(len(LUCENE_STOP_WORDS), 50_000, size=(n_titles, 3))
    title_lens: list[int] = rng.integers(1, 4, size=n_titles).tolist()
    titles = [b" ".join(vocab.words[w].capitalize() for w in ws[:k]) for ws, k in zip(title_words.tolist(), title_lens)]
    ids = range(first_id, first_id + rows)
    heads = np.frombuffer(b"".join(b'%d\t"' % i for i in ids), dtype=np.uint8)
    tails = np.frombuffer(b"".join(b'"\t' + titles[t] + b"\n" for t in title_of_row.tolist()), dtype=np.uint8)
    head_lens = np.fromiter((len(str(i)) + 2 for i in ids), dtype=np.int64, count=rows)
    tail_lens = np.fromiter((len(titles[t]) + 3 for t in title_of_row.tolist()), dtype=np.int64, count=rows)
    # lay the three parts of each line out in turn: head, text, tail
    part: np.ndarray = np.repeat(
        np.tile(np.arange(3, dtype=np.int8), rows), np.stack([head_lens, lengths.sum(1), tail_lens], 1).ravel()
    )
    out: np.ndarray = np.empty(len(part), dtype=np.uint8)
    out[part == 0], out[part == 1], out[part == 2] = heads, text, tails
    return out.tobytes()


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    """The corpus's vocabulary, made once per process (1-2 s)."""
    return Vocabulary()


def _write_rows(f, first_id: int, rows: int, seed: int, progress=None) -> None:
    vocab = vocabulary()
    for b, start in enumerate(range(0, rows, BLOCK)):
        n = min(BLOCK, rows - start)
        f.write(_block(vocab, first_id + start, n, np.random.default_rng([seed, 2, b])))
        if progress is not None:
            progress(n)


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".params.json")


def is_current(path: Path, rows: int, seed: int = 0) -> bool:
    """Whether `path` holds exactly what `write_tsv(path, rows, seed)` writes (by its sidecar and size)."""
    try:
        meta = json.loads(sidecar(path).read_text(encoding="utf-8"))
        return meta["params"] == params(rows, seed) and path.stat().st_size == meta["bytes"]
    except (OSError, ValueError, KeyError):
        return False


def write_tsv(path: Path, rows: int, seed: int = 0, progress=None) -> bool:
    """Write the corpus of `rows` rows to `path` unless it is there already; True if written.
    `progress(n)` is called after each block of n rows."""
    if is_current(path, rows, seed):
        return False
    sidecar(path).unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(b"id\ttext\ttitle\n")
            _write_rows(f, 1, rows, seed, progress)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {"params": params(rows, seed), "bytes": path.stat().st_size}
    sidecar(path).write_text(json.dumps(meta), encoding="utf-8")
    return True


def append_rows(path: Path, rows: int, first_id: int, seed: int = 1) -> int:
    """Append `rows` new rows (ids from `first_id`) to `path`; returns its size before, to truncate back to."""
    size = path.stat().st_size
    with open(path, "ab") as f:
        _write_rows(f, first_id, rows, seed)
    return size


def sample_queries(path: Path, n: int, words: int = 12, seed: int = 2) -> list[str]:
    """`n` queries, each `words` consecutive words of the text of a random row of the TSV at `path`."""
    rng = np.random.default_rng(seed)
    size = path.stat().st_size
    out = []
    with open(path, "rb") as f:
        for offset in rng.integers(0, size, size=n).tolist():
            f.seek(offset)
            f.readline()  # the rest of a line cut anywhere
            line = f.readline()
            if not line:  # the offset fell in the last row: take the first
                f.seek(0)
                f.readline()
                line = f.readline()
            text = line.split(b"\t")[1].strip(b'"').split()
            at = int(rng.integers(0, max(1, len(text) - words)))
            out.append(b" ".join(text[at : at + words]).decode())
    return out
