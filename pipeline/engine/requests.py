"""What a method program yields to the engine, and what it gets back.

A method never calls a model or an index itself. For one question it yields a request
(`Generate`, `Retrieve`, `Score`, `Embed`), the engine batches it with every other question's
pending request of the same kind, and sends back the result:

- `Generate`  -> `list[Completion]`, one per prompt
- `Retrieve`  -> `list[list[Hit]]`, one ranked list per query
- `Score`     -> `list[float]`, one score per item
- `Embed`     -> `numpy.ndarray` of shape (len(texts), dim)
- `Call`      -> `list`, one result per item, from a backend registered by name
  (`pipeline.backends.register_backend`): the way a method reaches a model or store the four kinds above
  do not cover (DRAGIN's attention pass, ERM4's knowledge reservoir), still batched across questions

A program may also yield a `LookAhead` (a search it will likely ask for later): it gets None back at once.
When the program returns, its return value is an `Answer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from indexing import Hit

# A prompt is a plain user message (str, the chat template is applied) or a list of chat messages.
Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling for one Generate request; None means the run's `generation` config value."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # top-k logprobs per generated token
    token_spans: bool = False  # also each generated token's character span in the text (Completion.token_spans)
    special_text: bool = False  # the text as `tokenizer.decode` of the generated ids gives it, special tokens kept (and, on transformers, the end token's logprob after the others)
    # (the end-of-sequence token's too, where the model ended): DRAGIN's code reads its outputs so
    prompt_logprobs: int | None = None
    entropy: bool = False  # also each step's entropy over the whole vocabulary (Completion.entropies; the
    # transformers backend only)
    # constrained decoding (vLLM's structured outputs; the transformers backend ignores it and methods parse
    # what comes): the output is one of `choice`, or matches `regex`
    choice: tuple[str, ...] = ()
    regex: str | None = None
    # constrained decoding on both backends: the output is JSON that this JSON Schema (a JSON document, as text so
    # that the spec stays hashable) accepts, cut only by max_tokens. One grammar, xgrammar's for the schema
    # (pipeline/backends/constrained.py): vLLM's structured outputs run it, transformers as a logits mask
    json_schema: str | None = None
    # the context window (generation.max_model_len). False: max_tokens is cut to the room the prompt leaves, and a
    # prompt that fills the window is its question's error (PromptTooLong). True: a prompt that does not leave
    # room for max_tokens is not run; it comes back as an empty Completion with finish_reason WINDOW, and the
    # program ends its question with what it has (pipeline/methods/window.py)
    fit: bool = False
    # not a sampling setting but the engine's: the request's rank in the generator's queue, lower first (vLLM's
    # request priority). 0 unless answer.scheduling=program, where it is the question's admission order
    # (engine/core.py: program_priority). A generator groups prompts without it.
    priority: int = 0


@dataclass
class Generate:
    prompts: list[Prompt]
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    chat: bool = True  # False: a str prompt is raw text, no chat template
    stage: str = "generate"  # label in the row (e.g. "answer", "pseudo-doc")


@dataclass
class Retrieve:
    queries: list[str]
    k: int | None = None  # None: retrieval.k
    retriever: str | None = None  # "bm25" | "dense"; None: retrieval.retriever
    step: str = ""  # label recorded with each retrieved document ("" -> "retrieve-<n>")
    path: str = ""  # which path found them (e.g. "query", "pseudo-context")


@dataclass
class LookAhead:
    """Not a request: a search the program expects to ask for later, its query known now (the question's own
    text, while a model decides whether to retrieve). The continuous engine starts it at once when
    `answer.look_ahead` is on, and the program goes on without waiting (it is sent None either way). Its hits
    go to the retrieval cache, so a later Retrieve takes them only where its retriever, query and k match the
    cache's key: the outputs are those without it. A look-ahead the program never asks for is a wasted search."""

    search: Retrieve


@dataclass
class Score:
    items: list[tuple[str, ...]]  # pairs (q, d) or triples (q, d1, d2)
    classifier: str = "default"


@dataclass
class Embed:
    texts: list[str]
    model: str | None = None  # None: embedding.model


@dataclass
class Call:
    backend: str  # a name registered with pipeline.backends.register_backend
    op: str  # the backend method called as `op(items)`; one result per item
    items: list[Any]
    stage: str = "method"  # which per-stage time it counts under (engine.STAGES)


Batched = Generate | Retrieve | Score | Embed | Call  # what the engine batches across questions
Request = Batched | LookAhead  # what a program yields

# Completion.finish_reason of a prompt that was not run: with its max_tokens it does not fit the context window
WINDOW = "window"


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: dict[str, float] = field(default_factory=dict)


@dataclass
class Completion:
    """One prompt's output. `prompt_token_ids` + `token_ids` is the exact sequence the model ran (the
    prompt as the generator encoded it, then every generated id, the one that ends at a stop string
    included); `token_spans[i]` is id i's (start, end) in `text`, read as a detokenizer reads ids
    (pipeline/backends/detok.py), when the sampling asked for them."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    logprobs: list[TokenLogprob] | None = None
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    token_spans: list[tuple[int, int]] | None = None
    stop_reason: str = ""  # the stop string that ended the output ("" for an end token, the length, or unknown)
    # SamplingSpec.entropy: per generation step, the entropy (nats) of the softmax of the scores the generator
    # chose from (its processed logits), over the whole vocabulary, -sum p log(p + 1e-10) as DRAGIN's code
    # computes it; the step that produced an end-of-sequence token is included (one more than token_ids then)
    entropies: list[float] | None = None
    over: int = 0  # finish_reason WINDOW: by how many tokens the prompt and its max_tokens exceed the window
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the engine's prefix cache held (vLLM; 0 where unknown)


@dataclass
class Answer:
    """What a method program returns for its question."""

    prediction: str
    raw_output: str = ""
    used_docs: list[Hit] = field(default_factory=list)  # documents in the final prompt (marked kept)
    retrieval_triggered: bool | None = None  # None: true when any retrieval ran
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific details, stored as JSON


@dataclass
class Question:
    id: str
    question: str
    answers: list[str] = field(default_factory=list)
    dataset: str = ""
    supporting_titles: list[str] = field(default_factory=list)
    # each gold paragraph's content id (indexing.corpus.passages.paragraph_id), "" where only its title is known
    supporting_ids: list[str] = field(default_factory=list)
    error: str | None = None  # set by a loader for a row that cannot be answered

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "dataset": self.dataset,
            "supporting_titles": list(self.supporting_titles),
            "supporting_ids": list(self.supporting_ids),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Question:
        return cls(
            id=str(d["id"]),
            question=d.get("question") or "",
            answers=list(d.get("answers") or []),
            dataset=d.get("dataset") or "",
            supporting_titles=list(d.get("supporting_titles") or []),
            supporting_ids=list(d.get("supporting_ids") or []),
            error=d.get("error"),
        )
