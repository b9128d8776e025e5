"""The authors' setting of DRAGIN's Table 1 methods (`authors: {...}` in a method's parameters): the loop, prompt layout and stopping
of DRAGIN's published code (oneal2000/DRAGIN, `src/generate.py`, `src/eval.py`), which dynrag's own setting
changes for batching and for the paper's text (pipeline/methods/dragin.py). `dynrag conform` runs both against
the authors' code; docs/conformance.md lists every difference and why dynrag's setting has it.

What this setting does as the authors' code does:
- The prompt is raw text: the exemplars (`fewshot`, the reference's own, handed in by the harness), then,
  in the round right after a retrieval only, "Context:\\n" with "[i] <passage text>" lines and `context_outro`,
  then the question in `case_template` and the answer so far (joined as each class of the code joins it).
- Each round generates `max_tokens` greedy tokens with no stop string; the answer grows by whole rounds; an
  output is its ids decoded with their special tokens (`SamplingSpec.special_text`), the end token's too, as the
  code decodes them.
- A question ends when its answer holds "the answer is", stops growing, or passes `max_tokens` tokens.
- DRAGIN (AttnWeightRAG) weighs each word of a round by the code's attention and entropy and asks its
  real-words query (`attn_modifier`, pipeline/backends/authors_attention.py), not dynrag's RIND and QFS.
- The answer is cut at "Question:" or "Note:"; without "the answer is", " So the answer is " is appended and 20
  tokens generated (their eval.py); the prediction is what follows "the answer is" (their data.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Generator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexing import Hit
from pipeline.backends.authors_attention import word_means
from pipeline.backends.dragin_math import sentence_spans
from pipeline.engine.requests import Answer, Call, Completion, Generate, Question, Request, Retrieve, SamplingSpec
from pipeline.errors import DynragError

SPLIT_WORDS = ("Question:", "#10000000", "Note:")  # where their eval.py cuts an answer
MARK = "the answer is"
FORCED_TOKENS = 20


SWITCH = (
    "the authors' setting: DRAGIN's published loop, prompts and stopping with these pieces of their code "
    "(docs/conformance.md); None: dynrag's batched reading of the paper"
)


class AuthorsPrompt(BaseModel):
    """The authors' setting of a DRAGIN Table 1 method (`authors: {...}` in its parameters): their loop, with these
    prompt pieces from their code (`dynrag conform` hands them over from the checkout)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fewshot: str = Field("", description="authors setting: the exemplars placed first in every prompt")
    case_template: str = Field(
        "Question: {question}\nAnswer:", description="authors setting: the question's part of the prompt"
    )
    context_outro: str = Field(
        "Answer in the same format as before.\n", description="authors setting: the line after the passages"
    )
    sentence_model: str | None = Field(
        None,
        description="authors setting: a spaCy pipeline (name or folder) whose parser splits sentences and whose "
        "tagger finds DRAGIN's real words, as the code's en_core_web_sm does; None: dynrag's rule-based "
        "sentencizer, and every word but a stop word is a real word",
    )


def layout(p: AuthorsPrompt, q: Question, docs: Sequence[Hit], tail: str) -> str:
    """exemplars, the passages (when given), the question, then `tail` (the caller joins it as the code does)."""
    head = p.fewshot
    if docs:
        head += "Context:\n" + "".join(f"[{i}] {h.text}\n" for i, h in enumerate(docs, 1)) + p.context_outro
    return head + p.case_template.format(question=q.question) + tail


def joined(*parts: str) -> str:
    """AttnWeightRAG's join: the non-empty parts with one blank between them."""
    return " ".join(s for s in parts if s)


def generate(
    prompt: str, max_tokens: int, logprobs: int | None = None, entropy: bool = False
) -> Generator[Request, Any, Completion]:
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs, special_text=True, entropy=entropy)
    return (yield Generate([prompt], sampling=spec, chat=False, stage="answer"))[0]


QUERY_TOKENS = 64  # the code's BasicRAG.retrieve(max_query_length=64): BM25 searches the query's last 64 tokens


