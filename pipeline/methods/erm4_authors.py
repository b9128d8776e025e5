"""ERM4 in the authors' setting (`authors: {...}` in erm4's or erm4-rewriter's parameters): the flow of their
code (github.com/Ancientshi/ERM4 at a732ed7: main.py's loop over Components.py's QuestionRewriter,
KnowledgeRetriever, KnowledgeFilter and Reader) with the prompt files of their `Prompt/` folder, which
`dynrag conform` hands over from the checkout (they are CC BY-NC-SA: read at run time, never copied here).

Where it differs from dynrag's ERM4 (pipeline/methods/erm4.py, a reading of the paper):
- the rewriter answers in JSON ({"Rewritten Question": [...], "Query": [...]}); the rewritten question read is
  its items joined by spaces (a string's characters, where the model gives one string);
- knowledge is a dict keyed by title, in the order the queries' results come (not mixed order, no cap): a
  later passage of the same title replaces the text of an earlier one and keeps its place;
- the filter judges each instance against the *original* question (main.py passes it), one JSON answer each,
  and keeps those whose "NLI result" is exactly "entailment" (no back-off: nothing kept reads no knowledge);
- the reader gets the rewritten question and the kept knowledge as "[Source i]" blocks; its answer is the JSON
  it returns (a list of answers, joined) or, where that does not parse, its text;
- no memory reservoir or trigger: main.py never calls the trigger (shell/ERM4.sh: trigger=none), and its
  embedder (`sentence2embedding`) is commented out in utils.py.
An output the code's `json.loads` cannot read ends the question with the error the code raises.

`constrain_json` (`dynrag conform --constrain-json`): each call is decoded under the JSON format its prompt states
(`JSON_FORMATS`, as `SamplingSpec.json_schema`), standing in for the instruction-following of the API model their
code was written for; the harness's endpoint applies the same schemas to the reference's calls.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.engine.requests import Answer, Generate, Prompt, Question, Request, Retrieve, SamplingSpec
from pipeline.methods.registry import MethodError

SWITCH = (
    "the authors' setting: their code's flow with these prompt texts (their Prompt/ files; `dynrag conform` "
    "reads them from a checkout); None: dynrag's reading of the paper"
)


def _strings(most: int) -> dict[str, Any]:
    """An array of 1..`most` non-empty strings of at most `STRING_CHARS` characters."""
    string = {"type": "string", "minLength": 1, "maxLength": STRING_CHARS}
    return {"type": "array", "items": string, "minItems": 1, "maxItems": most}


# The JSON format each of their prompts states (Prompt/*_hotpot.txt, knowledge_filter_prompt.txt: "Please strictly
# following this json format"), as a JSON Schema. The counts are the formats' and their examples' (the rewriter's
# examples give 2 rewritten questions and 5 queries, its format `["xxx","xxx",...]`; the reader's format is
# `["xxx"]`, one answer); the labels are the three the filter's prompt lists, its "neural" included. Bounds on
# counts and lengths keep an answer inside the calls' token budget: a small model otherwise repeats an item or a
# phrase until max_tokens, and the cut JSON fails their json.loads as the unconstrained text did.
STRING_CHARS = 120
JSON_FORMATS: dict[str, dict[str, Any]] = {
    "rewrite": {
        "type": "object",
        "properties": {"Rewritten Question": _strings(3), "Query": _strings(5)},
        "required": ["Rewritten Question", "Query"],
        "additionalProperties": False,
    },
    "filter": {
        "type": "object",
        "properties": {"NLI result": {"enum": ["entailment", "contradiction", "neural"]}},
        "required": ["NLI result"],
        "additionalProperties": False,
    },
    "answer": _strings(1),
}


def json_schema(stage: str) -> str:
    """JSON_FORMATS[stage] as SamplingSpec.json_schema's text (one text per stage, on both sides of conform); the
    properties in the format's order, which the grammar keeps."""
    return json.dumps(JSON_FORMATS[stage])


