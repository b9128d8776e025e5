"""A context window that fills up (issue 48, item 5): every multi-round method, on its scripted generator behind a
small window (`fakes.Windowed`: a prompt's tokens are its words, checked by the generators' own
`chat.window_check`), ends its question as its authors' code does (pipeline/methods/window.py) and never as an
error row, except where the first prompt does not fit. Each test first runs the method with no window to
measure its prompts, then sets the window between two of them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fakes import FakeAttention, MemoryRetriever, RecordingGenerator, Windowed
from test_dragin_engine import ScriptedGenerator
from test_multiround_methods import IRCOT_CHAIN, SELF_ASK, Script
from test_search_methods import R1_CHAIN, Turns

from pipeline.backends import Backends
from pipeline.backends.chat import PromptTooLong, window_check
from pipeline.backends.hf_gen import HfGenerator
from pipeline.backends.vllm_gen import VllmGenerator
from pipeline.config import DynragConfig, GenerationConfig
from pipeline.engine.continuous import ContinuousEngine
from pipeline.engine.core import Engine
from pipeline.engine.requests import WINDOW, Completion, Question, SamplingSpec
from pipeline.io.output import SCHEMA, make_row, summarize, write_part
from pipeline.methods.ircot import SHOTS
from pipeline.methods.registry import get_method

Q = "Who directed the film that won Best Picture in 1998?"
PASSAGES = [
    ("p1", "Titanic (1997 film)", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Rome", "Rome is the capital of Italy."),
    ("p4", "Academy Awards", "The Academy Awards honour films."),
    ("p5", "Ottawa", "Ottawa is the capital of Canada."),
]
DRAGIN_PASSAGES = [
    ("p1", "Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg."),
    ("p2", "Paris", "Paris is the capital of France."),
    ("p3", "Rome", "Rome is the capital of Italy."),
]


def answer(method, params, inner, window=10**6, passages=PASSAGES, question=Q, continuous=False):
    """The one question's outcome with `inner` behind a window of `window` tokens, and the Windowed generator."""
    gen = Windowed(inner, window)
    backends = Backends(
        DynragConfig(), generator=gen, retriever=MemoryRetriever(passages), named={"attention": FakeAttention()}
    )
    engine = ContinuousEngine(backends, batch_wait_s=0.001) if continuous else Engine(backends)
    spec = get_method(method)
    try:
        (o,) = engine.run(
            [Question("1", question, answers=["x"], dataset="hotpotqa")], spec.program, spec.params(params)
        )
    finally:
        engine.close()
    return o, gen


def measure(method, params, make, **kw) -> list[int]:
    """The tokens of each prompt the method runs with no window."""
    o, gen = answer(method, params, make(), **kw)
    assert o.error is None and o.trace.window_full == 0
    return [n for n, _ in gen.ran()]


def last_prompt(inner) -> str:
    return inner.log[-1][0]


# -- IRCoT: its code's fit_prompt_into_given_limit -------------------------------------------------------------


def test_ircot_drops_exemplars_first_then_the_oldest_paragraphs_and_goes_on():
    sizes = measure("ircot", {"k": 2}, lambda: Script(IRCOT_CHAIN))
    assert len(sizes) == 3
    # step 3 is one token short: the first exemplar goes, the reasoning goes on to its answer
    inner = Script(IRCOT_CHAIN)
    o, gen = answer("ircot", {"k": 2}, inner, sizes[2] + 64 - 1)
    a = o.answer
    assert o.error is None and a.prediction == "James Cameron" and a.extra["stopped"] == "answer"
    assert (a.extra["dropped_exemplars"], a.extra["dropped_paragraphs"]) == (1, 0) and o.trace.window_full == 1
    assert SHOTS[0] not in last_prompt(inner) and SHOTS[1] in last_prompt(inner)
    assert o.trace.llm_calls == 3 and gen.log[-2][1].fit  # every step is fitted, as the reference fits every call
    # no room for any exemplar nor the oldest paragraph: those go too, oldest first
    inner = Script(IRCOT_CHAIN)
    shots = sum(len(s.split()) for s in SHOTS)
    o, _ = answer("ircot", {"k": 2}, inner, sizes[2] - shots + 64 - 1)
    a = o.answer
    assert o.error is None and a.prediction == "James Cameron" and a.extra["dropped_exemplars"] == len(SHOTS)
    assert a.extra["dropped_paragraphs"] >= 1 and o.trace.window_full >= 1
    assert len(a.used_docs) == a.extra["paragraphs"] - a.extra["dropped_paragraphs"]
    oldest = o.trace.retrieved[0]["title"]
    assert f"Wikipedia Title: {oldest}\n" not in last_prompt(inner)
    assert all(f"Wikipedia Title: {h.title}\n" in last_prompt(inner) for h in a.used_docs)