def retrieve(query: str, k: int, retriever: str | None, n: int) -> Generator[Request, Any, list[Hit]]:
    """The code's retrieve: the query cut on the left to its last QUERY_TOKENS tokens, then the top k, made
    up to k with empty passages where the search found fewer (its retriever.py's dummy docs: the prompt
    then lists k passages, some blank)."""
    (sent,) = yield Call("attention", "last_tokens", [(query, QUERY_TOKENS)])
    hits = list((yield Retrieve([sent], k=k, retriever=retriever, step=f"round-{n}", path="query"))[0])
    return hits + [Hit(id="", title="", text="", score=0.0)] * (k - len(hits))


def found(docs: Sequence[Hit]) -> list[Hit]:
    """The passages a search found (not the dummy ones)."""
    return [d for d in docs if d.id]


def done(text: str, old_len: int, length: int) -> Generator[Request, Any, bool]:
    """The code's end of a question: the answer holds "the answer is", stopped growing, or passed `length`
    tokens (the text encoded again, as the code counts it)."""
    if len(text) <= old_len or MARK in text:
        return True
    return (yield Call("attention", "count_tokens", [text], stage="attention"))[0] > length


@lru_cache(maxsize=2)
def _pipeline(model: str):
    import spacy

    return spacy.load(model)


def spans(text: str, model: str | None) -> list[tuple[int, int]]:
    """(start, end) of each sentence: the given spaCy pipeline's, or dynrag's sentencizer's."""
    if model is None:
        return sentence_spans(text)
    return [(s.start_char, s.end_char) for s in _pipeline(model)(text).sents if s.text.strip()]


def sentences(text: str, model: str | None = None) -> list[str]:
    return [s for s in (text[a:b].strip() for a, b in spans(text, model)) if s]


REAL_POS = ("NOUN", "ADJ", "VERB", "PROPN", "NUM")  # AttnWeightRAG's real words


def real_words(text: str, model: str | None) -> set[str]:
    """The words of `text` the spaCy pipeline tags NOUN, ADJ, VERB, PROPN or NUM (AttnWeightRAG's real words);
    without a pipeline, every word that is not a stop word (dynrag's stand-in: no tagger)."""
    if model is None:
        from spacy.lang.en.stop_words import STOP_WORDS

        return {w for w in re.findall(r"\w+", text) if w.lower() not in STOP_WORDS}
    return {t.text for t in _pipeline(model)(text) if t.pos_ in REAL_POS}


def cut(text: str, at_start_too: bool) -> str:
    for word in SPLIT_WORDS:
        pos = text.find(word)
        if pos > 0 or (at_start_too and pos == 0):
            text = text[:pos]
    return text


def prediction(text: str) -> str:
    """What follows "the answer is" (one character skipped), a final "." dropped; "" without it."""
    at = text.find(MARK)
    if at < 0:
        return ""
    pred = text[at + len(MARK) + 1 :]
    for end in ("</s>", "<|endoftext|>"):
        pred = pred.removesuffix(end)
    return pred.removesuffix(".")


def finish(p: AuthorsPrompt, q: Question, text: str, extra: dict[str, Any]) -> Generator[Request, Any, Answer]:
    """The authors' final answer (eval.py's regenerate, data.py's reading)."""
    cot = cut(text.strip(), at_start_too=False)
    forced = MARK not in cot
    if forced:
        cot += " So the answer is "
        out = yield from generate(layout(p, q, (), " " + cot), FORCED_TOKENS)
        cot = cut(cot + out.text.strip(), at_start_too=True)
    return Answer(prediction(cot), text, extra={**extra, "answer_forced": forced, "setting": "authors"})


def token_run_probs(sent: str, tokens: list[str], logprobs: list[float], tid: int) -> tuple[int, list[float]]:
    """TokenRAG's walk over one sentence: the tokens from `tid` found in order in it (each search starting
    where the last found token ended, counted from the previous search's start as the code counts it), and
    1 - p of those tokens and the one after. Returns (the next sentence's first token, the probabilities)."""
    pos, tr = 0, tid
    while tr < len(tokens):
        found = sent[pos:].find(tokens[tr])
        if found == -1:
            break
        pos = found + len(tokens[tr])
        tr += 1
    return tr + 1, [1 - math.exp(v) for v in logprobs[tid : tr + 1]]


