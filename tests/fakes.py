"""Test doubles: a generation backend that records its calls, a streaming one that cancels some prompts, a
tiny in-memory BM25 retriever, and DRAGIN's attention pass on word-level tokens (the benchmark's, at no cost)."""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from concurrent.futures import Future

from indexing.search.hits import Hit
from jobs.bench.rig.simulated import PIECE, SimGenerator  # noqa: F401  (PIECE re-exported for tests)
from jobs.bench.rig.simulated import WordAttention as FakeAttention  # noqa: F401  (re-exported for tests)
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


class CancellingGenerator(SimGenerator):
    """The simulated streaming generator, except that a prompt containing `cancel_on` gets a future that is
    cancelled 50 ms later, while still pending (as a generator shutting down cancels its requests)."""

    def __init__(self, cancel_on: str = "cancel"):
        super().__init__()
        self.cancel_on = cancel_on

    def submit(self, prompt, sampling, chat) -> Future:
        if self.cancel_on not in str(prompt):
            return super().submit(prompt, sampling, chat)
        fut: Future = Future()
        threading.Timer(0.05, fut.cancel).start()
        return fut


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
                s = sum(
                    self.idf.get(w, 0) * d[w] * (self.k1 + 1) / (d[w] + self.k1 * (1 - self.b + self.b * ln / self.avg))
                    for w in qt
                    if w in d
                )
                scores.append((s, i))
            scores.sort(key=lambda t: (-t[0], t[1]))
            out.append([Hit(*self.passages[i], score=s) for s, i in scores[:k]])
        return out


def prompt_text(prompt) -> str:
    return prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)


class Windowed:
    """A context window of `max_model_len` tokens in front of `inner` (a generator), a prompt's tokens being the
    words of its text: each prompt is checked as the real generators check it (`chat.window_check`); those that
    run go to `inner`. `log`: (tokens, sampling, ran) of every prompt."""

    def __init__(self, inner, max_model_len: int = 10**6, max_new_tokens: int = 32):
        from pipeline.backends.chat import window_check

        self.inner, self.max_model_len, self.max_new_tokens = inner, max_model_len, max_new_tokens
        self.check = window_check
        self.log: list[tuple[int, object, bool]] = []

    def generate(self, prompts, samplings, chats):
        out: list = [None] * len(prompts)
        run = []
        for i, (p, s) in enumerate(zip(prompts, samplings)):
            n = len(prompt_text(p).split())
            try:
                out[i] = self.check(n, s, self.max_model_len, self.max_new_tokens)
            except Exception as err:  # PromptTooLong: the question's error
                out[i] = err
            self.log.append((n, s, out[i] is None))
            if out[i] is None:
                run.append(i)
        if run:
            done = self.inner.generate([prompts[i] for i in run], [samplings[i] for i in run], [chats[i] for i in run])
            for i, c in zip(run, done):
                out[i] = c
        return out

    def ran(self) -> list[tuple[int, object]]:
        """(tokens, sampling) of the prompts that ran."""
        return [(n, s) for n, s, ok in self.log if ok]
