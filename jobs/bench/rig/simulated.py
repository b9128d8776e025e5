"""Latency-model backends for `dynrag bench pipeline --simulate-gpu`, also the tests' deterministic fakes.

Outputs are functions of each input alone (as greedy decoding is), so any engine and batching give the
same answers. A `Cost` sleeps for the modelled time of each call (releasing the GIL, as a GPU kernel or a
C++ search would); `Cost(scale=0)` costs nothing. The model, in seconds at scale 1:

- generate: vLLM's continuous batching. A scheduler thread runs decode steps over at most 256 running
  sequences, admitting waiting prompts as others finish; a step takes 15 ms + 0.1 ms per running sequence
  + the prefill of the prompts admitted in it (their tokens / 20,000). A sequence is delivered when it
  finishes (streaming `submit`); a batch `generate` waits for its longest output. A prompt is 1.3 tokens
  per word; each output is 25-100 % of its max_tokens (from its prompt's hash)
- reasoning search rollouts (Search-R1, Search-o1; chat prompts): a turn stopped at a query's closing tag.
  Each question plans 0, 1, 1, 2, 2, 3, 4 or 6 searches (from the hash of its messages before the rollout);
  a turn writes 5-100 % of its max_tokens of thinking (from its prompt's hash, so turns are uneven), then the
  next query (cut at the stop, as vLLM) while searches are left, else the answer in the method's answer tags
- retrieve (BM25 on CPU): 2 ms + 1 ms per query (`bench pipeline --search-ms`); score (classifier on CPU): 1 ms + 0.5 ms per item;
  embed (CPU): 1 ms + 0.2 ms per text; DRAGIN's attention pass (on the GPU): like a prefill of prompt +
  generated tokens
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np

from indexing import Hit
from jobs.bench.rig.kv_model import Held, PrefixCache
from pipeline.backends.chat import cut_at_stop
from pipeline.backends.dragin_math import candidates_for
from pipeline.backends.kv_pins import pin_seconds
from pipeline.engine.requests import Completion, SamplingSpec, TokenLogprob
from pipeline.engine.streaming import InFlight, StreamingGenerator
from pipeline.methods.search_agent import Tags
from pipeline.methods.search_o1 import TAGS as SEARCH_O1
from pipeline.methods.search_r1 import TAGS as SEARCH_R1

PIECE = re.compile(r"\s*\S+")  # a word-level "token": a word with the spaces before it
SEARCH_TAGS = (SEARCH_R1, SEARCH_O1)
GPU_KV_TOKENS = 400_000  # the benches' default KV cache (add_simulated_parser)
KV_BLOCK_WORDS = 24  # the model's KV block, in words: about 32 tokens at its 1.3 tokens a word
WORDS = ["Paris", "Rome", "Spielberg", "Berlin", "Cincinnati", "film", "capital", "director", "born", "Zorblat"]


def stable_hash(text) -> int:
    return int(hashlib.sha256(str(text).encode()).hexdigest()[:8], 16)


def tokens(text) -> int:
    return int(1.3 * len(str(text).split())) + 1


def piece_id(piece: str) -> int:
    """Simulated token ids are word-level: a piece (`PIECE`, a word with the blanks before it) has this id, so a
    text's ids lay its pieces end to end and the attention pass can check it got the generator's ids."""
    return stable_hash(piece) % 100_000


def tokenized(prompt, pieces: list[str], token_spans: bool) -> dict:
    """A Completion's token fields for output `pieces` after `prompt` (its str, split into pieces)."""
    ends = list(itertools.accumulate(len(p) for p in pieces))
    return {
        "token_ids": [piece_id(p) for p in pieces],
        "prompt_token_ids": [piece_id(p) for p in PIECE.findall(str(prompt))],
        "token_spans": [(e - len(p), e) for p, e in zip(pieces, ends)] if token_spans else None,
    }


STEP_S, RUNNING_S, PREFILL_PER_S = 0.015, 0.0001, 20_000  # the decode step's costs (the model above)


def step_seconds(running: int, prefill_tokens: int) -> float:
    """One decode step of `running` sequences that admits prompts with `prefill_tokens` uncached tokens."""
    return STEP_S + RUNNING_S * running + prefill_tokens / PREFILL_PER_S


@dataclass(frozen=True)
class Cost:
    scale: float = 1.0  # 0: free; 0.1: ten times faster than the model

    def sleep(self, seconds: float) -> float:
        if self.scale:
            time.sleep(seconds * self.scale)
        return seconds * self.scale


