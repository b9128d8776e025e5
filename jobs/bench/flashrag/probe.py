"""Helpers of the FlashRAG driver that read FlashRAG at run time: its pipelines' prompt templates as dynrag
`PromptTemplate` fields (system, user, doc, chat), its pipelines' defaults, and counts of LLM calls, retrievals
and tokens from wrapping its generator and retriever. Standard library only at import: the driver loads this
file by path inside FlashRAG's venv, dynrag's tests import it with fakes.

Templates are read from the objects FlashRAG builds, never copied: a PromptTemplate's format strings as they
are; a document format by rendering two marked documents with FlashRAG's own formatter; Self-Ask's prompt
(assembled inside its `run_item`) by running one step against a recording generator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

TITLE, TEXT, QUESTION = "\x01title\x01", "\x01text\x01", "\x01question\x01"


def escape(s: str) -> str:
    return s.replace("{", "{{").replace("}", "}}")


def marked_docs(n: int) -> list[dict[str, str]]:
    return [{"id": f"probe-{i}", "contents": f"{TITLE}\n{TEXT}", "title": TITLE, "text": TEXT} for i in range(n)]


def doc_format(render: Callable[[list[dict[str, str]]], str]) -> str:
    """One document of `render`'s output as a format string over {idx} (from 1), {title}, {text}: two marked
    documents are rendered and the characters that go from 1 to 2 are the index."""
    one, two = render(marked_docs(1)), render(marked_docs(2))
    second = two[len(one) :]
    if not two.startswith(one) or len(second) != len(one):
        raise ValueError(f"FlashRAG's document format is not one string per document: {one!r}")
    out = []
    for a, b in zip(one, second):
        if a != b and (a, b) != ("1", "2"):
            raise ValueError(f"FlashRAG's document format does not count from 1: {one!r}")
        out.append("{idx}" if a != b else escape(a))
    return "".join(out).replace(TITLE, "{title}").replace(TEXT, "{text}")


def template_fields(t: Any, doc: str | None = None) -> dict[str, Any]:
    """A FlashRAG PromptTemplate as dynrag PromptTemplate fields (its format strings use the same syntax)."""
    return {
        "system": t.system_prompt,
        "user": t.user_prompt,
        "doc": doc or doc_format(t.format_reference),
        "chat": bool(t.is_chat and t.enable_chat),
    }


class _Item:
    def __init__(self, question: str) -> None:
        self.question = question

    def update_output(self, *_: Any) -> None:
        pass


class _Stub:
    """A generator or retriever that records prompts and returns empty outputs / the marked documents."""

    def __init__(self) -> None:
        self.prompts: list[Any] = []

    def generate(self, prompts: Any, **_: Any) -> list[str]:
        self.prompts.append(prompts)
        return [""]

    def search(self, *_: Any, **__: Any) -> list[dict[str, str]]:
        return marked_docs(1)

    def batch_search(self, queries: list[str], **_: Any) -> list[list[dict[str, str]]]:
        return [marked_docs(1) for _ in queries]


def self_ask_head(pipeline: Any) -> dict[str, Any]:
    """The prompt FlashRAG's Self-Ask sends first (its instructions and exemplars, the question's passages, the
    question), with {reference} and {question} as fields: dynrag's self-ask continues it with its transcript."""
    stub = _Stub()
    pipeline.generator, pipeline.retriever = stub, stub
    pipeline.run_item(_Item(QUESTION))  # the empty output ends its loop after the first generate
    prompt = escape(stub.prompts[0])
    reference = escape(pipeline.format_reference(marked_docs(1)))
    if prompt.count(reference) != 1 or prompt.count(QUESTION) != 1:
        raise ValueError("FlashRAG's Self-Ask prompt no longer holds the passages and the question once each")
    return {
        "system": "",
        "user": prompt.replace(reference, "{reference}").replace(QUESTION, "{question}"),
        "doc": doc_format(pipeline.format_reference),
        "chat": False,
    }


def result_block(render: Callable[[list[dict[str, str]]], str]) -> dict[str, str]:
    """A reasoning pipeline's block of retrieved documents (`_retrieved_docs_to_string`) as what comes before
    the documents (head), one document's format (doc, over {idx} {title} {text}) and what follows (tail):
    rendered for one and for two marked documents, the second document is what the longer one adds."""
    one, two = render(marked_docs(1)), render(marked_docs(2))
    n = len(two) - len(one)
    same = next((i for i, (a, b) in enumerate(zip(one, two)) if a != b), len(one))
    head, first, tail = one[: same - n], one[same - n : same], one[same:]
    if n <= 0 or same < n or two != head + first + two[same : same + n] + tail:
        raise ValueError(f"FlashRAG's block of retrieved documents is not head, one string per document, tail: {one!r}")
    inner = len(head), len(tail)
    return {
        "head": head,
        "tail": tail,
        "doc": doc_format(lambda docs: (lambda s: s[inner[0] : len(s) - inner[1]])(render(docs))),
    }