class AuthorsErm4(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rewriter_prompt: str = Field(description="the rewriter's prompt, with {Original_Question}")
    filter_prompt: str | None = Field(
        None, description="the Knowledge Filter's prompt, with {Question} and {External_Knowledge}; None: no filter"
    )
    reader_prompt: str = Field(description="the reader's prompt, with {Question} and {External_Knowledge}")
    page_num: int = Field(5, ge=1, description="results per query (their config.py --page_num)")
    max_tokens: int = Field(
        256, ge=1, description="new tokens per call (their API calls set none; the serving side caps them)"
    )
    unfence: bool = Field(
        False,
        description="an output that is one markdown code block counts as its content (`dynrag conform "
        "--unfence`: the served model answers raw JSON, as their prompts ask and their API model did)",
    )
    constrain_json: bool = Field(
        False,
        description="decode each call under the JSON format its prompt states (JSON_FORMATS, as "
        "SamplingSpec.json_schema; `dynrag conform --constrain-json`): the instruction-following their API model "
        "gave, which a small model lacks",
    )


def _ask(prompts: list[Prompt], a: AuthorsErm4, stage: str) -> Generator[Request, Any, list[str]]:
    """Each prompt as the one user message of a chat, greedy (their t=0.0); with `constrain_json`, under the JSON
    format of the stage's prompt."""
    schema = json_schema(stage) if a.constrain_json else None
    outs = yield Generate(prompts, sampling=SamplingSpec(max_tokens=a.max_tokens, json_schema=schema), stage=stage)
    return [unfenced(o.text) if a.unfence else o.text for o in outs]


def unfenced(text: str) -> str:
    """The content of an output that is one markdown code block ("```json\n{...}\n```"), else the output."""
    t = text.strip()
    if t.startswith("```") and t.endswith("```") and t.count("```") == 2 and "\n" in t:
        return t[3:-3].split("\n", 1)[1].strip()
    return text


def rewritten_and_queries(text: str) -> tuple[str, Any]:
    """QuestionRewriter.rewrite's reading of its output, and main.py's join of the rewritten questions."""
    d = json.loads(text)
    try:
        rewritten = d["Rewritten Input"]
    except Exception:
        rewritten = d["Rewritten Question"]
    return " ".join(rewritten), d["Query"]


def knowledge_by_title(hit_lists: list) -> dict[str, str]:
    """KnowledgeRetriever.retrieve with summary=True: title -> snippet, the queries' results in order."""
    out: dict[str, str] = {}
    for hits in hit_lists:
        for h in hits:
            out[h.title] = h.text
    return out


def filled(prompt: str, **slots: str) -> str:
    """str.replace of each {slot} in the order given, as their code formats its prompts."""
    for k, v in slots.items():
        prompt = prompt.replace("{" + k + "}", v)
    return prompt


def knowledge_block(knowledge: dict[str, str]) -> str:
    """Reader.read's rendering of the external knowledge."""
    return "".join(
        f"\t[Source {i}]\n\t\tTitle: {title}\n\t\tContent: {content}\n\n"
        for i, (title, content) in enumerate(knowledge.items())
    )


def reader_result(text: str) -> Any:
    try:
        return json.loads(text)
    except Exception:
        return text


def prediction_of(result: Any) -> str:
    """The parsed answer list's items joined (their evaluation reads each item), else the text."""
    if isinstance(result, list):
        return " ".join(str(x) for x in result)
    return result if isinstance(result, str) else json.dumps(result)


def program(q: Question, a: AuthorsErm4, retriever: str | None) -> Generator[Request, Any, Answer]:
    prompt = filled(a.rewriter_prompt, Original_Question=q.question)
    text = (yield from _ask([prompt], a, "rewrite"))[0]
    try:
        rewritten, queries = rewritten_and_queries(text)
        queries = list(queries)  # their loop iterates it: a string's characters, a dict's keys
    except Exception as err:  # the code raises here too: the question ends
        raise MethodError(f"erm4 (authors' setting): the rewriter's output is not their JSON: {err!r}") from err
    lists = (yield Retrieve(queries, k=a.page_num, retriever=retriever, step="external")) if queries else []
    knowledge = knowledge_by_title(lists)
    titles = list(knowledge)
    if a.filter_prompt is not None and knowledge:
        prompts: list[Prompt] = [
            filled(a.filter_prompt, Question=q.question, External_Knowledge=c) for c in knowledge.values()
        ]
        judged = yield from _ask(prompts, a, "filter")
        try:
            labels = [json.loads(t)["NLI result"] for t in judged]
        except Exception as err:
            raise MethodError(f"erm4 (authors' setting): a filter output is not their JSON: {err!r}") from err
        knowledge = {t: c for (t, c), lab in zip(knowledge.items(), labels) if lab == "entailment"}
    block = knowledge_block(knowledge)
    reader = filled(a.reader_prompt, Question=rewritten, External_Knowledge=block)
    out = (yield from _ask([reader], a, "answer"))[0]
    result = reader_result(out)
    by_title = {h.title: h for hits in lists for h in hits}
    extra = {"rewritten": rewritten, "queries": queries, "retrieved_titles": titles, "kept": list(knowledge)}
    return Answer(
        prediction_of(result),
        json.dumps(result),
        used_docs=[by_title[t] for t in knowledge],
        retrieval_triggered=bool(queries),
        extra=extra,
    )