FREE = Cost(0)  # the default of the simulated backends: one shared instance (frozen)


@dataclass(order=True)
class _Seq:
    """A sequence in the model's queue, ranked by (its request's priority, arrival)."""

    rank: tuple[int, int]
    out: Completion = field(compare=False)
    left: int = field(compare=False)  # decode steps to go
    fut: Future = field(compare=False)
    held: Held | None = field(default=None, compare=False)  # its KV blocks, once admitted


class SimGenerator(StreamingGenerator):
    """A streaming generator with the GPU model above; `busy_s` is the time with a sequence in flight,
    `steps` the running sequences of each decode step. `kv_tokens`: the KV cache's size, in the model's tokens,
    with vLLM's prefix caching over it (kv_model.py: blocks of KV_BLOCK_WORDS words, about 32 tokens); None: no
    cache, every prompt token computed. Waiting sequences are admitted by their request's priority (lower
    first), then in arrival order: vLLM's priority scheduling, or first come first served where all are 0."""

    def __init__(self, cost: Cost = FREE, max_seqs: int = 256, kv_tokens: int | None = None, pins: bool = False):
        self.cost, self.max_seqs, self.kv_tokens = cost, max_seqs, kv_tokens
        blocks = max(1, round((kv_tokens or 0) / 1.3 / KV_BLOCK_WORDS))
        self.kv = PrefixCache(blocks, KV_BLOCK_WORDS, pins) if kv_tokens else None
        self.steps: list[int] = []
        self.model_s = 0.0  # the modelled seconds of its steps (whatever the sleeps' scale and the host)
        self.flight = InFlight()
        self._waiting: list[_Seq] = []  # a heap
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None  # runs while any sequence is in flight
        self._arrivals = itertools.count()

    @property
    def busy_s(self) -> float:
        return self.flight.busy_s

    def kv_capacity(self) -> int | None:
        return self.kv_tokens or None

    def submit(self, prompt, sampling, chat) -> Future:
        out = self._one(prompt, sampling)
        arrival, fut = next(self._arrivals), Future[tuple[Completion, float]]()
        self.flight.start(arrival)
        with self._cv:
            heapq.heappush(self._waiting, _Seq((sampling.priority, arrival), out, out.completion_tokens, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._schedule, name="sim-generator", daemon=True)
                self._thread.start()
        return fut

    def _admit(self, seq: _Seq, alone: bool) -> bool:
        """Whether `seq`'s KV blocks fit now (`alone`: nothing else runs, so it is admitted whatever it needs);
        if so they are taken, and its Completion counts the prompt tokens the prefix cache served."""
        if self.kv is None:
            return True
        ids = seq.out.prompt_token_ids or []
        got = self.kv.admit(ids, seq.out.completion_tokens, force=alone)
        if got is None:
            return False
        seq.held, hit_words = got
        cached = seq.out.prompt_tokens * hit_words // max(len(ids), 1)
        seq.out = replace(seq.out, cached_prompt_tokens=cached)
        return True

    def _release(self, seq: _Seq, ran: bool) -> None:
        if self.kv is not None and seq.held is not None:
            ids = [*(seq.out.prompt_token_ids or []), *(seq.out.token_ids or [])] if ran else []
            self.kv.release(seq.held, ids, seq.rank[0] if ran else None)  # its program: the request's priority

    def program_ended(self, program: int) -> None:
        if self.kv is not None:
            with self._cv:
                self.kv.end(program)

    def _schedule(self) -> None:
        running: list[_Seq] = []
        while True:
            with self._cv:
                admitted: list[_Seq] = []
                while self._waiting and len(running) + len(admitted) < self.max_seqs:
                    if not self._admit(self._waiting[0], alone=not running and not admitted):
                        break  # its blocks do not fit: it waits at the head, as in vLLM
                    seq = heapq.heappop(self._waiting)
                    if seq.fut.set_running_or_notify_cancel():
                        admitted.append(seq)
                    else:  # cancelled while it waited: it does not run
                        self._release(seq, ran=False)
                        self.flight.finish(seq.rank[1])
                if not running and not admitted:
                    self._thread = None
                    return
            running += admitted
            prefill = sum(seq.out.prompt_tokens - seq.out.cached_prompt_tokens for seq in admitted)
            step_s = step_seconds(len(running), prefill)
            self.model_s += step_s
            self.cost.sleep(step_s)
            self.steps.append(len(running))
            for seq in running:
                seq.left -= 1
            done = [seq for seq in running if seq.left <= 0]
            with self._cv:  # the KV cache and its pins are also changed by program_ended, on the engine's thread
                for seq in done:
                    self._release(seq, ran=True)
            for seq in done:
                seq.fut.set_result((seq.out, self.flight.finish(seq.rank[1])))
            running = [seq for seq in running if seq.left > 0]

    @staticmethod
    def _one(prompt, sampling: SamplingSpec) -> Completion:
        tags = next((t for t in SEARCH_TAGS if t.query[1] in sampling.stop), None)
        if tags is not None:
            return _search_turn(prompt, sampling, tags)
        h = stable_hash(prompt)
        n = max(1, (sampling.max_tokens or 32) * (25 + h % 76) // 100)
        words = [WORDS[(h >> (i % 24)) % len(WORDS)] for i in range(max(0, n - 1))]
        pieces = PIECE.findall(" ".join(words) + f" <answer>{WORDS[h % 4]}</answer>")[:n]
        lps = [TokenLogprob(t, -((stable_hash(t) + h) % 300) / 100) for t in pieces] if sampling.logprobs else None
        return Completion(
            "".join(pieces),
            prompt_tokens=tokens(prompt),
            completion_tokens=len(pieces),
            finish_reason="length",
            logprobs=lps,
            **tokenized(prompt, pieces, sampling.token_spans),
        )


PLANNED_SEARCHES = (0, 1, 1, 2, 2, 3, 4, 6)


def _search_turn(prompt, sampling: SamplingSpec, tags: Tags) -> Completion:
    """One rollout turn of a reasoning search method (the model in the docstring)."""
    text = str(prompt)
    if isinstance(prompt, str):  # raw text: the question part is what precedes the rollout's first result
        question, rollout = text, ""
    else:  # chat: the rollout is the trailing assistant message
        has = len(prompt) > 1 and prompt[-1]["role"] == "assistant"
        question, rollout = str(prompt[:-1] if has else prompt), prompt[-1]["content"] if has else ""
    h, planned = stable_hash(text), PLANNED_SEARCHES[stable_hash(question) % 8]
    done = rollout.count(tags.result[0])
    think = max(1, (sampling.max_tokens or 32) * (5 + h % 96) // 100)
    words = " ".join(WORDS[(h >> (i % 24)) % len(WORDS)] for i in range(think))
    if done < planned:
        act = f" {tags.query[0]} {WORDS[h % 9]} {WORDS[(h >> 4) % 9]} {tags.query[1]}"
    else:
        act = f" {tags.answer[0]}{WORDS[h % 4]}{tags.answer[1]}"
    pieces = PIECE.findall(cut_at_stop(words + act, sampling.stop)[0])
    return Completion(
        "".join(pieces),
        prompt_tokens=tokens(prompt),
        completion_tokens=len(pieces),
        finish_reason="stop",
        **tokenized(prompt, pieces, sampling.token_spans),
    )


class SimRouter:
    """Adaptive-RAG's `complexity` backend: a route from the question's hash (A 1/4, B 1/4, C 1/2), probability
    0.9, at the classifier's CPU cost."""

    def __init__(self, cost: Cost = FREE):
        self.cost = cost

    def route(self, items):
        self.cost.sleep(0.001 + 0.0005 * len(items))
        return [("AABCCCBC"[stable_hash(it["question"]) % 8], 0.9) for it in items]


class SimRetriever:
    """A synthetic corpus of `n` passages; a query's hits are picked by its hash; `query_s`: each query's search."""

    def __init__(self, cost: Cost = FREE, n: int = 10_000, query_s: float = 0.001):
        self.cost, self.n, self.query_s = cost, n, query_s

    def search(self, queries, k, retriever="bm25"):
        self.cost.sleep(0.002 + self.query_s * len(queries))
        out = []
        for q in queries:
            h = stable_hash(q)
            ids = [(h + j * 7919) % self.n for j in range(k)]
            out.append(
                [
                    Hit(
                        f"d{i}",
                        f"Title {i}",
                        f"Passage {i} says {WORDS[i % len(WORDS)]} is the answer.",
                        score=float(k - r),
                    )
                    for r, i in enumerate(ids)
                ]
            )
        return out


class SimScorer:
    """Classifier scores and embeddings from hashes, with the CPU costs above."""

    def __init__(self, cost: Cost = FREE):
        self.cost = cost

    def score(self, items, classifier="default"):
        self.cost.sleep(0.001 + 0.0005 * len(items))
        return [(stable_hash(it) % 1000) / 1000 for it in items]

    def embed(self, texts, model=None):
        self.cost.sleep(0.001 + 0.0002 * len(texts))
        vecs = np.array([[(stable_hash(t) >> s) % 97 - 48 for s in range(0, 24, 3)] for t in texts], dtype=np.float32)
        return vecs / np.linalg.norm(np.where(vecs == 0, 1, vecs), axis=1, keepdims=True)


class WordAttention:
    """DRAGIN's `attention.stats` on word-level tokens: entropy 3 on `uncertain` words (0.5 elsewhere), a_max 0.5
    (0 for the last token); every generated token attends strongly to the question's words. Items whose ids
    are not their texts' pieces are refused; `items` keeps every item received."""

    def __init__(self, uncertain: str = "Zorblat", cost: Cost = FREE):
        self.uncertain, self.cost = uncertain, cost
        self.calls: list[int] = []
        self.items: list[dict] = []

    def stats(self, items):
        self.calls.append(len(items))
        self.items += items
        for it in items:
            ids = tokenized(it["prompt"], PIECE.findall(it["generated"]), False)
            if (ids["prompt_token_ids"], ids["token_ids"]) != (list(it["prompt_ids"]), list(it["generated_ids"])):
                raise ValueError("attention item: the token ids are not the generator's ids of its texts")
        self.cost.sleep(0.005 + sum(tokens(it["prompt"]) + tokens(it["generated"]) for it in items) / 20_000)
        return [self._one(it) for it in items]

    def _one(self, it):
        gen = it["generated"]
        offsets = [m.span() for m in PIECE.finditer(gen)]
        n = len(offsets)
        (qs, qe) = it["context"][0]
        q_offsets = [(qs + m.start(), qs + m.end()) for m in re.finditer(r"\S+", it["prompt"][qs:qe])]
        shifted = [(s + len(it["prompt"]), e + len(it["prompt"])) for s, e in offsets]
        cands = candidates_for(it["prompt"] + gen, q_offsets + shifted)
        attn = np.zeros((n, len(cands)))
        for i in range(n):
            attn[i, : len(q_offsets)] = 1.0
            attn[i, len(q_offsets) : len(q_offsets) + i] = 0.1
        return {
            "offsets": offsets,
            "entropy": np.array([3.0 if self.uncertain in gen[s:e] else 0.5 for s, e in offsets]),
            "prob": np.full(n, 0.9),
            "amax": np.array([0.5] * (n - 1) + [0.0])[:n],
            "cand_words": [c.word for c in cands],
            "cand_order": [c.order for c in cands],
            "cand_attn": attn,
        }


@dataclass(frozen=True)
class SimBackends:
    """Latency-model `Backends` (generator, retriever, scorer and embedder, DRAGIN's attention, Adaptive-RAG's
    router), one cost shared by all: the benches' in-process sets, and Ray's engine and pool actors'
    (`make_backends` of `answer_with_ray`): picklable, each actor builds its own; a part a pool serves is the
    pool's (PoolClient)."""

    scale: float = 0.1
    max_seqs: int = 256
    kv_tokens: int | None = None  # the generator's KV cache (SimGenerator); None or 0: no prefix cache
    search_query_s: float = 0.001  # each query's search (SimRetriever)

    def __call__(self, cfg, index_dir=None, *, retriever=None, scorer=None, embedder=None, generator=None, **kw):
        from pipeline.backends import Backends

        cost = Cost(self.scale)
        sim = SimScorer(cost)
        return Backends(
            cfg,
            index_dir,
            generator=generator or SimGenerator(cost, self.max_seqs, self.kv_tokens, pin_seconds(cfg) > 0),
            retriever=retriever or SimRetriever(cost, query_s=self.search_query_s),
            scorer=scorer or sim,
            embedder=embedder or sim,
            named={"attention": WordAttention(cost=cost), "complexity": SimRouter(cost)},
            **kw,
        )


@dataclass(frozen=True)
class SimulatedGpu:
    """`make_backends` for `--simulate-gpu`: dynrag's Backends (the real BM25 index) with the latency model's
    generator (SimGenerator at time scale 1). Picklable: each Ray engine actor builds its own."""

    kv_tokens: int = GPU_KV_TOKENS

    def generator(self, cfg):
        max_seqs = cfg.generation.engine_kwargs.max_num_seqs or 256
        return SimGenerator(Cost(1.0), max_seqs, self.kv_tokens or None, pin_seconds(cfg) > 0)

    def __call__(self, cfg, index_dir=None, *, generator=None, **kw):
        from pipeline.backends import Backends

        return Backends(cfg, index_dir, generator=generator or self.generator(cfg), **kw)
