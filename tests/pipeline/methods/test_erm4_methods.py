"""ERM4's Query Rewriter+ parser (Sec. 3.1) on well-formed and malformed outputs, the NLI judgment parser
(Sec. 3.2), mixed order, and the four configurations through the engine with fakes (reservoir on disk)."""

import re

import pytest
from erm4_fakes import PASSAGES, WordEmbedder, reply
from fakes import MemoryRetriever, RecordingGenerator

from indexing.search.hits import Hit
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Question
from pipeline.methods.erm4 import mixed_order, nli_label, parse_query, parse_rewriter_plus
from pipeline.methods.registry import MethodError, get_method
from pipeline.methods.reservoir import Reservoir

Q = "who directed the film that won best picture in 1998?"


# -- Rewriter+ output parser ------------------------------------------------------------------------------


def test_parser_reads_the_papers_format():
    s, qs, ok = parse_rewriter_plus(
        "Which film won Best Picture in 1998, and who directed it?**Best Picture 1998**Titanic director**  ", Q
    )
    assert ok and s == "Which film won Best Picture in 1998, and who directed it?"
    assert qs == ["Best Picture 1998", "Titanic director"]


def test_parser_reads_labelled_lines_bullets_and_markdown_bold():
    text = (
        "**Rewritten Question:** Who directed the 1998 Best Picture winner?\n**Queries:**\n"
        "1. Best Picture 1998\n2. Best Picture 1998\n- James Cameron films"
    )
    s, qs, ok = parse_rewriter_plus(text, Q)
    assert ok and s == "Who directed the 1998 Best Picture winner?"
    # '**' splits first, the label-only parts vanish; the line items of the last part stay together
    assert qs and all("Queries" not in x for x in qs)
    lines = "Rewritten Question: Who directed it?\nQuery 1: Best Picture 1998\nQuery 2: Titanic director"
    assert parse_rewriter_plus(lines, Q) == ("Who directed it?", ["Best Picture 1998", "Titanic director"], True)
    s, qs, ok = parse_rewriter_plus("A?**q1**q1**q2**q3**q4", Q, max_queries=2)
    assert qs == ["q1", "q2"]  # duplicates dropped, then capped


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "**",
        "****",
        "Who directed it?",
        "```\n```",
        "x" * 400 + "**" + "y" * 400,
        "Rewritten Question:**Queries:",
    ],
)
def test_malformed_output_falls_back_to_the_original_question(bad):
    assert parse_rewriter_plus(bad, Q) == (Q, [Q], False)


def test_single_query_parser():
    assert parse_query("Query: Best Picture 1998\nsomething else", Q) == ("Best Picture 1998", True)
    assert parse_query("\n\n", Q) == (Q, False)


def test_nli_parser():
    assert nli_label("Entailment.") == "entailment"
    assert nli_label("The knowledge names the director.**entailment") == "entailment"
    assert nli_label("not entailment**Neutral") == "neutral"
    assert nli_label("contradiction, not neutral") == "contradiction"
    assert nli_label("I cannot tell") is None and nli_label("[NLI result]:") is None  # counted as unparsed


def test_mixed_order_interleaves_drops_repeats_and_caps():
    h = lambda i: Hit(i, i, i, 0.0)  # noqa: E731
    lists = [[h("a"), h("b"), h("c")], [h("b"), h("d")], []]
    assert [x.id for x in mixed_order(lists, 10)] == ["a", "b", "d", "c"]
    assert [x.id for x in mixed_order(lists, 2)] == ["a", "b"]


# -- the programs on the engine ----------------------------------------------------------------------------


def engine_for(tmp_path, generate=reply):
    cfg = DynragConfig()
    cfg.paths.cache_dir = str(tmp_path / "cache")
    gen, ret, emb = RecordingGenerator(generate), MemoryRetriever(PASSAGES), WordEmbedder()
    return Engine(Backends(cfg, generator=gen, retriever=ret, embedder=emb)), gen, ret


def run(engine, method, params, questions):
    spec = get_method(method)
    out = engine.run(questions, spec.program, spec.params(params))
    assert all(o.error is None for o in out), [o.error for o in out]
    return out


