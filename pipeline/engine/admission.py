"""KV-aware admission (answer.scheduling=program, the continuous engine): a new question starts only while the
questions in flight leave room for it in the generator's KV cache.

A question between two rounds (searching, scoring) holds no running sequence, but the prefix its next prompt
will extend is still cached: its last call's prompt and completion tokens. Admitting new questions beyond what
the cache holds makes their first prompts reclaim those free blocks before the next round arrives, and the
next round computes its whole prompt again (issue 62: concurrent runs of a table computed 8,704 more prompt
tokens than the same runs one after another). So the engine counts each live question by the tokens its latest
call left (`record`) or, while it has a call waiting or running, by that call's estimated size where larger
(`expect`: its prompts' characters / `CHARS_PER_TOKEN`, and their max_tokens times the share of max_tokens the
run's returned calls wrote, all of it before one has returned; the call's prompt extends the last one, and its
blocks are taken before the call returns with its count). What a question's first call found in the prefix cache
(`ProgramState.shared_head`: other questions' blocks, a method's instruction and few-shot head) is not counted as its
own: the head is held once, by all of them (a Self-Ask question's 1,006 prompt tokens find 587 in the cache;
counted whole, a table's concurrent run admitted too few questions to fill vLLM's steps: docs/benchmarks.md). It admits while their sum, plus an
estimate for each live question not counted yet and for the new one, stays within `answer.kv_fill` (default
`KV_FILL`) of the capacity. The estimate is the mean of the finished questions' largest footprints (what a
question comes to hold, not what its first call does); before one has finished, `FIRST_FOOTPRINT` tokens. One
question always runs.
"""

from __future__ import annotations

from pipeline.config import KV_FILL
from pipeline.engine.requests import Generate

CHARS_PER_TOKEN = 4  # a prompt's tokens estimated from its characters (English text in a BPE vocabulary: about 4)
FIRST_FOOTPRINT = 1024  # tokens counted for a question before one has finished (the six-method table's
# first prompts average 604 tokens with SmolLM2's tokenizer: a prior on the safe side)


class KvBudget:
    """The KV tokens the live questions hold, against `capacity` (None: no bound known, everyone is admitted)."""

    def __init__(self, capacity: int | None, fill: float = KV_FILL):
        self.room = int(capacity * fill) if capacity else None
        self.held: dict[int, int] = {}  # question index -> tokens its latest generate call left in the cache
        self.out: dict[int, int] = {}  # question index -> tokens estimated for its generate call waiting or running
        self._peak: dict[int, int] = {}  # live question index -> the most it has held or been expected to hold
        self._finished, self._finished_tokens = 0, 0  # finished questions with a footprint, and their peaks' sum
        self._written, self._asked = 0, 0  # returned calls' completion tokens, and the max_tokens they were given

    def estimate(self) -> float:
        """The tokens counted for a live question not counted yet (and for a new one)."""
        if self._finished:
            return self._finished_tokens / self._finished
        return FIRST_FOOTPRINT

    def admits(self, live: int) -> bool:
        """Whether one more question fits beside the `live` ones (each counted, or estimated)."""
        if self.room is None or live == 0:
            return True
        est = self.estimate()
        counted = sum(max(self.held.get(i, est), t) for i, t in self.out.items())
        counted += sum(t for i, t in self.held.items() if i not in self.out)
        unknown = max(live - len(self.held.keys() | self.out.keys()), 0)
        return counted + (unknown + 1) * est <= self.room

    def record(self, index: int, tokens: int) -> None:
        """Question `index`'s latest generate call left `tokens` (its prompts' and completions') in the cache."""
        if tokens > 0:
            self.held[index] = tokens
            self.out.pop(index, None)  # its call returned: what it left is known
            self._peak[index] = max(self._peak.get(index, 0), tokens)

    def completion_share(self) -> float:
        """The share of its max_tokens a call is expected to write: the returned calls' (1 before one returns)."""
        return self._written / self._asked if self._asked else 1.0

    def wrote(self, completion_tokens: int, max_tokens: int) -> None:
        """A generate call returned `completion_tokens`, given `max_tokens` (over its prompts)."""
        if max_tokens > 0:
            self._written += min(completion_tokens, max_tokens)
            self._asked += max_tokens

    def expect(self, index: int, size: tuple[int, int]) -> None:
        """Question `index` has a generate call waiting or running of `size` (`call_size`): it will hold about its
        prompt tokens and the expected share of its max_tokens."""
        prompt, max_tokens = size
        tokens = prompt + round(max_tokens * self.completion_share())
        self.out[index] = tokens
        self._peak[index] = max(self._peak.get(index, 0), tokens)

    def release(self, index: int) -> None:
        """Question `index` finished: what it held may be reclaimed."""
        self.held.pop(index, None)
        self.out.pop(index, None)
        peak = self._peak.pop(index, 0)
        if peak:
            self._finished += 1
            self._finished_tokens += peak


def call_size(call: Generate, default_max_tokens: int = 0) -> tuple[int, int]:
    """A Generate call's size before the generator counts it: its prompts' tokens (their characters /
    CHARS_PER_TOKEN) and the max_tokens over its prompts (`default_max_tokens` where the call leaves it None: what
    the generator then gives it)."""
    chars = sum(len(p) if isinstance(p, str) else sum(len(str(m.get("content", ""))) for m in p) for p in call.prompts)
    return chars // CHARS_PER_TOKEN, len(call.prompts) * (call.sampling.max_tokens or default_max_tokens)
