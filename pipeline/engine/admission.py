"""KV-aware admission (answer.scheduling=program, the continuous engine): a new question starts only while the
questions in flight leave room for it in the generator's KV cache.

A question between two rounds (searching, scoring) holds no running sequence, but the prefix its next prompt
will extend is still cached: its last call's prompt and completion tokens. Admitting new questions beyond what
the cache holds makes their first prompts reclaim those free blocks before the next round arrives, and the
next round computes its whole prompt again (issue 62: concurrent runs of a table computed 8,704 more prompt
tokens than the same runs one after another). So the engine counts, per live question, the tokens its latest
call left (`record`), and admits while their sum, plus an estimate for each live question that has not
generated yet and for the new one, stays within `answer.kv_fill` (default `KV_FILL`) of the capacity. The estimate is the mean footprint
seen so far; before the first is seen, `FIRST_FOOTPRINT` tokens. One question always runs.
"""

from __future__ import annotations

from pipeline.config import KV_FILL

FIRST_FOOTPRINT = 1024  # tokens counted for a question before any footprint is seen (the six-method table's
# first prompts average 604 tokens with SmolLM2's tokenizer: a prior on the safe side)


class KvBudget:
    """The KV tokens the live questions hold, against `capacity` (None: no bound known, everyone is admitted)."""

    def __init__(self, capacity: int | None, fill: float = KV_FILL):
        self.room = int(capacity * fill) if capacity else None
        self.held: dict[int, int] = {}  # question index -> tokens its latest generate call left in the cache
        self._seen, self._seen_tokens = 0, 0  # footprints recorded so far, and their sum

    def estimate(self) -> float:
        """The tokens counted for a live question that has not generated yet."""
        if self._seen:
            return self._seen_tokens / self._seen
        return FIRST_FOOTPRINT

    def admits(self, live: int) -> bool:
        """Whether one more question fits beside the `live` ones (each live one recorded or estimated)."""
        if self.room is None or live == 0:
            return True
        unknown = max(live - len(self.held), 0)
        return sum(self.held.values()) + (unknown + 1) * self.estimate() <= self.room

    def record(self, index: int, tokens: int) -> None:
        """Question `index`'s latest generate call left `tokens` (its prompts' and completions') in the cache."""
        if tokens > 0:
            self.held[index] = tokens
            self._seen += 1
            self._seen_tokens += tokens

    def release(self, index: int) -> None:
        """Question `index` finished: what it held may be reclaimed."""
        self.held.pop(index, None)