def test_rewrite_retrieve_read_and_rewriter_plus(tmp_path):
    engine, gen, ret = engine_for(tmp_path)
    qs = [Question("1", Q, answers=["James Cameron"])]
    o = run(engine, "rewrite-retrieve-read", {"k": 2}, qs)[0]
    assert o.answer.extra["queries"] == ["Titanic director"] and o.answer.prediction == "James Cameron"
    assert "Question: " + Q in str(gen_prompts(gen, engine)[-1])  # config (ii) reads the original question
    o = run(engine, "erm4-rewriter", {"k": 2, "max_knowledge": 3}, qs)[0]
    assert o.answer.extra["queries"] == ["Titanic film", "James Cameron director", "Academy Awards 1998"]
    assert ret.calls[-1] == 3  # one batched search over the three queries
    assert len(o.answer.used_docs) == 3 and o.answer.extra["external_knowledge"] >= 3
    assert "Who directed Titanic" in str(gen_prompts(gen, engine)[-1])  # config (iii) reads s


def gen_prompts(gen, engine):
    return engine.backends.generator.prompts


class PromptLog(RecordingGenerator):
    def __init__(self, fn):
        super().__init__(fn)
        self.prompts = []

    def generate(self, prompts, samplings, chats):
        self.prompts.extend(prompts)
        self.samplings = getattr(self, "samplings", []) + list(samplings)
        return super().generate(prompts, samplings, chats)


@pytest.fixture(autouse=True)
def _log_prompts(monkeypatch):
    monkeypatch.setattr("test_erm4_methods.RecordingGenerator", PromptLog)


def test_erm4_filter_keeps_entailment_and_backs_off(tmp_path):
    engine, gen, ret = engine_for(tmp_path)
    qs = [Question("1", Q, answers=["James Cameron"])]
    o = run(engine, "erm4", {"k": 2, "reservoir": False}, qs)[0]
    ex = o.answer.extra
    assert all("Cameron" in h.text for h in o.answer.used_docs) and o.answer.used_docs
    assert ex["irrelevant_knowledge"] == ex["external_knowledge"] - len(o.answer.used_docs) > 0
    assert ex["backoff"] is False and ex["memory_knowledge"] == 0
    # nothing entailed: back-off, the reader gets no knowledge
    engine, gen, _ = engine_for(tmp_path, lambda p: "neutral" if "NLI" in str(p) else reply(p))
    o = run(engine, "erm4", {"k": 2, "reservoir": False}, qs)[0]
    assert o.answer.extra["backoff"] is True and o.answer.used_docs == []
    assert "Knowledge:" not in str(gen.prompts[-1])


def test_erm4_asks_for_constrained_outputs_and_counts_unparsed_judgments(tmp_path):
    """The filter asks for one NLI label and the Rewriter+ for its '**' format (vLLM structured outputs); a backend
    that ignores that and answers '[NLI result]:' gets each such judgment counted, its knowledge dropped."""
    engine, gen, _ = engine_for(tmp_path, lambda p: "[NLI result]:" if "NLI" in str(p) else reply(p))
    o = run(engine, "erm4", {"k": 2, "reservoir": False}, [Question("1", Q, answers=["James Cameron"])])[0]
    ex = o.answer.extra
    assert ex["filter_unparsed"] == ex["external_knowledge"] > 0 and ex["backoff"] is True
    by_prompt = {("NLI" in str(pr), "search-friendly" in str(pr)): s for pr, s in zip(gen.prompts, gen.samplings)}
    assert by_prompt[(True, False)].choice == ("entailment", "contradiction", "neutral")
    rewrite = by_prompt[(False, True)].regex
    assert re.fullmatch(rewrite, "Who directed it?**Titanic film**James Cameron") and not re.fullmatch(
        rewrite, "no queries"
    )


