"""Records -> passages: 100-word splitting, stable ids, duplicate merging.

Granularity: long texts are cut into passages of `index.passage_words` words (100 by default,
the granularity of DPR's psgs_w100 and of DRAGIN's retrieval corpus); a text of at most that many
words stays whole, and a short tail (under a quarter of a passage) is joined to the previous
passage rather than standing alone.

Id scheme (stable across builds, so incremental rebuilds and gold-document recall can rely on it):

- A record with a source id (DPR TSV, FlashRAG JSONL, generic files with an id field) keeps it:
  `<source_id>` when the text is one passage, `<source_id>#<i>` (i = 0, 1, ...) when it is split.
- A record without one (HotpotQA / 2Wiki / MuSiQue paragraphs, lead sections, generic files
  without ids) gets `p<16 hex>` = the first 64 bits of sha1(title + "\\n" + text), the paragraph's
  whitespace normalised, and `#<i>` when split. `paragraph_id(title, text)` computes it, so the
  engine maps a gold supporting paragraph (title, text) to its passage id(s); `parent_id(id)`
  strips the chunk suffix.

Duplicates (the same id twice, e.g. a paragraph in several questions' contexts) are merged:
the first occurrence is kept and later ones are counted.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from indexing.corpus.digests import UNKNOWN, DigestSet
from indexing.corpus.readers import Record

# The version of the rules that turn a unit's bytes into passages (the readers, the splitting and id scheme
# above). It is part of each work unit's digest, so a refresh after a change of these rules reads every unit
# again instead of taking units unread with passages cut by the old rules: raise it with any such change.
RULES_VERSION = 1

_WS = re.compile(r"\s+")
_CHUNK = re.compile(r"#\d+$")


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def normalise(text: str) -> str:
    return _WS.sub(" ", text).strip()


def paragraph_id(title: str, text: str) -> str:
    """The content-derived id of a paragraph without a source id (before any chunk suffix)."""
    digest = hashlib.sha1(f"{normalise(title)}\n{normalise(text)}".encode()).hexdigest()
    return "p" + digest[:16]


def id_hash(passage_id: str) -> int:
    """64 bits of blake2b(id): duplicate merging, content-defined shard boundaries, the stores' id maps."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little")


def parent_id(passage_id: str) -> str:
    """`abc#2` -> `abc`: the id of the record a passage was cut from."""
    return _CHUNK.sub("", passage_id)


def split_words(text: str, size: int) -> list[str]:
    """Cut a text into passages of `size` words; a tail under size/4 words joins the previous one."""
    words = text.split()
    if len(words) <= size:
        return [" ".join(words)] if words else []
    chunks = [words[i : i + size] for i in range(0, len(words), size)]
    if len(chunks) > 1 and len(chunks[-1]) < max(1, size // 4):
        tail = chunks.pop()
        chunks[-1] = chunks[-1] + tail
    return [" ".join(c) for c in chunks]


def record_passages(rec: Record, size: int) -> list[Passage]:
    title = normalise(rec.title)
    chunks = split_words(rec.text, size)
    if not chunks:
        return []
    base = rec.source_id if rec.source_id is not None else paragraph_id(rec.title, rec.text)
    if len(chunks) == 1:
        return [Passage(base, title, chunks[0])]
    return [Passage(f"{base}#{i}", title, c) for i, c in enumerate(chunks)]


@dataclass
class PassageStats:
    passages: int = 0
    duplicates: int = 0
    conflicting_duplicates: int = 0  # same id, different text: the first one is kept
    empty: int = 0


def passages_of(
    records: Iterable[Record], size: int, stats: PassageStats | None = None, seen: DigestSet | None = None
) -> Iterator[Passage]:
    """Split records into passages and drop repeated ids (first kept). Holds a `DigestSet` of id
    digests (about 12 bytes per passage) to merge duplicates across the whole stream; pass `seen` to
    share it between streams (a build's units: a later unit drops ids an earlier one holds)."""
    stats = stats if stats is not None else PassageStats()
    seen = seen if seen is not None else DigestSet()
    for rec in records:
        ps = record_passages(rec, size)
        if not ps:
            stats.empty += 1
        for p in ps:
            key = id_hash(p.id)
            text_key = hash((p.title, p.text)) & 0xFFFFFFFF
            known = seen.get(key)
            if known is not None:
                stats.duplicates += 1
                if known not in (text_key, UNKNOWN):  # UNKNOWN: held by a reused unit (unit_reuse.py)
                    stats.conflicting_duplicates += 1
                continue
            seen.add(key, text_key)
            stats.passages += 1
            yield p