def test_ircot_stops_with_the_forced_answer_where_the_question_and_cot_alone_do_not_fit():
    chain = [(Q + "\nAnswer:", "Titanic won Best Picture in 1998. It was long.\n"), ("So the answer is:", "Cameron")]
    # step 1 fits with every exemplar and paragraph dropped ("Question: <Q>\nAnswer:" and a step's 64 tokens);
    # step 2's, longer by its first sentence, does not: the forced answer (32 tokens) does
    inner = Script(chain)
    o, _ = answer("ircot", {"k": 1}, inner, len(Q.split()) + 2 + 64)
    a = o.answer
    assert o.error is None and a.extra["stopped"] == "window" and a.extra["answer_forced"]
    assert a.prediction == "Cameron" and a.extra["steps"] == 1 and a.used_docs == []
    assert a.extra["dropped_exemplars"] == len(SHOTS) and last_prompt(inner).endswith("So the answer is:")


# -- Search-R1, Search-o1: the rollout ends as at its turn budget ------------------------------------------------


def test_search_r1_forces_the_answer_when_the_next_turn_does_not_fit():
    sizes = measure("search-r1", {"k": 2}, lambda: Turns(R1_CHAIN))
    turns = [R1_CHAIN[0], "James Cameron"]
    inner = Turns(turns)
    o, _ = answer("search-r1", {"k": 2}, inner, sizes[1] + 512 - 1)  # turn 2 leaves no room for 512 tokens
    x = o.answer.extra
    assert (
        o.error is None and x["stopped"] == "window" and x["answer_forced"] and o.answer.prediction == "James Cameron"
    )
    assert (x["turns"], x["searches"], o.trace.llm_calls, o.trace.window_full) == (1, 1, 2, 1)
    # the forced answer continues the whole rollout, its documents included
    assert last_prompt(inner).rstrip().endswith("<answer>") and "Doc 1 (Title:" in last_prompt(inner)
    # where even the short answer does not fit, it continues the rollout the last turn that ran saw
    inner = Turns(turns)
    o, _ = answer("search-r1", {"k": 2}, inner, sizes[1] + 32)
    assert o.error is None and o.answer.prediction == "James Cameron" and o.trace.window_full == 2
    assert last_prompt(inner).rstrip().endswith("<answer>") and "Doc 1 (Title:" not in last_prompt(inner)


def test_search_r1_on_the_continuous_engine_too():
    sizes = measure("search-r1", {"k": 2}, lambda: Turns(R1_CHAIN))
    o, _ = answer("search-r1", {"k": 2}, Turns([R1_CHAIN[0], "James Cameron"]), sizes[1] + 511, continuous=True)
    assert o.error is None and o.answer.extra["stopped"] == "window" and o.answer.prediction == "James Cameron"


O1_TURNS = ["I should look this up. <|begin_search_query|> Best Picture 1998 <|end_search_query|>", "James Cameron"]
REFINE = "**Final Information**\n\nTitanic won; James Cameron directed it."


def test_search_o1_ends_the_rollout_when_reason_in_documents_does_not_fit():
    sizes = measure("search-o1", {"k": 2}, lambda: Turns(O1_TURNS, refine=REFINE))
    inner = Turns(O1_TURNS, refine=REFINE)
    o, _ = answer("search-o1", {"k": 2}, inner, sizes[1] + 256 - 1)  # the Reason-in-Documents call's room is short
    x = o.answer.extra
    assert (
        o.error is None and x["stopped"] == "window" and x["answer_forced"] and o.answer.prediction == "James Cameron"
    )
    assert x["searches"] == 1 and x["refine_tokens"] == 0 and o.trace.window_full == 1
    assert "Titanic won; James" not in last_prompt(inner) and last_prompt(inner).rstrip().endswith("\\boxed{")


