"""ERM4 (Shi et al., "Enhancing Retrieval and Managing Retrieval: A Four-Module Synergy for Improved
Quality and Efficiency in RAG Systems"): Query Rewriter+ (Sec. 3.1), Knowledge Filter (Sec. 3.2),
Memory Knowledge Reservoir (Sec. 3.3, `pipeline.methods.reservoir`) and Retrieval Trigger (Sec. 3.4).

The paper's configurations (Sec. 4.3, Table 1):
  (i)   Direct                             -> method `no-retrieval`
  (ii)  Rewriter-Retriever-Reader          -> `rewrite-retrieve-read` (one query; original question read)
  (iii) Rewriter+-Retriever-Reader         -> `erm4-rewriter` (s and Q; s read with all knowledge)
  (iv)  Rewriter+-Retriever-Filter-Reader  -> `erm4` with reservoir=false
and the full four-module system (Sec. 6) -> `erm4` (reservoir and trigger on by default).

The knowledge retriever here is the project's index (the paper used Bing, top n = 10 per query, Sec. 4.1).
Knowledge from several queries is interleaved ("mixed order", Sec. 2 PS2) and capped at `max_knowledge`
(30 in Sec. 4.1). Rows' `extra` holds external_knowledge, memory_knowledge and irrelevant_knowledge (filtered
out) counts, the rewritten question and queries, and whether the filter left nothing (back-off).

The paper fine-tunes Gemma-2B with LoRA for the rewriter and the filter. Here both are prompt-based with
the run's generator by default; `rewriter_model` / `filter_model` name another model folder (a fine-tuned
model, or a LoRA adapter merged into its base with peft's `merge_and_unload`) that serves those prompts
through the `erm4-model` backend (its own vLLM/transformers engine; meant for a GPU cluster). A trained
cross-encoder can replace the NLI prompt (`filter=classifier`; train it with `dynrag train-classifier
--set classifier.task=pair`, (question, supporting paragraph) positive).

The memory path follows the authors' code (github.com/Ancientshi/ERM4, Components.py at a732ed7):
- `RetrievalTrigger.check_retrieval_need(query)`: the reservoir is the union of the past questions'
  `filtered knowledge` (title -> content, `dict.update` in record order: a newer pair replaces an older one
  of the same title, Sec. 3.3); titles and queries are embedded (utils.py `sentence2embedding`,
  all-mpnet-base-v2; here the run's embedder), and a query with at least theta titles at cosine >= tau gets
  all of those titles (no top-k), any other query is retrieved externally. Defaults there: tau = 0.4
  (config.py `--cosine_similarity_threshold`), theta = 3 (`--popularity_threshold`).
- So what is cached is what the Knowledge Filter kept: each question adds its kept external knowledge
  after its answer (its kept memory knowledge is already there).
- Whether memory knowledge passes the filter again is not in the code: main.py runs rewrite -> filter ->
  read on pre-fetched Bing knowledge and never calls the trigger (shell/ERM4.sh: trigger=none). The paper's
  Table 2 settles it: at tau = 0.2 there is no external knowledge, 30.30 memory and 11.62 irrelevant
  knowledge per question, so memory knowledge was judged by the filter. Here it is, too (one NLI call each).
Titles key the pairs (Sec. 3.3), and Wikipedia passages share their article's title: the reservoir keeps
one passage per article, the last one cached.

A full context window (`generation.max_model_len`, pipeline/methods/window.py): the reader's prompt holds up to
`max_knowledge` instances (30, Sec. 4.1), more than a short window holds. The reader reads those that fit with
its max_tokens, the lowest ranked (last in mixed order) dropped first, and the row counts them
(`dropped_knowledge`); the authors' reader (Components.py `Reader.read`, over an API model with a long window)
has no window check. Only a reader whose question alone does not fit is the question's error.

A reservoir belongs to a run: by default `<out>/erm4-reservoir.sqlite` (`Erm4Params.for_output`), empty at
the run's first batch and kept across a resume of the same output; its pairs come from this run only (on a
resume, also from the questions whose rows the killed job had not yet written). `reservoir_path` shares one
across runs explicitly; it is then part of the run's configuration (run.json, config.resolved.yaml), and
one job at a time uses it (`state_lock`: a second is refused). With Ray, every engine actor must run on the
driver's host (SQLite over a network filesystem is not safe): an actor on another node refuses to start.
Within a run the questions run concurrently: a question sees the pairs of those that finished before its
lookup. With `answer.engine=lockstep` that is a function of the input order (batches of
`answer.batch_questions`, all lookups of a batch before its updates); with the continuous engine it depends
on which questions finished first, so for reproducible rows use lockstep, or `update_reservoir=false` over a
fixed reservoir (as `dynrag eval-erm4 --tables 2` does for its second set).
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Sequence
from typing import Any, Literal

from pydantic import Field

from indexing import Hit
from pipeline.backends import make_generator, register_backend
from pipeline.classifier.data import format_document
from pipeline.config import with_values
from pipeline.engine.requests import (
    Answer,
    Call,
    Completion,
    Embed,
    Generate,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
    Score,
)
from pipeline.methods import erm4_authors
from pipeline.methods import reservoir as _reservoir  # noqa: F401  (registers the "reservoir" backend)
from pipeline.methods.erm4_authors import SWITCH as AUTHORS_SWITCH
from pipeline.methods.erm4_authors import AuthorsErm4
from pipeline.methods.prompts import extract_answer
from pipeline.methods.registry import MethodError, MethodParams, register_method
from pipeline.methods.window import fit_generate, full, too_long

PAPER = "ERM4 (Shi et al.)"

# -- Query Rewriter+ (Sec. 3.1) ------------------------------------------------------------------------

REWRITER_PLUS_INSTRUCTION = (
    "Your task is to transform a potentially colloquial or jargon-heavy [Original Question] into a semantically "
    "enhanced Rewritten Question with a clear intention. Additionally, generating several search-friendly Queries "
    "that can help find relevant information for answering the question. You can consider the provided [Examples] "
    "and response following the [Format]."
)
REWRITER_PLUS_EXAMPLES = (
    "[Original Question]: who wrote the book the film jaws was based on and where was he born\n"
    "Jaws is based on a novel. Who wrote that novel, and in which place was its author born?**Jaws film based "
    "on novel**author of the novel Jaws**Peter Benchley birthplace\n\n"
    "[Original Question]: which is older, the eiffel tower or the statue of liberty?\n"
    "Which was completed earlier: the Eiffel Tower or the Statue of Liberty?**Eiffel Tower completion year"
    "**Statue of Liberty completion year"
)
REWRITER_PLUS_FORMAT = "{The generated Rewritten Question is here}**{query1}**{query2}**{query3}..."


def rewriter_plus_prompt(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": REWRITER_PLUS_INSTRUCTION},
        {
            "role": "user",
            "content": f"[Examples]:\n{REWRITER_PLUS_EXAMPLES}\n\n[Format]: {REWRITER_PLUS_FORMAT}\n\n"
            f"[Original Question]: {question}\n",
        },
    ]


# a label ends with ':' or the part itself: "Rewritten Question:", "[Query 2]:", "Queries"
_LABEL = re.compile(
    r"^\s*\[?\s*(?:rewritten(?:\s+question)?|(?:search\s+)?quer(?:y|ies))\s*\d*\s*\]?\s*(?::\s*|$)", re.IGNORECASE
)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_MAX_CHARS = 300


def _clean(part: str) -> str:
    part = _BULLET.sub("", part.strip())
    part = _LABEL.sub("", part).strip()
    return part.strip().strip('"').strip("{}[]").strip()


def parse_rewriter_plus(text: str, question: str, max_queries: int = 5) -> tuple[str, list[str], bool]:
    """G(p) -> (s, Q) from '{s}**{q1}**{q2}...' (Sec. 3.1). Also reads one item per line, with or without
    'Rewritten Question:' / 'Query 1:' labels, bullets or markdown bold. Returns (s, Q, parsed); a malformed
    output (no rewritten question, or no query) gives (question, [question], False)."""
    text = (text or "").strip().strip("`")
    parts = [_clean(p) for p in text.split("**")] if "**" in text else [_clean(p) for p in text.splitlines()]
    parts = [p for p in parts if p and len(p) <= _MAX_CHARS]
    if len(parts) < 2:
        return question, [question], False
    s, queries = parts[0], list(dict.fromkeys(parts[1:]))[:max_queries]
    return s, queries, True


REWRITER_INSTRUCTION = (
    "Rewrite the question below into one short search query for a search engine that would "
    "find the information needed to answer it. Reply with the query only."
)


def rewriter_prompt(question: str) -> list[dict[str, str]]:
    """Rewrite-Retrieve-Read's rewriter (Ma et al., 2023; configuration (ii)): one query."""
    return [
        {"role": "system", "content": REWRITER_INSTRUCTION},
        {"role": "user", "content": f"Question: {question}\nQuery:"},
    ]


