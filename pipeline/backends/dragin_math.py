"""DRAGIN's equations on plain arrays (Su et al., ACL 2024, Section 3), shared by the attention backend
beside them and the `dragin`/`flare` methods above, and unit-tested on hand-made numbers.

- RIND (Sec. 3.1): S(t_i) = H_i * a_max(i) * s_i (Eq. 5), with H_i the entropy of the next-token
  distribution that produced t_i (Eq. 1), a_max(i) = max over later tokens j > i of the last-layer
  attention A[j, i] that t_j pays to t_i (Eqs. 2-3), s_i = 0 for stop words (Eq. 4).
- QFS (Sec. 3.2): the top-n tokens by the attention the triggering token pays to the preceding
  context, mapped back to their words and kept in text order.
- Truncation (Sec. 3.3, Eq. 6): the output before the triggering token (cut at its word's start).

Tokens are mapped to words through character offsets: a token belongs to the `\\w+` word its span
overlaps; a token with no word (punctuation, whitespace) counts as a stop word (s_i = 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import numpy as np

WORD = re.compile(r"\w+")


@lru_cache(maxsize=1)
def stop_words() -> frozenset[str]:
    """spaCy's English stop-word list (the paper's choice, Sec. 4.5); needs no spaCy model."""
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(w.lower() for w in STOP_WORDS)


def entropy(logits: np.ndarray) -> np.ndarray:
    """Eq. 1 for each row of logits [n, V]: -sum_v p(v) log p(v), natural log, exact over the vocabulary."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -(np.exp(logp) * logp).sum(axis=-1)


def max_later_attention(attn: np.ndarray, positions: np.ndarray, length: int) -> np.ndarray:
    """Eq. 3: for each position i, max_{i < j < length} attn[j, i] (0 for the last token: nothing follows)."""
    out = np.zeros(len(positions))
    for k, i in enumerate(positions):
        if i + 1 < length:
            out[k] = float(attn[i + 1 : length, i].max())
    return out


def word_spans(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int] | None]:
    """For each token's (start, end) in `text`, the span of the `\\w+` word it overlaps (None: no word)."""
    words = [m.span() for m in WORD.finditer(text)]
    out: list[tuple[int, int] | None] = []
    w = 0
    for s, e in offsets:
        while w < len(words) and words[w][1] <= s:
            w += 1
        out.append(words[w] if w < len(words) and words[w][0] < e and s < words[w][1] else None)
    return out