# -- Self-Ask, ITER-RETGEN -----------------------------------------------------------------------------------------


def test_self_ask_forces_the_final_answer_when_the_next_step_does_not_fit():
    replies = [("So the final answer is:", " James Cameron")] + SELF_ASK
    sizes = measure("self-ask", {"k": 2}, lambda: Script(replies))
    step2 = sizes[2]  # step 1, its follow-up's answer, step 2
    o, _ = answer("self-ask", {"k": 2}, Script(replies), step2 + 64 - 1)
    a = o.answer
    assert o.error is None and a.extra["stopped"] == "window" and a.extra["answer_forced"]
    assert a.prediction == "James Cameron" and len(a.extra["follow_ups"]) == 1 and o.trace.window_full == 1
    # no room for the forced answer either: the last intermediate answer is what the chain has
    o, _ = answer("self-ask", {"k": 2}, Script(replies), step2 + 32 + 4)
    assert o.error is None and o.answer.prediction == "Titanic" and o.trace.window_full == 2


def test_iter_retgen_keeps_the_last_generation_when_the_next_iteration_does_not_fit():
    replies = [("Answer:", "Titanic was directed by James Cameron. So the answer is: James Cameron")]
    sizes = measure("iter-retgen", {"k": 2}, lambda: Script(replies))
    window = sizes[1] + 32 - 1
    assert sizes[0] < window
    o, _ = answer("iter-retgen", {"k": 2}, Script(replies), window)
    a = o.answer
    assert o.error is None and a.prediction == "James Cameron" and a.extra["stopped"] == "window"
    assert a.extra["iterations"] == 1 and o.trace.llm_calls == 1 and o.trace.retrieval_calls == 2
    assert {h.id for h in a.used_docs} == {d["id"] for d in o.trace.retrieved if d["round"] == 1}


# -- FLARE, DRAGIN: the rounds end as at the generate length, Appendix B's answer follows -----------------------------


@pytest.mark.parametrize("method", ["flare", "dragin"])
def test_flare_and_dragin_answer_when_the_round_after_a_retrieval_does_not_fit(method):
    kw = {"passages": DRAGIN_PASSAGES, "question": "Who directed the film Jaws number 0?"}
    sizes = measure(method, {}, ScriptedGenerator, **kw)
    assert len(sizes) == 2  # a round without documents, then one with them
    o, _ = answer(method, {}, ScriptedGenerator(), sizes[1] + 100 - 1, **kw)  # no room for the generate length
    a = o.answer
    assert o.error is None and a.extra["stopped"] == "window" and a.extra["retrievals"] == 1
    assert a.extra["answer_forced"] and a.prediction == "Unknown" and a.used_docs and o.trace.window_full == 1
    # no room for the forced answer beside the documents: it is asked from the reasoning alone
    o, gen = answer(method, {}, ScriptedGenerator(), sizes[1] + 24 + 2, **kw)
    a = o.answer
    assert o.error is None and a.prediction == "Unknown" and a.used_docs == [] and o.trace.window_full == 2
    assert gen.log[-1][0] < sizes[1] and gen.log[-1][2]  # the last prompt, without the documents, ran


# -- ERM4: the reader reads the knowledge that fits --------------------------------------------------------------


def erm4_reply(prompt):
    text = str(prompt)
    if "search-friendly Queries" in text:
        return "Who directed Titanic, the 1998 Best Picture?**Titanic film**James Cameron director**Academy Awards 1998"
    return "Answer: James Cameron"