def parse_query(text: str, question: str) -> tuple[str, bool]:
    """The first usable line of the rewriter's output, else the original question."""
    for line in (text or "").strip().strip("`").splitlines():
        q = _clean(line)
        if q and len(q) <= _MAX_CHARS:
            return q, True
    return question, False


# -- Knowledge Filter (Sec. 3.2) ------------------------------------------------------------------------

HYPOTHESES = {
    # strong (single-hop): the knowledge must hold the answer; the paper's template wording
    "strong": "The [Knowledge] contains reliable answers aiding the response to [Question]",
    # weak (multi-hop): information that possibly helps answer is enough
    "weak": "The [Knowledge] contains information that possibly aids in answering [Question]",
}
NLI_LABELS = ("entailment", "contradiction", "neutral")


def nli_prompt(question: str, knowledge: Hit, hypothesis: str) -> list[dict[str, str]]:
    return [
        {
            "role": "system",
            "content": (
                "Your task is to solve the NLI problem: given the premise in [Knowledge] and the hypothesis that "
                f'"{HYPOTHESES[hypothesis]}". You should classify the response as entailment, contradiction, or '
                "neutral. Reply with one word: entailment, contradiction or neutral."
            ),
        },
        {
            "role": "user",
            "content": f"[Question]: {question}\n[Knowledge]: {format_document(knowledge.title, knowledge.text)}\n"
            "[NLI result]:",
        },
    ]