def test_erm4_trigger_answers_from_the_reservoir_the_second_time(tmp_path):
    store = str(tmp_path / "res.sqlite")
    params = {"k": 2, "reservoir_path": store, "tau": 0.3, "theta": 1, "filter": "none"}
    engine, gen, ret = engine_for(tmp_path)
    qs = [Question("1", Q), Question("2", "which film won in 1998?")]
    first = run(engine, "erm4", params, qs)
    assert all(o.answer.extra["memory_knowledge"] == 0 for o in first)  # empty reservoir: Pop = 0
    assert all(o.answer.retrieval_triggered for o in first)
    cached = Reservoir(store)
    assert len(cached) == len({d["title"] for o in first for d in o.trace.retrieved})
    searches = len(ret.calls)
    second = run(engine, "erm4", params, qs)
    ex = second[0].answer.extra
    # each query shares words with exactly one cached title (S about 0.82-1.0 >= tau, the rest about 0.005)
    assert ex["popularity"] == [1, 1, 1] and ex["memory_queries"] == [0, 1, 2]
    assert ex["memory_knowledge"] == 3 and ex["external_knowledge"] == 0
    assert len(ret.calls) == searches and second[0].answer.retrieval_triggered is False
    # theta = 2 > Pop: every query is outside the boundary again
    again = run(engine, "erm4", {**params, "theta": 2, "update_reservoir": False}, qs)
    assert again[0].answer.extra["memory_queries"] == [] and again[0].answer.extra["external_knowledge"] > 0
    # tau = 1.0: only "Titanic film" (the same bag of words as "Titanic (1997 film)", S = 1.0) stays in memory
    third = run(engine, "erm4", {**params, "tau": 1.0, "update_reservoir": False}, qs)
    assert third[0].answer.extra["popularity"] == [1, 0, 0] and third[0].answer.extra["memory_queries"] == [0]


def test_bad_params_are_refused():
    with pytest.raises(MethodError, match="theta"):
        get_method("erm4").params({"theta": 0})
    with pytest.raises(MethodError, match="filter"):
        get_method("erm4").params({"filter": "maybe"})


class FakeScorer:
    def __init__(self):
        self.items = []

    def score(self, items, classifier="default"):
        self.items.append((classifier, list(items)))
        return [0.9 if "Cameron" in d else 0.1 for _, d in items]


def test_erm4_classifier_filter_scores_rewritten_question_knowledge_pairs(tmp_path):
    cfg = DynragConfig()
    scorer = FakeScorer()
    engine = Engine(
        Backends(
            cfg,
            generator=RecordingGenerator(reply),
            retriever=MemoryRetriever(PASSAGES),
            embedder=WordEmbedder(),
            scorer=scorer,
        )
    )
    o = run(
        engine,
        "erm4",
        {"k": 2, "reservoir": False, "filter": "classifier", "classifier": "clf", "threshold": 0.5},
        [Question("1", Q)],
    )[0]
    ((name, items),) = scorer.items  # one batched Score request
    assert name == "clf" and all(q == "Who directed Titanic, the 1998 Best Picture?" for q, _ in items)
    assert [h.title for h in o.answer.used_docs] == ["James Cameron"]
    assert o.answer.extra["irrelevant_knowledge"] == len(items) - 1


def test_a_rewriter_model_folder_serves_the_rewrite_prompts(tmp_path, monkeypatch):
    built = {}

    def fake_make_generator(cfg):
        built[cfg.generation.model] = RecordingGenerator(lambda p: "Rewritten?**only query")
        return built[cfg.generation.model]

    monkeypatch.setattr("pipeline.methods.erm4.make_generator", fake_make_generator)
    engine, gen, ret = engine_for(tmp_path)
    o = run(engine, "erm4-rewriter", {"k": 1, "rewriter_model": str(tmp_path / "lora-merged")}, [Question("1", Q)])[0]
    assert list(built) == [str(tmp_path / "lora-merged")]
    assert o.answer.extra["queries"] == ["only query"] and o.answer.extra["rewritten"] == "Rewritten?"
    assert all("search-friendly" not in str(p) for p in gen.prompts)  # the run's generator only read
    assert o.trace.backend_calls == {"erm4-model.generate": 1}


def test_words_like_query_or_rewritten_inside_a_part_are_kept():
    s, qs, ok = parse_rewriter_plus("Rewritten? yes**Query languages history**[Query 2]: SQL inventor", Q)
    assert (s, qs, ok) == ("Rewritten? yes", ["Query languages history", "SQL inventor"], True)
