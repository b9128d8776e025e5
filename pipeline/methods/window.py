"""A context window that fills up, for every multi-round method: one mechanism, each method's own ending.

A program asks for a later turn with `fitting(spec)` (`SamplingSpec.fit`): the generator tokenizes the prompt as
it always does and runs it only where the prompt leaves room for the turn's max_tokens in
`generation.max_model_len`. Otherwise nothing runs and the completion comes back empty with finish_reason WINDOW
(`full(out)`; `out.over`: the tokens missing). The engine counts it (`Trace.window_full`, the row's
`window_full` column), and the program ends its question the way its method's authors end it, or drops what
their code drops (`fit_generate`), each method's docstring saying which and citing the code:

- ircot: the reference fits every prompt (`fit_prompt_into_given_limit`, StonyBrookNLP/ircot
  commaqa/inference/prompt_reader.py, called by commaqa/models/llm_client_generator.py): it drops the few-shot
  demonstrations, the first first, then the prompt's first lines (the oldest paragraphs), and goes on.
- search-r1: the reference keeps the last `max_prompt_length` tokens of the rollout (search_r1/llm_agent/
  generation.py `_update_rolling_state`), which drops the instruction and question first; dynrag instead ends the
  rollout as its turn budget does, with the forced answer.
- search-o1, self-ask, iter-retgen, flare, dragin (and fl-rag, fs-rag): their code has no window check (it ends
  at its turn, step or token budget); the turn that does not fit ends the question as that budget does.
- erm4 (and its configurations): the reader reads the knowledge that fits, the lowest ranked dropped first.

The first prompt of a question is sent as it always was: one that does not fit is the question's error
(PromptTooLong), the only error row the window makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import Any

from pipeline.backends.chat import PromptTooLong
from pipeline.engine.requests import WINDOW, Completion, Generate, Prompt, Request, SamplingSpec

STOPPED = "window"  # the `stopped` the rows of methods that record one give a question the window ended


def fitting(spec: SamplingSpec) -> SamplingSpec:
    """`spec`, run only where the prompt leaves room for its max_tokens."""
    return dataclasses.replace(spec, fit=True)


def full(out: Completion) -> bool:
    """The prompt was not run: it and its max_tokens do not fit the window."""
    return out.finish_reason == WINDOW


def too_long(out: Completion) -> PromptTooLong:
    """The error of a question whose first prompt does not fit."""
    return PromptTooLong(
        f"prompt of {out.prompt_tokens} tokens does not fit generation.max_model_len (short by {out.over})"
    )


def chars(prompt: Prompt) -> int:
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


def to_drop(out: Completion, prompt: Prompt, sizes: list[int]) -> int:
    """How many of the parts of `sizes` (characters each, in the order they go) to drop so that about `out.over`
    tokens go, at the prompt's own characters per token; at least one."""
    per_token = chars(prompt) / max(out.prompt_tokens, 1)
    need, n = out.over * per_token, 0
    while n < len(sizes) and need > 0:
        need -= sizes[n]
        n += 1
    return max(n, 1)


def fit_generate(
    prompt: Callable[[int], Prompt],
    sizes: list[int],
    spec: SamplingSpec,
    chat: bool,
    stage: str,
    dropped: int = 0,
) -> Generator[Request, Any, tuple[Completion, int]]:
    """Generate from `prompt(dropped)`, the prompt with its first `dropped` droppable parts dropped (`sizes`: each
    part's characters, in the order they go); while it does not fit, from one that drops more (estimated from the
    tokens missing, so one or two tries). Returns (completion, parts dropped); the completion is `full` where even
    the prompt with every part dropped does not fit."""
    while True:
        p = prompt(dropped)
        out = (yield Generate([p], sampling=fitting(spec), chat=chat, stage=stage))[0]
        if not full(out) or dropped >= len(sizes):
            return out, dropped
        dropped += to_drop(out, p, sizes[dropped:])
        dropped = min(dropped, len(sizes))