def nli_label(text: str) -> str | None:
    """The judgment j: the label after the last '**' if any (the paper's '{explanation}**{result}'), else the
    first label word in the text; None when no label is named (the knowledge is then dropped, as neutral)."""
    t = (text or "").lower()
    tail = t.rsplit("**", 1)[-1] if "**" in t else t
    for scope in (tail, t):
        found = [(m.start(), m.group(0)) for lab in NLI_LABELS for m in re.finditer(rf"\b{lab[:6]}\w*", scope)]
        if found:
            return next(lab for lab in NLI_LABELS if lab.startswith(min(found)[1][:6]))
    return None


# -- reader (Sec. 4.1: instruction, question, knowledge, response format) ----------------------------------

READER_SYSTEM = (
    "Answer the question. Use the knowledge given to you where it helps. Reply with one line of the "
    "form 'Answer: <short answer>' and nothing else."
)


def reader_prompt(question: str, knowledge: Sequence[Hit]) -> list[dict[str, str]]:
    if not knowledge:  # no retrieval, or the filter's back-off
        return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": f"Question: {question}"}]
    body = "\n".join(f"[{i}] {format_document(h.title, h.text)}" for i, h in enumerate(knowledge, 1))
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": f"Knowledge:\n{body}\n\nQuestion: {question}"},
    ]


def mixed_order(lists: Sequence[Sequence[Hit]], cap: int) -> list[Hit]:
    """Interleave the queries' lists (1st of each, then 2nd of each, ...), dropping repeated ids, up to cap."""
    out, seen = [], set()
    for rank in range(max((len(x) for x in lists), default=0)):
        for lst in lists:
            if rank < len(lst) and lst[rank].id not in seen:
                seen.add(lst[rank].id)
                out.append(lst[rank])
                if len(out) >= cap:
                    return out
    return out


# -- a separate model served by path (fine-tuned rewriter / filter) -----------------------------------------