def semantic_mask(text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """Eq. 4: s_i = 0 when token i's word is a stop word (or the token has no word), else 1."""
    stops = stop_words()
    return np.array(
        [0.0 if sp is None or text[sp[0] : sp[1]].lower() in stops else 1.0 for sp in word_spans(text, offsets)]
    )


def rind(entropies: np.ndarray, amax: np.ndarray, semantic: np.ndarray) -> np.ndarray:
    """Eq. 5: S_RIND(t_i) = H_i * a_max(i) * s_i."""
    return np.asarray(entropies, float) * np.asarray(amax, float) * np.asarray(semantic, float)


def first_above(scores: np.ndarray, threshold: float) -> int | None:
    """The first token whose score exceeds the threshold (RIND triggers retrieval there), or None."""
    hit = np.flatnonzero(np.asarray(scores) > threshold)
    return int(hit[0]) if hit.size else None


def truncate(text: str, offsets: list[tuple[int, int]], i: int) -> str:
    """Eq. 6: the output before token i, cut at the start of token i's word, trailing blanks dropped."""
    start = offsets[i][0]
    span = word_spans(text, [offsets[i]])[0]
    if span is not None:
        start = min(start, span[0])
    return text[:start].rstrip()


@dataclass(frozen=True)
class Candidate:
    """A token QFS may pick: its word (None: punctuation) and its position in the text order."""

    word: str | None
    order: int  # order of the word in the context (words of one token sequence share it)


def qfs_query(weights: np.ndarray, candidates: list[Candidate], n: int, skip_stop_words: bool = True) -> str:
    """Sec. 3.2: sort the candidates by the attention `weights` the triggering token pays them, keep
    the top n tokens, map them to their words and join the words in their original text order."""
    stops = stop_words() if skip_stop_words else frozenset()
    ok = [k for k, c in enumerate(candidates) if c.word and c.word.lower() not in stops]
    ranked = sorted(ok, key=lambda k: (-float(weights[k]), k))[:n]
    chosen: dict[int, str] = {}
    for k in ranked:
        chosen.setdefault(candidates[k].order, cast(str, candidates[k].word))  # `ok` kept words only
    return " ".join(chosen[o] for o in sorted(chosen))


def candidates_for(text: str, offsets: list[tuple[int, int]], base_order: int = 0) -> list[Candidate]:
    """Candidates for the tokens of `text` (orders start at base_order; one order per word)."""
    out = []
    for sp in word_spans(text, offsets):
        out.append(Candidate(None, -1) if sp is None else Candidate(text[sp[0] : sp[1]], base_order + sp[0]))
    return out


@lru_cache(maxsize=1)
def sentencizer():
    """spaCy's rule-based sentencizer on a blank English pipeline (its tokenizer keeps "U.S." and "3.5"
    whole, so they end no sentence); no model download, built once."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence; the spans tile the text from 0 (the blanks between two sentences
    open the second), blank-only pieces dropped."""
    spans, start = [], 0
    for sent in sentencizer()(text).sents:
        if sent.text.strip():
            spans.append((start, sent.end_char))
            start = sent.end_char
    return spans


def ends_sentence(text: str) -> bool:
    """The text holds a finished sentence: a sentence-final token ('.', '!', '?', ...) after a word."""
    nlp = sentencizer()
    final, word = nlp.get_pipe("sentencizer").punct_chars, False
    for tok in nlp(text):
        if word and tok.text in final:
            return True
        word = word or not (tok.is_punct or tok.is_space)
    return False


def sentence_of_tokens(text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """Each token's sentence index (its last character's sentence; -1: an empty token)."""
    sent = np.full(len(offsets), -1)
    for k, (s, e) in enumerate(sentence_spans(text)):
        for i, (ts, te) in enumerate(offsets):
            if te > ts and s <= te - 1 < e:
                sent[i] = k
    return sent


def sentence_relative(values: np.ndarray, text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """Each token's value divided by the mean value of its sentence's tokens (mean 1 per sentence).

    The official DRAGIN code scales a_max this way before comparing with theta (attention share within
    the sentence times its length), which is what makes Table 9's theta ~1 meaningful for any context
    length; Eq. 5 as printed uses the raw a_max (`attention_norm="none"`)."""
    values = np.asarray(values, float)
    out = np.zeros_like(values)
    sent = sentence_of_tokens(text, offsets)
    for k in set(sent.tolist()) - {-1}:
        idx = sent == k
        m = values[idx].mean()
        out[idx] = values[idx] / m if m > 0 else 0.0
    return out


# -- a bound on RIND without the attention pass -----------------------------------------------------
def entropy_upper_bound(top_logprobs: list[float], vocab: int) -> float:
    """An upper bound on Eq. 1's entropy from the k most probable tokens' log-probabilities alone: theirs,
    plus the remaining mass r spread evenly over the other vocab - k tokens (for a given mass the even
    spread has the most entropy): H <= -sum_top p log p + r log((vocab - k) / r)."""
    lp = np.asarray(top_logprobs, float)
    p = np.exp(lp)
    known = float(-(p * lp).sum())
    r, rest = 1.0 - float(p.sum()), vocab - len(lp)
    return known + (r * np.log(rest / r) if r > 1e-12 and rest > 0 else 0.0)


def rind_upper_bound(
    entropy_bounds: np.ndarray, text: str, offsets: list[tuple[int, int]], attention_norm: str
) -> np.ndarray:
    """Per token, a bound on Eq. 5's S_RIND that needs no attention: the entropy bound times the most
    a_max can be (attention weights are at most 1, and the last token has no later token: 0; relative to
    its sentence's mean, a_max is at most the sentence's token count, all others being 0) times s_i."""
    n = len(offsets)
    if attention_norm == "sentence":
        sent = sentence_of_tokens(text, offsets)
        most = np.array([float((sent == sent[i]).sum()) if sent[i] >= 0 else 0.0 for i in range(n)])
    else:
        most = np.ones(n)
    if n:
        most[-1] = 0.0
    return np.asarray(entropy_bounds, float) * most * semantic_mask(text, offsets)


def cannot_trigger(bounds: np.ndarray, theta: float) -> bool:
    """No token's RIND bound reaches theta (the pass may be skipped). The bound reads the generator's
    log-probabilities while the pass computes its own: the two engines sum in other orders (fp32 here, half
    precision on a GPU), so the bound must clear theta by a margin (5% and 1e-3) to count."""
    return not len(bounds) or float(np.max(bounds)) * 1.05 + 1e-3 <= theta