def test_erm4_reader_drops_the_lowest_ranked_knowledge_to_fit():
    params = {"k": 2, "reservoir": False, "filter": "none"}
    long = [(i, t, f"{x} {' '.join(['more'] * 40)}") for i, t, x in PASSAGES]  # the reader's prompt the longest
    full_run, gen = answer("erm4", params, RecordingGenerator(erm4_reply), passages=long)
    knowledge = [h.id for h in full_run.answer.used_docs]
    assert len(knowledge) >= 3 and "dropped_knowledge" not in full_run.answer.extra
    window = gen.ran()[-1][0] + 32 - 1
    o, _ = answer("erm4", params, RecordingGenerator(erm4_reply), window, passages=long)
    a = o.answer
    assert o.error is None and a.prediction == "James Cameron" and a.extra["dropped_knowledge"] >= 1
    assert [h.id for h in a.used_docs] == knowledge[: len(knowledge) - a.extra["dropped_knowledge"]]
    assert o.trace.window_full >= 1


# -- the first prompt: the only error row -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["ircot", "self-ask", "iter-retgen", "flare", "dragin", "search-r1", "search-o1", "erm4"]
)
def test_only_a_first_prompt_that_does_not_fit_is_an_error_row(method):
    params = {"reservoir": False} if method == "erm4" else {}
    o, _ = answer(method, params, Script([], default="x"), 8)
    assert o.answer is None and o.error.startswith("PromptTooLong") and o.error_kind == "input"


# -- the check, the generators and the row -----------------------------------------------------------------------


def test_window_check_runs_cuts_or_returns_the_empty_completion():
    assert window_check(10, SamplingSpec(max_tokens=50), 64, 32) is None  # runs, max_tokens cut to 54 by the backend
    assert window_check(10, SamplingSpec(max_tokens=50, fit=True), 64, 32) is None
    out = window_check(40, SamplingSpec(fit=True), 64, 32)  # max_new_tokens: 32 > 24 left
    assert out is not None and (out.finish_reason, out.over, out.prompt_tokens, out.text) == (WINDOW, 8, 40, "")
    with pytest.raises(PromptTooLong, match="prompt of 64 tokens does not fit generation.max_model_len=64"):
        window_check(64, SamplingSpec(), 64, 32)
    assert window_check(64, SamplingSpec(fit=True), 64, 32).finish_reason == WINDOW


class WordTokenizer:
    chat_template = None
    pad_token_id = eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(range(1, len(text.split()) + 1))}


@pytest.mark.parametrize("backend", [VllmGenerator, HfGenerator])
def test_the_generators_check_every_prompt_against_the_window(backend):
    gen = backend.__new__(backend)
    gen.cfg, gen.tokenizer = GenerationConfig(max_model_len=64), WordTokenizer()
    prompts = ["a " * 40, "a " * 70, "a " * 70]
    specs = [SamplingSpec(fit=True), SamplingSpec(), SamplingSpec(max_tokens=4, fit=True)]
    outs = gen.generate(prompts, specs, [False] * 3)  # nothing runs: no model needed
    assert isinstance(outs[0], Completion) and (outs[0].finish_reason, outs[0].over) == (WINDOW, 8)
    assert isinstance(outs[1], PromptTooLong) and outs[2].finish_reason == WINDOW


def test_the_row_says_the_window_was_full_and_the_summary_counts_it(tmp_path):
    sizes = measure("search-r1", {"k": 2}, lambda: Turns(R1_CHAIN))
    rows = []
    for window in (10**6, sizes[1] + 511):
        o, _ = answer("search-r1", {"k": 2}, Turns([R1_CHAIN[0], "James Cameron", "x"]), window)
        rows.append(make_row(o, run_id="r", method="search-r1", params_json="{}", chash="h", model="m"))
    assert [r["window_full"] for r in rows] == [False, True]
    rows[1]["question_id"] = "2"
    write_part(str(tmp_path / "new"), rows)
    assert summarize(str(tmp_path / "new"))["window_full"] == 1
    # a part written before the column reads as none
    old = pa.Table.from_pylist(rows, schema=SCHEMA).drop_columns(["window_full"])
    (tmp_path / "old" / "parts").mkdir(parents=True)
    pq.write_table(old, tmp_path / "old" / "parts" / "part-old.parquet")
    assert summarize(str(tmp_path / "old"))["window_full"] == 0