@register_backend("erm4-model")
class PathModelBackend:
    """`Call("erm4-model", "generate", [{"model": folder, "prompt": ..., "sampling": SamplingSpec}])` -> Completion each.
    One generator per folder, built like the run's generator (generation.backend) with generation.model=folder."""

    def __init__(self, cfg, backends=None):
        self.cfg = cfg
        self._gens: dict[str, Any] = {}

    def generate(self, items: list[dict]) -> list[Completion]:
        out: list[Any] = [None] * len(items)
        for model in dict.fromkeys(it["model"] for it in items):
            if model not in self._gens:
                self._gens[model] = make_generator(with_values(self.cfg, {"generation.model": model}))
            idx = [i for i, it in enumerate(items) if it["model"] == model]
            res = self._gens[model].generate(
                [items[i]["prompt"] for i in idx], [items[i]["sampling"] for i in idx], [True] * len(idx)
            )
            for i, r in zip(idx, res):
                if isinstance(r, BaseException):
                    raise r
                out[i] = r
        return out


def _generate(
    prompts: list, spec: SamplingSpec, model: str | None, stage: str
) -> Generator[Request, Any, list[Completion]]:
    if model:
        return (
            yield Call(
                "erm4-model",
                "generate",
                [{"model": model, "prompt": p, "sampling": spec} for p in prompts],
                stage="generation",
            )
        )
    return (yield Generate(prompts, sampling=spec, stage=stage))


# Constrained outputs (vLLM structured outputs; other backends are parsed as they come, see the parsers):
# the Rewriter+ format '{s}**{q1}**{q2}...' (Sec. 3.1), one query line, and one NLI label (Sec. 3.2).
REWRITE_PLUS_REGEX = r"[^*\n]{3,300}(\*\*[^*\n]{2,200}){1,%d}"
QUERY_REGEX = r"[^\n]{2,300}"


# -- parameters ------------------------------------------------------------------------------------------------


class RewriteReadParams(MethodParams):
    k: int = Field(
        10, ge=1, le=100, description="knowledge instances retrieved per query (n = 10, Sec. 4.1; n = 5 in Sec. 6)"
    )
    retriever: Literal["bm25", "dense"] | None = Field(None, description="None: retrieval.retriever")
    max_knowledge: int = Field(
        30,
        ge=1,
        description="knowledge instances in the reader's prompt, mixed order "
        "(up to 30, Sec. 4.1); lower it for a short model context",
    )
    rewrite_tokens: int = Field(96, ge=8, description="new tokens for the rewriter's output")
    rewriter_model: str | None = Field(
        None,
        description="model folder for the rewriter (fine-tuned / LoRA-merged); "
        "None: the run's generator with the prompt",
    )


class RewriterPlusParams(RewriteReadParams):
    max_queries: int = Field(5, ge=1, le=20, description="queries of Q kept (the paper's examples use 3)")
    authors: AuthorsErm4 | None = Field(None, description=AUTHORS_SWITCH)


class Erm4Params(RewriterPlusParams):
    filter: Literal["llm", "classifier", "none"] = Field(
        "llm",
        description="Knowledge Filter: NLI prompt to the generator (or filter_model), a trained cross-encoder, or none",
    )
    hypothesis: Literal["strong", "weak"] = Field(
        "strong", description="NLI hypothesis: strong (single-hop, the paper's template) or weak (multi-hop), Sec. 3.2"
    )
    filter_model: str | None = Field(None, description="model folder for the NLI filter; None: the run's generator")
    filter_tokens: int = Field(8, ge=1, description="new tokens for an NLI judgment (one label word is asked for)")
    classifier: str = Field(
        "default",
        description="filter=classifier: classifier name or folder (dynrag train-classifier --set classifier.task=pair)",
    )
    threshold: float = Field(
        0.5, gt=0.0, lt=1.0, description="filter=classifier: P(relevant) >= threshold = entailment"
    )
    reservoir: bool = Field(
        True, description="use the Memory Knowledge Reservoir and the Retrieval Trigger (Sec. 3.3-3.4)"
    )
    reservoir_path: str | None = Field(
        None,
        description="a reservoir shared across runs (SQLite file; one job at a time); None: the run's own, "
        "<out>/erm4-reservoir.sqlite, empty at its first batch and kept across a resume. Pairs are keyed by "
        "title (Sec. 3.3): one passage per Wikipedia article, the last cached",
    )
    tau: float = Field(
        0.6,
        ge=-1.0,
        le=1.0,
        description="similarity threshold tau of Pop(q) (0.6: the paper's fastest setting, Table 2)",
    )
    theta: int = Field(
        3, ge=1, description="popularity threshold theta: Pop(q) >= theta answers q from memory (Sec. 6)"
    )
    memory_k: int | None = Field(
        None,
        ge=1,
        description="memory knowledge per in-boundary query, most similar first "
        "(None: every entry with S >= tau; the prompt cap still applies)",
    )
    update_reservoir: bool = Field(
        True, description="cache each question's filtered external knowledge after its answer (the authors' code)"
    )

    def for_output(self, out: str) -> Erm4Params:
        """The run's own reservoir under `out` when none is named; a named one as an absolute path."""
        if not self.reservoir:
            return self
        if self.reservoir_path:
            return self.model_copy(update={"reservoir_path": os.path.abspath(self.reservoir_path)})
        if "://" in out and not out.startswith("file://"):
            raise MethodError(
                f"erm4: the reservoir is a local SQLite file, so with --out {out} name one "
                "(method.params.reservoir_path=PATH) or set method.params.reservoir=false"
            )
        return self.model_copy(update={"reservoir_path": _reservoir.run_reservoir_path(out.removeprefix("file://"))})

    def state_files(self) -> list[str]:
        return [self.reservoir_path] if self.reservoir and self.reservoir_path else []


