"""Test doubles: a generation backend that records its calls, a tiny in-memory BM25 retriever, and
DRAGIN's attention pass on word-level tokens."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from indexing.hits import Hit
from pipeline.methods.dragin_math import candidates_for
from pipeline.engine.requests import Completion


class RecordingGenerator:
    """Answers every prompt with a fixed function of it and records the size of every call."""

    def __init__(self, reply=lambda prompt: "fake answer", fail_on: str | None = None):
        self.calls: list[int] = []
        self.reply = reply
        self.fail_on = fail_on

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        if self.fail_on and any(self.fail_on in str(p) for p in prompts):
            raise RuntimeError(f"cannot generate for a prompt containing {self.fail_on!r}")
        return [Completion(self.reply(p), prompt_tokens=len(str(p).split()), completion_tokens=2) for p in prompts]


PIECE = re.compile(r"\s*\S+")  # a word-level "token": a word with the spaces before it


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class MemoryRetriever:
    """BM25 over a list of (id, title, text) passages, with `search(queries, k, retriever)`."""

    def __init__(self, passages: list[tuple[str, str, str]], k1: float = 0.9, b: float = 0.4):
        self.passages = passages
        self.docs = [Counter(_tokens(f"{t} {x}")) for _, t, x in passages]
        self.lens = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lens) / max(len(self.lens), 1)
        df = Counter(w for d in self.docs for w in d)
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.k1, self.b = k1, b
        self.calls: list[int] = []

    def search(self, queries, k, retriever="bm25"):
        self.calls.append(len(queries))
        out = []
        for q in queries:
            qt = _tokens(q)
            scores = []
            for i, (d, ln) in enumerate(zip(self.docs, self.lens)):
                s = sum(self.idf.get(w, 0) * d[w] * (self.k1 + 1) / (d[w] + self.k1 * (1 - self.b + self.b * ln / self.avg))
                        for w in qt if w in d)
                scores.append((s, i))
            scores.sort(key=lambda t: (-t[0], t[1]))
            out.append([Hit(*self.passages[i], score=s) for s, i in scores[:k]])
        return out


class FakeAttention:
    """`stats` with word-level tokens: entropy 3 on "Zorblat" (0.5 elsewhere), a_max 0.5 (0 for the last
    token); every generated token attends strongly to the question's words."""

    def __init__(self):
        self.calls: list[int] = []

    def stats(self, items):
        self.calls.append(len(items))
        out = []
        for it in items:
            gen = it["generated"]
            offsets = [m.span() for m in PIECE.finditer(gen)]
            n = len(offsets)
            (qs, qe) = it["context"][0]
            q_offsets = [m.span() for m in re.finditer(r"\S+", it["prompt"][qs:qe])]
            q_offsets = [(qs + s, qs + e) for s, e in q_offsets]
            full = it["prompt"] + gen
            shifted = [(s + len(it["prompt"]), e + len(it["prompt"])) for s, e in offsets]
            cands = candidates_for(full, q_offsets + shifted)
            attn = np.zeros((n, len(cands)))
            for i in range(n):
                attn[i, :len(q_offsets)] = 1.0
                attn[i, len(q_offsets):len(q_offsets) + i] = 0.1
            out.append({"offsets": offsets, "entropy": np.array([3.0 if "Zorblat" in gen[s:e] else 0.5 for s, e in offsets]),
                        "prob": np.full(n, 0.9), "amax": np.array([0.5] * (n - 1) + [0.0])[:n],
                        "cand_words": [c.word for c in cands], "cand_order": [c.order for c in cands], "cand_attn": attn})
        return out