def reasoning_templates(pipeline: Any) -> dict[str, dict[str, Any]]:
    """A ReasoningPipeline's (GitHub main: SearchR1Pipeline, SimpleDeepSearcherPipeline, ...) instruction
    template, with its documents' format as `doc`, and its block of documents and stop strings (`result`)."""
    block = result_block(pipeline._retrieved_docs_to_string)
    return {
        "prompt": template_fields(pipeline.prompt_template, block["doc"]),
        "result": {"head": block["head"], "tail": block["tail"], "stop": list(pipeline.stop_tokens)},
    }


def templates(pipeline: Any, standard: Any) -> dict[str, dict[str, Any]]:
    """Every prompt template `pipeline` asks with (by dynrag's names), and FlashRAG's standard one."""
    out = {"standard": template_fields(standard)}
    name = type(pipeline).__name__
    if name == "SuRePipeline":
        doc = doc_format(lambda docs: pipeline.format_ref([d["title"] for d in docs], [d["text"] for d in docs]))
        for step, attr in (
            ("candidates", "P_CAN_TEMPLATE"),
            ("summary", "P_SUM_TEMPLATE"),
            ("validity", "P_VAL_TEMPLATE"),
            ("rank", "P_RANK_TEMPLATE"),
        ):
            out[step] = template_fields(getattr(pipeline, attr), doc)
    elif name == "SelfAskPipeline":
        out["head"] = self_ask_head(pipeline)
    elif hasattr(pipeline, "_retrieved_docs_to_string") and hasattr(pipeline, "stop_tokens"):
        out.update(reasoning_templates(pipeline))
    else:
        out["prompt"] = template_fields(pipeline.prompt_template)
    return out


def defaults(cls: type) -> dict[str, Any]:
    """The keyword defaults of a pipeline class's constructor (its step budgets and thresholds)."""
    params = inspect.signature(cls).parameters.values()  # the constructor's, without self
    return {
        p.name: p.default
        for p in params
        if p.default is not inspect.Parameter.empty and isinstance(p.default, (int, float, str, bool))
    }


class Counts:
    """LLM calls (prompts generated), prompt and generated tokens, retrievals (queries searched) of one pipeline,
    counted by wrapping its generator's `generate`, its model's `generate` (a transformers model or a vLLM
    `LLM`) and its retriever's searches."""

    def __init__(self, pipeline: Any) -> None:
        self.reset()
        gen, ret = pipeline.generator, pipeline.retriever
        gen.generate = self._wrap(gen.generate, self._prompts)
        gen.model.generate = self._wrap(gen.model.generate, self._tokens)
        ret.search = self._wrap(ret.search, lambda _out, q, *_, **__: self._add("retrievals", 1))
        ret.batch_search = self._wrap(ret.batch_search, lambda _out, qs, *_, **__: self._add("retrievals", len(qs)))
        self._pad = {gen.tokenizer.pad_token_id, gen.tokenizer.eos_token_id} - {None}

    def reset(self) -> None:
        # cached_prompt_tokens: vLLM's prefix-cache hits (0 for transformers)
        keys = ("llm_calls", "retrievals", "prompt_tokens", "completion_tokens", "cached_prompt_tokens")
        self.totals = dict.fromkeys(keys, 0)

    def _add(self, key: str, n: int) -> None:
        self.totals[key] += n

    @staticmethod
    def _wrap(fn: Callable, count: Callable) -> Callable:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            count(out, *args, **kwargs)
            return out

        return wrapped

    def _prompts(self, _out: Any, prompts: Any, *_: Any, **__: Any) -> None:
        self._add("llm_calls", 1 if isinstance(prompts, str) else len(prompts))

    def _tokens(self, out: Any, *_: Any, **kwargs: Any) -> None:
        """transformers: prompt tokens are the attention mask's ones, generated each row's tokens up to its first
        end token; vLLM (a list of RequestOutputs): each prompt's token ids and its output's (an ending end
        token included), and the prompt tokens its prefix cache held."""
        if not hasattr(out, "sequences"):
            for ro in out:
                self._add("prompt_tokens", len(ro.prompt_token_ids or []))
                self._add("cached_prompt_tokens", int(getattr(ro, "num_cached_tokens", None) or 0))
                self._add("completion_tokens", len(ro.outputs[0].token_ids))
            return
        mask, ids = kwargs["attention_mask"], kwargs["input_ids"]
        self._add("prompt_tokens", int(mask.sum()))
        for row in out.sequences[:, ids.shape[-1] :].tolist():
            ends = [i for i, t in enumerate(row) if t in self._pad]
            self._add("completion_tokens", ends[0] + 1 if ends else len(row))

    def per_question(self, questions: int) -> dict[str, float]:
        return {f"{k}_per_question": round(v / max(1, questions), 2) for k, v in self.totals.items()}
