"""Passages -> shards, with boundaries chosen by content so that edits stay local.

Shards follow the corpus order. A shard ends after a passage whose id hash hits a fixed residue
(once the shard holds at least shard_size/4 passages; at most 4 x shard_size), so shards average
`index.shard_size` passages and a boundary depends only on the ids near it, not on absolute
positions (content-defined chunking, as in rsync or restic). Inserting, changing or deleting a
passage therefore changes only the shard that holds it (and, when the passage was a boundary, its
neighbour); passages appended at the end of the corpus make new shards. A rebuild over the same
final corpus yields the same shards whatever the earlier versions were, so an incremental build
equals a full one.

Each shard is keyed by a hash of its passages (ids, titles, texts) and the build settings: a shard
whose key already exists is reused as is. Its passages are stored by store.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from indexing.corpus.passages import Passage, id_hash

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

# A shard's passages at their largest in a build (Python strings, Arrow columns and Lucene's copy of
# ~7-byte words, plus two float32 copies of a vector of up to 768 dimensions), in bytes per word/passage.
_BYTES_PER_WORD = 3 * 7
_BYTES_PER_PASSAGE = 3 * 200 + 2 * 4 * 768
SHARD_SHARE = 0.75  # of index.memory_budget_mb for the largest shard; the rest for one embedding batch


def effective_shard_size(cfg: IndexSettings) -> int:
    """`index.shard_size`, capped when `index.memory_budget_mb` is set so that the largest shard
    (4 x the mean size, see shard_stream) fits in its share of the budget."""
    i = cfg.index
    if not i.memory_budget_mb:
        return i.shard_size
    per_passage = i.passage_words * _BYTES_PER_WORD + _BYTES_PER_PASSAGE
    return max(1, min(i.shard_size, int(SHARD_SHARE * i.memory_budget_mb * 2**20) // (4 * per_passage)))


def effective_embed_batch(cfg: IndexSettings, model_config: dict) -> int:
    """`embedding.batch_size`, capped when `index.memory_budget_mb` is set so that one batch's activations fit
    in the rest of the budget. Per text, a transformer layer at sequence length L holds the hidden states and
    Q, K, V (4 x L x hidden), the feed-forward's L x intermediate and attention scores and probabilities
    (2 x heads x L^2) in float32, taken twice for temporaries; plus the tokenizer's work on the whole
    passage (~100 bytes a word). Unknown sizes count as a large base model's (1024, 4096, 16 heads)."""
    e, i = cfg.embedding, cfg.index
    if not i.memory_budget_mb:
        return e.batch_size
    hidden, inner = model_config.get("hidden_size", 1024), model_config.get("intermediate_size", 4096)
    heads, length = model_config.get("num_attention_heads", 16), e.max_seq_length
    per_text = 2 * 4 * length * (4 * hidden + inner + 2 * heads * length) + 100 * i.passage_words
    return max(1, min(e.batch_size, int((1 - SHARD_SHARE) * i.memory_budget_mb * 2**20) // per_text))


def shard_stream(passages: Iterable[Passage], shard_size: int) -> Iterator[list[Passage]]:
    min_size = max(1, shard_size // 4)
    span = max(1, shard_size - min_size)  # expected size = min_size + span = shard_size
    max_size = 4 * shard_size
    buf: list[Passage] = []
    for p in passages:
        buf.append(p)
        if len(buf) >= max_size or (len(buf) >= min_size and id_hash(p.id) % span == 0):
            yield buf
            buf = []
    if buf:
        yield buf


def content_hash(passages: list[Passage]) -> str:
    h = hashlib.sha256()
    for p in passages:
        for part in (p.id, p.title, p.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def shard_key(content: str, settings_hash: str) -> str:
    return hashlib.sha256(f"{content}:{settings_hash}".encode()).hexdigest()[:32]