# -- programs ------------------------------------------------------------------------------------------------------


def _read(question: str, knowledge: list[Hit], extra: dict, triggered: bool) -> Generator[Request, Any, Answer]:
    """The reader over the knowledge that fits the window, the lowest ranked (the last in mixed order) dropped
    first (`dropped_knowledge` in the row); the question alone not fitting is the question's error."""
    sizes = [len(format_document(h.title, h.text)) + 6 for h in reversed(knowledge)]
    out, dropped = yield from fit_generate(
        lambda d: reader_prompt(question, knowledge[: len(knowledge) - d]), sizes, SamplingSpec(), True, "answer"
    )
    if full(out):
        raise too_long(out)
    kept = knowledge[: len(knowledge) - dropped]
    if dropped:
        extra = {**extra, "dropped_knowledge": dropped}
    return Answer(extract_answer(out.text), out.text, used_docs=kept, retrieval_triggered=triggered, extra=extra)


def _rewrite_plus(q: Question, p: RewriterPlusParams) -> Generator[Request, Any, tuple[str, list[str], bool]]:
    spec = SamplingSpec(max_tokens=p.rewrite_tokens, regex=REWRITE_PLUS_REGEX % p.max_queries)
    out = (yield from _generate([rewriter_plus_prompt(q.question)], spec, p.rewriter_model, "rewrite"))[0]
    return parse_rewriter_plus(out.text, q.question, p.max_queries)


@register_method(
    "rewrite-retrieve-read",
    params=RewriteReadParams,
    paper=f"{PAPER}, Sec. 4.3 (ii); Ma et al., 2023",
    description="ERM4 config (ii): rewrite into one query, retrieve, read with the original question",
)
def rewrite_retrieve_read(q: Question, p: RewriteReadParams):
    spec = SamplingSpec(max_tokens=p.rewrite_tokens, regex=QUERY_REGEX)
    out = (yield from _generate([rewriter_prompt(q.question)], spec, p.rewriter_model, "rewrite"))[0]
    query, parsed = parse_query(out.text, q.question)
    hits = (yield Retrieve([query], k=p.k, retriever=p.retriever, step="external", path="query"))[0]
    knowledge = mixed_order([hits], p.max_knowledge)
    extra = {
        "queries": [query],
        "rewrite_parsed": parsed,
        "external_knowledge": len(hits),
        "memory_knowledge": 0,
        "irrelevant_knowledge": 0,
    }
    return (yield from _read(q.question, knowledge, extra, True))


@register_method(
    "erm4-rewriter",
    params=RewriterPlusParams,
    paper=f"{PAPER}, Sec. 3.1, Sec. 4.3 (iii)",
    description="ERM4 config (iii): Query Rewriter+ (s and queries Q), retrieve per query, read s",
)
def erm4_rewriter(q: Question, p: RewriterPlusParams):
    if p.authors is not None:
        return (yield from erm4_authors.program(q, p.authors.model_copy(update={"filter_prompt": None}), p.retriever))
    s, queries, parsed = yield from _rewrite_plus(q, p)
    lists = yield Retrieve(queries, k=p.k, retriever=p.retriever, step="external")
    knowledge = mixed_order(lists, p.max_knowledge)
    extra = {
        "rewritten": s,
        "queries": queries,
        "rewrite_parsed": parsed,
        "external_knowledge": len(mixed_order(lists, 10**9)),
        "memory_knowledge": 0,
        "irrelevant_knowledge": 0,
    }
    return (yield from _read(s, knowledge, extra, True))