MASK = "[xxx]"  # TokenRAG's mark of an unsure token in its sentence


def flare_modifier(text: str, out: Completion, threshold: float, model: str | None = None) -> tuple[str, str] | None:
    """TokenRAG.modifier (sentence_solver avg) and its "direct" query: the first sentence whose tokens' mean
    1 - p exceeds the threshold -> (the sentences before it, the sentence with each such token marked "[xxx]"
    where the code's search puts it, then the marks removed); None: none. Marked, not cut: where a token is
    not found the code's search lands one character before `pos`, inside an earlier mark, and what that
    leaves of the mark is part of the query."""
    lps = out.logprobs or []
    tokens, values = [t.token for t in lps], [t.logprob for t in lps]
    sents = sentences(text, model)
    tid = 0
    for sid, sent in enumerate(sents):
        nxt, probs = token_run_probs(sent, tokens, values, tid)
        if probs and sum(probs) / len(probs) > threshold:
            curr, pos = sent, 0
            for prob, tok in zip(probs, tokens[tid:nxt]):
                at = curr[pos:].find(tok) + pos
                if prob > threshold:
                    curr = curr[:at] + MASK + curr[at + len(tok) :]
                    pos = at + len(MASK)
                else:
                    pos = at + len(tok)
            return " ".join(sents[:sid]), curr.replace(MASK, "")
        tid = nxt
    return None


def attn_modifier(
    words: Sequence[str],
    attns: Sequence[float],
    weights: Sequence[float],
    threshold: float,
    sents: Sequence[str],
    real: Callable[[str], set[str]] | None,
) -> tuple[str, list[str], list[int]] | None:
    """AttnWeightRAG.modifier: each sentence's words (the words from where the last sentence's ended until
    their join holds the sentence; the last sentence takes the rest), each word's attention relative to
    the sentence's sum, times its weight (entropy) and the sentence's length in words; the first sentence
    with a value above the threshold -> (the sentences before it, its words, a 0/1 hit per word, a word
    kept only where it holds one of the sentence's real words when `real` is given); None: no sentence."""
    tid = 0
    for sid, sent in enumerate(sents):
        tl = tr = tid
        if sid == len(sents) - 1:
            tr = len(words)
        else:
            tr = next((i for i in range(tid + 1, len(words)) if sent in " ".join(words[tl:i])), tid)
            tid = tr
        with np.errstate(all="ignore"):  # the code's empty or zero sums give NaN values, never a hit
            rel = np.array(attns[tl:tr]) / sum(attns[tl:tr])
            values = [rel[i - tl] * weights[i] * (tr - tl) for i in range(tl, tr)]
        hits = [1 if v > threshold else 0 for v in values]
        if 1 in hits:
            if real is not None:
                kept = real(sent)
                hits = [h if any(w in words[tl + i] for w in kept) else 0 for i, h in enumerate(hits)]
            return " ".join(sents[:sid]), list(words[tl:tr]), hits
    return None


# -- the loops, one per class of the authors' code ------------------------------------------------------------
def no_retrieval(q: Question, p: AuthorsPrompt, length: int) -> Generator[Request, Any, Answer]:
    """BasicRAG: one generation from the exemplars and the question."""
    out = yield from generate(layout(p, q, (), ""), length)
    return (yield from finish(p, q, out.text.strip(), {"retrievals": 0}))


def single(
    q: Question, p: AuthorsPrompt, length: int, k: int, retriever: str | None
) -> Generator[Request, Any, Answer]:
    """SingleRAG: the question's top k in the prompt, one generation."""
    docs = yield from retrieve(q.question, k, retriever, 1)
    out = yield from generate(layout(p, q, docs, ""), length)
    ans = yield from finish(p, q, out.text.strip(), {"retrievals": 1})
    ans.used_docs = found(docs)
    return ans


