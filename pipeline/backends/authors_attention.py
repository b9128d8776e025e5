"""DRAGIN's RIND attention and real-words query as the authors' code computes them (oneal2000/DRAGIN,
Apache-2.0, `src/generate.py`: `BasicGenerator.generate_attn`, `AttnWeightRAG.keep_real_words`), written
anew from reading it. The attention backend's `authors_rind` and `authors_qfs` run the forwards
(pipeline/backends/attention.py); these functions take their weights, so tests feed them by hand.

Words are the code's: runs of tokens (`convert_ids_to_tokens`) joined with the space token removed, a new
word starting at the first token, a token that starts with the space token ("▁" for a model of type llama,
else the tokenizer's token for " "), the id 13, and (in generate_attn only) a token after "</s>". The
arithmetic keeps the code's order and dtypes (the model's for the attention, float32 tensors where the
code makes them), so only float summation order inside torch can differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NEWLINE_ID = 13  # the code's test `input_ids[i] == 13` (Llama's "<0x0A>")
EOS_PIECE = "</s>"  # the code's literal end-of-sequence token


def word_ranges(tokens: Sequence[str], ids: Sequence[int], space: str, after_eos: bool) -> list[tuple[int, int]]:
    """(first, last) token of each word (both inclusive, as the code's `range_`)."""
    out: list[list[int]] = []
    for i, t in enumerate(tokens):
        if i == 0 or t.startswith(space) or ids[i] == NEWLINE_ID or (after_eos and tokens[i - 1] == EOS_PIECE):
            out.append([i, i])
        else:
            out[-1][1] += 1
    return [(a, b) for a, b in out]


def word_texts(tokens: Sequence[str], ranges: Sequence[tuple[int, int]], space: str) -> list[str]:
    return ["".join(tokens[a : b + 1]).replace(space, "") for a, b in ranges]


def word_attention(heads: Any, tokens: Sequence[str], ranges: Sequence[tuple[int, int]]) -> list[float]:
    """generate_attn's solver "max": `heads` [heads, q, k] (the last layer over the generated tokens alone);
    each token's max over the queries, the mean over heads, divided by the sum after the first token when
    that is "</s>", summed per word."""
    import torch

    per_token = torch.mean(torch.max(heads, dim=1).values, dim=0)
    if per_token.shape[0] > 1 and tokens[0] == EOS_PIECE:
        per_token = per_token / sum(per_token[1:]).item()
    return [float(sum(per_token[a : b + 1]).item()) for a, b in ranges]


def word_means(values: Sequence[float], ranges: Sequence[tuple[int, int]]) -> list[float]:
    """The mean of per-token values over each word's tokens (generate_attn's entropy per word), summed in
    float32 as the code sums numpy's float32 entropies."""
    import numpy as np

    return [float(sum(np.float32(v) for v in values[a : b + 1]) / (b - a + 1)) for a, b in ranges]


def forward_attention(mean: Any, ranges: Sequence[tuple[int, int]], n_curr: int, hits: Sequence[int]) -> list[float]:
    """keep_real_words' attention of the hit words on the words before them. `mean` [q, k]: the last layer
    over all the text's tokens, mean over heads. A word's attention: for each of its tokens i > 0, the row
    of token i - 1 over the keys before the word, renormalised to 1; their sum over the word's tokens divided
    by its length, summed per word. The result: the mean of that over the current sentence's hit words
    (the last `n_curr` words; NaN where none is hit, as the code's 0 / 0)."""
    import torch

    length = mean.shape[0]
    words = range(len(ranges))
    curr_st = len(ranges) - n_curr
    total = torch.zeros(len(ranges))
    count = 0
    for i, hit in enumerate(hits):
        if hit != 1:
            continue
        r0, r1 = ranges[words[curr_st + i]]  # list indexing as the code's attns[curr_st + i]
        att = torch.zeros(length)
        for t in range(r0, r1 + 1):
            if t == 0:
                continue
            v = mean[t - 1][:r0]
            v = v / v.sum()
            row = torch.zeros(length)
            row[:r0] = v
            att += row
        att /= r1 - r0 + 1
        total += torch.tensor([att[a : b + 1].sum() for a, b in ranges])
        count += 1
    total /= count
    return total.tolist()


def real_words_query(
    words: Sequence[str],
    forward: Sequence[float],
    n_curr: int,
    hits: Sequence[int],
    real_words: Sequence[str],
    top_k: int,
) -> str:
    """keep_real_words' query: the words that contain a real word (a substring match) and are not a hit
    word of the current sentence, the top_k by forward attention (ties in text order), in text order."""
    curr_st = len(words) - n_curr
    pairs = []
    for i, (word, att) in enumerate(zip(words, forward)):
        if i >= curr_st and hits[i - curr_st]:
            continue
        if any(r in word for r in real_words):
            pairs.append((att, word, i))
    top = sorted(pairs, key=lambda x: x[0], reverse=True)[: min(top_k, len(pairs))]
    return " ".join(w for _, w, _ in sorted(top, key=lambda x: x[2]))