def knowledge_filter(s: str, knowledge: list[Hit], p: Erm4Params) -> Generator[Request, Any, tuple[list[bool], int]]:
    """F(s, k) -> j; True keeps k (entailment), Sec. 3.2. Also returns how many judgments named no label
    (each counted as neutral, so its knowledge is dropped)."""
    if p.filter == "none" or not knowledge:
        return [True] * len(knowledge), 0
    if p.filter == "classifier":
        scores = yield Score([(s, format_document(h.title, h.text)) for h in knowledge], classifier=p.classifier)
        return [sc >= p.threshold for sc in scores], 0
    spec = SamplingSpec(max_tokens=p.filter_tokens, choice=NLI_LABELS)
    labels = [
        nli_label(o.text)
        for o in (
            yield from _generate([nli_prompt(s, h, p.hypothesis) for h in knowledge], spec, p.filter_model, "filter")
        )
    ]
    return [lab == "entailment" for lab in labels], labels.count(None)


@register_method(
    "erm4",
    params=Erm4Params,
    paper=f"{PAPER}, Sec. 3.1-3.4, Sec. 4.3 (iv), Sec. 6",
    description="ERM4: Rewriter+, trigger over the memory reservoir, retrieve, NLI filter, read s",
)
def erm4(q: Question, p: Erm4Params):
    if p.authors is not None:  # their main.py: no reservoir, the filter always on
        return (yield from erm4_authors.program(q, p.authors, p.retriever))
    s, queries, parsed = yield from _rewrite_plus(q, p)
    memory: dict[int, list[Hit]] = {}
    pops: list[int] = []
    if p.reservoir:
        vecs = yield Embed(queries)
        looks = yield Call(
            "reservoir",
            "lookup",
            [{"store": p.reservoir_path, "vector": v, "tau": p.tau, "limit": p.memory_k} for v in vecs],
            stage="retrieval",
        )
        pops = [lk["pop"] for lk in looks]
        memory = {i: lk["hits"] for i, lk in enumerate(looks) if _reservoir.within_boundary(lk["pop"], p.theta)}
    external_q = [i for i in range(len(queries)) if i not in memory]
    external: dict[int, list[Hit]] = {}
    if external_q:
        lists = yield Retrieve([queries[i] for i in external_q], k=p.k, retriever=p.retriever, step="external")
        external = dict(zip(external_q, lists))
    per_query = [memory.get(i) or external.get(i) or [] for i in range(len(queries))]
    knowledge = mixed_order(per_query, p.max_knowledge)
    keep, unparsed = yield from knowledge_filter(s, knowledge, p)
    kept = [h for h, ok in zip(knowledge, keep) if ok]
    ext_unique = mixed_order([external[i] for i in external_q], 10**9)
    extra = {
        "rewritten": s,
        "queries": queries,
        "rewrite_parsed": parsed,
        "popularity": pops,
        "memory_queries": sorted(memory),
        "external_knowledge": len(ext_unique),
        "memory_knowledge": len(mixed_order([memory[i] for i in sorted(memory)], 10**9)),
        "irrelevant_knowledge": len(knowledge) - len(kept),
        "backoff": bool(knowledge) and not kept,
        "filter_unparsed": unparsed,
    }
    answer = yield from _read(s, kept, extra, bool(external_q))
    # the reservoir caches filtered knowledge (Components.py, RetrievalTrigger); kept memory pairs are there
    remembered = {h.id for hits in memory.values() for h in hits}
    new = [h for h in kept if h.id not in remembered]
    if p.reservoir and p.update_reservoir and new:
        title_vecs = yield Embed([h.title for h in new])
        yield Call(
            "reservoir",
            "add",
            [
                {"store": p.reservoir_path, "title": h.title, "content": h.text, "id": h.id, "vector": v}
                for h, v in zip(new, title_vecs)
            ],
            stage="retrieval",
        )
    return answer