def fixed(q: Question, p: AuthorsPrompt, length: int, k: int, retriever: str | None, window: int | None):
    """FixLengthRAG: retrieve, generate `window` tokens (fix-length) or keep the first sentence of a round
    (fix-sentence, window None); the new text is the next query (the question first)."""
    text, query, n, docs = "", q.question, 0, []
    while True:
        old_len = len(text)
        n += 1
        docs = yield from retrieve(query, k, retriever, n)
        out = yield from generate(layout(p, q, docs, " " + text), window or length)
        if window:
            text, query = text.strip() + " " + out.text.strip(), out.text.strip()
        else:
            first = sentences(out.text.strip(), p.sentence_model)
            if not first:
                break
            text, query = text.strip() + " " + first[0], first[0]
        if (yield from done(text, old_len, length)):
            break
    ans = yield from finish(p, q, text, {"retrievals": n})
    ans.used_docs = found(docs)
    return ans


def token(q: Question, p: AuthorsPrompt, length: int, k: int, retriever: str | None, threshold: float):
    """TokenRAG (FLARE in DRAGIN's code): a sentence whose tokens' mean 1 - p passes the threshold is dropped
    and asked again with its confident words as the query and the passages in the prompt."""
    text, n, docs = "", 0, []
    while True:
        old_len = len(text)
        out = yield from generate(layout(p, q, (), " " + text), length, logprobs=1)
        hit = flare_modifier(out.text, out, threshold, p.sentence_model)
        if hit is None:
            text = text.strip() + " " + out.text.strip()
        else:
            ptext, query = hit
            n += 1
            docs = yield from retrieve(query, k, retriever, n)
            again = yield from generate(layout(p, q, docs, " " + text + " " + ptext.strip()), length)
            text = text.strip() + " " + ptext.strip() + " " + again.text.strip()
        if (yield from done(text, old_len, length)):
            break
    ans = yield from finish(p, q, text, {"retrievals": n})
    ans.used_docs = found(docs)
    return ans


def attn_weight(
    q: Question, p: AuthorsPrompt, length: int, k: int, retriever: str | None, threshold: float, top_k: int
) -> Generator[Request, Any, Answer]:
    """AttnWeightRAG (DRAGIN in its code: method "dragin", query_formulation "real_words",
    check_real_words): each round's words weighted by their attention over the round's own tokens and their
    entropy; a sentence with a word above the threshold is dropped, the words before it attended by its hit
    words form the query (keep_real_words, the top_k), and the continuation after the retrieval keeps its
    first sentence. Needs the per-step entropies of the transformers generator (SamplingSpec.entropy)."""
    text, n, docs, queries = "", 0, [], []

    def real(s: str) -> set[str]:
        return real_words(s, p.sentence_model)

    while True:
        old_len = len(text)
        out = yield from generate(layout(p, q, (), " " + text if text else ""), length, entropy=True)
        ended = out.finish_reason == "stop" and not out.stop_reason  # the end-of-sequence id, dropped from ids
        if out.entropies is None or len(out.entropies) != len(out.token_ids) + ended:
            raise DynragError("the authors' DRAGIN needs per-step entropies: generation.backend=transformers")
        item = {"ids": out.token_ids, "ended": ended}
        st = (yield Call("attention", "authors_rind", [item], stage="attention"))[0]
        weights = word_means(out.entropies, st["ranges"])
        hit = attn_modifier(st["words"], st["attns"], weights, threshold, sentences(out.text, p.sentence_model), real)
        if hit is None:
            text = text.strip() + " " + out.text.strip()
        else:
            ptext, curr, hits = hit
            all_text = q.question + " " + text + " " + ptext + " " + " ".join(curr)
            ask = {"text": all_text, "n_curr": len(curr), "hits": hits, "real_words": sorted(real(all_text))}
            query = (yield Call("attention", "authors_qfs", [{**ask, "top_k": top_k}], stage="attention"))[0]
            n += 1
            queries.append(query)
            docs = yield from retrieve(query, k, retriever, n)
            tail = "".join(" " + s for s in (text, ptext.strip()) if s)
            again = yield from generate(layout(p, q, docs, tail), length)
            first = sentences(again.text, p.sentence_model)
            text = joined(text.strip(), ptext.strip(), first[0] if first else "")
        if (yield from done(text, old_len, length)):
            break
    extra = {"retrievals": n, "queries": queries, "theta": threshold, "top_n": top_k}
    ans = yield from finish(p, q, text, extra)
    ans.used_docs = found(docs)
    return ans
