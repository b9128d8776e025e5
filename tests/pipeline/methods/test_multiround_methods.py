"""IRCoT, Self-Ask, ITER-RETGEN and SuRe on a scripted generator and an in-memory BM25 retriever, through the
lockstep engine: each program's steps, stop rules, what accumulates, and what a malformed output becomes."""

from __future__ import annotations

import pytest
from fakes import MemoryRetriever

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question
from pipeline.methods.ircot import next_sentence
from pipeline.methods.registry import MethodError, get_method
from pipeline.methods.self_ask import read_step
from pipeline.methods.sure import (
    parse_candidates,
    prefers_first,
    ranking_scores,
    validity,
)

Q = "Who directed the film that won Best Picture in 1998?"
PASSAGES = [
    ("p1", "Titanic (1997 film)", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Rome", "Rome is the capital of Italy."),
    ("p4", "Academy Awards", "The Academy Awards honour films."),
    ("p5", "Ottawa", "Ottawa is the capital of Canada."),
]


class Script:
    """A generator that answers each prompt with the reply whose key ends latest in it (the part the latest
    step added; ties: the first listed), else `default`, and logs every prompt with its sampling."""

    def __init__(self, replies: list[tuple[str, str]], default: str = ""):
        self.replies, self.default = replies, default
        self.log: list[tuple[str, object]] = []  # (prompt as text, sampling)
        self.raw: list[tuple[object, bool]] = []  # (prompt as sent, chat)
        self.calls: list[int] = []

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        if len(self.calls) > 50:
            raise RuntimeError("runaway program: over 50 generate calls")
        out = []
        for p, s, chat in zip(prompts, samplings, chats):
            text = p if isinstance(p, str) else "\n\n".join(m["content"] for m in p)
            self.log.append((text, s))
            self.raw.append((p, chat))
            ends = [(text.rfind(key) + len(key), -i) for i, (key, _) in enumerate(self.replies) if key in text]
            reply = self.replies[-max(ends)[1]][1] if ends else self.default
            out.append(Completion(reply, prompt_tokens=len(text.split()), completion_tokens=len(reply.split()) + 1))
        return out


# the batching counted here is the methods': the retrieval cache would fold repeated queries
NO_CACHE = DynragConfig.model_validate({"answer": {"retrieval_cache": 0}})


def run(method: str, params: dict, replies: list[tuple[str, str]], default: str = "", questions=None):
    gen, ret = Script(replies, default), MemoryRetriever(PASSAGES)
    engine = Engine(Backends(NO_CACHE, generator=gen, retriever=ret))
    spec = get_method(method)
    outs = engine.run(questions or [Question("1", Q, answers=["James Cameron"])], spec.program, spec.params(params))
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs, gen, ret


def steps(o):
    return [(d["step"], d["round"]) for d in o.trace.retrieved]


# -- IRCoT ---------------------------------------------------------------------------------------------------

IRCOT_CHAIN = [
    (Q + "\nAnswer:", "Titanic won Best Picture in 1998. It was long.\n"),
    ("in 1998.", "Titanic was directed by James Cameron."),
    ("by James Cameron.", "So the answer is: James Cameron."),
]


def test_ircot_reasons_one_sentence_a_step_and_retrieves_with_each():
    (o,), gen, ret = run("ircot", {"k": 2}, IRCOT_CHAIN)
    a = o.answer
    assert a.prediction == "James Cameron" and a.extra["stopped"] == "answer" and not a.extra["answer_forced"]
    # only the first sentence of the first output is kept; it and the next one are the queries
    assert a.extra["cot"] == [
        "Titanic won Best Picture in 1998.",
        "Titanic was directed by James Cameron.",
        "So the answer is: James Cameron.",
    ]
    assert a.extra["queries"] == [Q, "Titanic won Best Picture in 1998.", "Titanic was directed by James Cameron."]
    assert steps(o) == [("step-0", 1)] * 2 + [("step-1", 2)] * 2 + [("step-2", 3)] * 2
    assert o.trace.llm_calls == 3 and o.trace.retrieval_calls == 3 and ret.calls == [1, 1, 1]
    # the prompt of step 2 holds the first sentence and every paragraph found so far, each once
    second = gen.log[1][0]
    assert second.rstrip().endswith("Answer: Titanic won Best Picture in 1998.")
    ids = [h.id for h in a.used_docs]
    assert len(ids) == len(set(ids)) and all(f"Wikipedia Title: {h.title}\n" in gen.log[2][0] for h in a.used_docs)
    assert all(s.stop == ("\n",) for _, s in gen.log)


def test_ircot_caps_paragraphs_and_stops_retrieving_when_full():
    chain = [
        (Q + "\nAnswer:", "Rome is the capital of Italy."),
        ("of Italy.", "Ottawa is a capital too."),
        ("capital too.", "So the answer is: Rome"),
    ]
    (o,), _, _ = run("ircot", {"k": 2, "max_paragraphs": 3}, chain)
    # p1, p2 for the question; then p3 and p5 match "capital": p3 fills the cap, p5 is dropped
    assert [h.id for h in o.answer.used_docs] == ["p1", "p2", "p3"] and o.answer.extra["paragraphs"] == 3
    assert o.trace.retrieval_calls == 2 and o.trace.llm_calls == 3  # the full collection: step 2 retrieves nothing


def test_ircot_max_steps_forces_the_answer():
    (o,), gen, _ = run("ircot", {"k": 1, "max_steps": 2}, IRCOT_CHAIN[:2] + [("So the answer is:", "Cameron\nmore")])
    a = o.answer
    assert a.extra["stopped"] == "max_steps" and a.extra["answer_forced"] and a.prediction == "Cameron"
    assert o.trace.llm_calls == 3 and o.trace.retrieval_calls == 2  # no retrieval after the last step
    assert gen.log[-1][0].endswith("James Cameron. So the answer is:")


@pytest.mark.parametrize("bad,stopped", [("", "empty"), (" \t ", "empty"), ("So the answer is:", "empty answer")])
def test_ircot_malformed_output_falls_back_to_one_forced_answer(bad, stopped):
    (o,), gen, _ = run("ircot", {"k": 1}, [("Answer:", bad)], default="")
    a = o.answer
    assert a.extra["stopped"] == stopped and a.extra["answer_forced"] and a.prediction == ""
    assert o.trace.llm_calls == 2 and o.trace.retrieval_calls == 1
    assert gen.log[-1][0].count("So the answer is:") == gen.log[0][0].count("So the answer is:") + 1


def test_next_sentence_keeps_an_answer_whole():
    assert next_sentence("So the answer is: St. Louis. Then more.") == "So the answer is: St. Louis. Then more."
    assert next_sentence(" Titanic is a film. Cameron directed it.\nMore") == "Titanic is a film."
    assert next_sentence("\n") == ""


# -- Self-Ask --------------------------------------------------------------------------------------------------

SELF_ASK = [
    ("Intermediate answer: Titanic\n", "Follow up: Who directed Titanic?\n"),
    ("Intermediate answer: James Cameron\n", "So the final answer is: James Cameron\n"),
    ("Answer the question: Which film won Best Picture in 1998?", "Titanic"),
    ("Answer the question: Who directed Titanic?", "Answer: James Cameron"),
    ("needed here:", " Yes.\nFollow up: Which film won Best Picture in 1998?\nIntermediate"),
]


def test_self_ask_answers_each_follow_up_from_retrieval_until_the_final_answer():
    (o,), gen, _ = run("self-ask", {"k": 2}, SELF_ASK)
    a = o.answer
    assert a.prediction == "James Cameron" and a.extra["stopped"] == "answer" and not a.extra["answer_forced"]
    assert a.extra["follow_ups"] == [
        {"question": "Which film won Best Picture in 1998?", "answer": "Titanic"},
        {"question": "Who directed Titanic?", "answer": "James Cameron"},
    ]
    assert steps(o) == [("follow-up-1", 1)] * 2 + [("follow-up-2", 2)] * 2
    assert o.trace.llm_calls == 5 and o.trace.retrieval_calls == 2  # 3 self-ask steps, 2 intermediate answers
    assert [g["stage"] for g in o.trace.generations] == ["self-ask", "intermediate-answer"] * 2 + ["self-ask"]
    # the transcript the model continues: follow-up, then the inserted answer; generation stops at the marker
    assert gen.log[2][0].endswith("Follow up: Which film won Best Picture in 1998?\nIntermediate answer: Titanic\n")
    assert "Intermediate answer:" in gen.log[0][1].stop
    assert a.retrieval_triggered and {h.id for h in a.used_docs} == {d["id"] for d in o.trace.retrieved}


def test_self_ask_no_follow_up_needed_answers_without_retrieval():
    (o,), _, _ = run("self-ask", {}, [("needed here:", " No.\nSo the final answer is: Rome")])
    assert o.answer.prediction == "Rome" and o.trace.retrieval_calls == 0 and o.answer.retrieval_triggered is False


def test_self_ask_retrieve_question_puts_the_questions_passages_in_the_first_prompt():
    head = {"user": "{reference}Question: {question}\nAre follow up questions needed here: No.\n", "chat": False}
    params = {"k": 2, "retrieve_question": True, "template": head}
    (o,), gen, ret = run("self-ask", params, [("needed here: No.\n", "So the final answer is: James Cameron")])
    assert o.answer.prediction == "James Cameron" and ret.calls == [1] and steps(o) == [("question", 1)] * 2
    first = gen.log[0][0]
    assert "Titanic won Best Picture" in first and first.index("Titanic") < first.index("Question:")
    assert {h.id for h in o.answer.used_docs} == {d["id"] for d in o.trace.retrieved}
    (o,), gen, ret = run("self-ask", {**params, "retrieve_question": False}, [("needed here: No.\n", "x")])
    assert ret.calls == [] and "Titanic" not in gen.log[0][0]  # the paper's: no retrieval for the question


def test_self_ask_max_follow_ups_forces_the_final_answer():
    replies = [
        ("So the final answer is:", "Titanic's director"),
        ("Intermediate answer:", "Follow up: more?\n"),
        ("Answer the question:", "x"),
    ] + SELF_ASK[-1:]
    (o,), gen, _ = run("self-ask", {"max_follow_ups": 1}, replies)
    a = o.answer
    assert a.extra["stopped"] == "max_follow_ups" and a.extra["answer_forced"] and a.prediction == "Titanic's director"
    assert len(a.extra["follow_ups"]) == 1 and o.trace.retrieval_calls == 1
    assert "more?" not in gen.log[-1][0] and gen.log[-1][0].endswith("Intermediate answer: x\nSo the final answer is:")


@pytest.mark.parametrize(
    "bad,stopped", [("", "unparsed"), ("I am not sure.", "unparsed"), (" No.\nSo the final answer is:", "empty answer")]
)
def test_self_ask_malformed_output_forces_one_final_answer(bad, stopped):
    (o,), gen, _ = run("self-ask", {}, [("needed here:", bad), ("So the final answer is:", "")])
    a = o.answer
    assert a.extra["stopped"] == stopped and a.extra["answer_forced"] and a.prediction == ""
    assert (
        o.trace.llm_calls == 2
        and gen.log[-1][0].count("So the final answer is:") == gen.log[0][0].count("So the final answer is:") + 1
    )


def test_self_ask_reads_follow_up_or_final_whichever_comes_first():
    assert read_step(" Yes.\nFollow up: A?\nFollow up: B?") == (" Yes.\nFollow up: A?\n", "A?", None)
    assert read_step("So the final answer is: X\nFollow up: B?")[2] == "X"
    assert read_step("Follow up:   \nSo the final answer is: ")[1:] == (None, "")
    assert read_step("nothing") == ("nothing", None, None)


# -- ITER-RETGEN -------------------------------------------------------------------------------------------------


def test_iter_retgen_retrieves_with_question_plus_previous_generation():
    replies = [("Question: " + Q, "Titanic won.\nSo the answer is: James Cameron")]
    (o,), gen, _ = run("iter-retgen", {"iterations": 3, "k": 2}, replies)
    a = o.answer
    y = "Titanic won. So the answer is: James Cameron"  # y_{t-1} on one line
    assert a.extra["queries"] == [Q, f"{Q} {y}", f"{Q} {y}"]
    assert o.trace.llm_calls == 3 and o.trace.retrieval_calls == 3
    assert steps(o) == [("iter-1", 1)] * 2 + [("iter-2", 2)] * 2 + [("iter-3", 3)] * 2
    assert [g["stage"] for g in o.trace.generations] == ["iter-1", "iter-2", "iter-3"]
    # every generation reads the question (never the query) and its own iteration's documents
    assert all(t.count(Q) == 1 and "So the answer is: James" not in t for t, _ in gen.log)
    last_ids = [d["id"] for d in o.trace.retrieved if d["round"] == 3]
    assert [h.id for h in a.used_docs] == last_ids and a.prediction == "James Cameron"


def test_iter_retgen_empty_generation_keeps_the_question_as_query():
    (o,), _, _ = run("iter-retgen", {"iterations": 2}, [], default="")
    assert o.answer.extra["queries"] == [Q, Q] and o.answer.prediction == ""


# -- SuRe --------------------------------------------------------------------------------------------------------


def sure_replies(rank_first: str = "Summary 1", rank_second: str = "Summary 2", valid=("True", "False")):
    return [
        ("Candidates:", "(a) James Cameron, (b) Steven Spielberg"),
        ("Answer: James Cameron\nSummary:", "Cameron directed Titanic."),
        ("Answer: Steven Spielberg\nSummary:", "Spielberg directs films."),
        ("Answer: James Cameron\nSummary: Cameron directed Titanic.\nSupported:", valid[0]),
        ("Answer: Steven Spielberg\nSummary: Spielberg directs films.\nSupported:", valid[1]),
        ("Summary 1: Cameron directed Titanic.", rank_first),
        ("Summary 1: Spielberg directs films.", rank_second),
    ]


def test_sure_batches_each_stage_and_combines_validity_and_ranking():
    (o,), gen, _ = run("sure", {"k": 3}, sure_replies())
    a = o.answer
    assert gen.calls == [1, 2, 2, 2]  # candidates; then 2 summaries, 2 checks, 2 ordered pairs: one request each
    assert [g["stage"] for g in o.trace.generations] == [
        "candidates",
        "summarize",
        "summarize",
        "validate",
        "validate",
        "rank",
        "rank",
    ]
    assert a.extra["candidates"] == ["James Cameron", "Steven Spielberg"] and a.extra["validity"] == [1, 0]
    assert a.extra["ranking"] == [1.0, 0.0] and a.extra["scores"] == [2.0, 0.0] and a.prediction == "James Cameron"
    assert o.trace.llm_calls == 7 and o.trace.retrieval_calls == 1 and len(a.used_docs) == 3
    assert gen.log[0][1].regex and gen.log[-1][1].choice == ("Summary 1", "Summary 2")
    assert gen.log[3][1].choice == ("True", "False") and gen.log[1][1].choice == ()


def test_sure_ranking_outweighs_validity_when_both_are_valid():
    (o,), _, _ = run("sure", {}, sure_replies("Summary 2", "Summary 1", valid=("True", "True")))
    assert o.answer.extra["ranking"] == [0.0, 2.0 - 1.0] and o.answer.prediction == "Steven Spielberg"


def test_sure_undecided_judgments_count_half_and_ties_go_to_the_first_candidate():
    (o,), _, _ = run("sure", {"both_orders": False}, sure_replies("no idea", "", valid=("yes", "maybe")))
    a = o.answer
    assert a.extra["validity"] == [0, 0] and a.extra["ranking"] == [0.5, 0.5] and a.prediction == "James Cameron"
    assert o.trace.llm_calls == 1 + 2 + 2 + 1


@pytest.mark.parametrize(
    "raw,pred,parsed,calls",
    [("", "", False, 1), ("Answer: Ottawa", "Ottawa", True, 1), ("(a) Rome, (b) rome", "Rome", True, 1)],
)
def test_sure_malformed_candidates(raw, pred, parsed, calls):
    (o,), _, _ = run("sure", {"constrained": False}, [("Candidates:", raw)])
    assert o.answer.prediction == pred and o.answer.extra["candidates_parsed"] is parsed and o.trace.llm_calls == calls


def test_sure_parsers():
    assert parse_candidates("(a) Paris, (b) Lyon, (c) Nice", 2) == ["Paris", "Lyon"]
    assert parse_candidates('(a)Paris,(b) "Lyon."', 2) == ["Paris", "Lyon"]
    assert validity("True") == 1 and validity("False, not true") == 0 and validity("") == 0
    assert (prefers_first("Passage 1"), prefers_first("Summary #2 is"), prefers_first("both")) == (1.0, 0.0, 0.5)
    # three candidates, each pair in both orders: r(s_k) sums the mean r_pair over the other two
    judged = [((0, 1), 1.0), ((1, 0), 0.0), ((0, 2), 0.5), ((2, 0), 1.0), ((1, 2), 1.0), ((2, 1), 0.0)]
    assert ranking_scores(3, judged) == [1.0 + 0.25, 0.0 + 1.0, 0.75 + 0.0]


# -- templates passed at run time ------------------------------------------------------------------------------


def test_a_template_passed_as_a_param_is_what_the_model_reads():
    tpl = {"system": "SYS", "user": "{reference}Q: {question}\nThought:", "doc": "[{idx}] {title}\n", "chat": False}
    (o,), gen, _ = run("ircot", {"k": 1, "max_steps": 1, "template": tpl}, [("Thought:", "So the answer is: Titanic")])
    assert gen.log[0][0] == f"SYS\n\n[1] {o.answer.used_docs[0].title}\nQ: {Q}\nThought:"
    assert o.answer.prediction == "Titanic"
    chat = {"user": "{reference}{question}"}
    (o,), gen, _ = run("iter-retgen", {"iterations": 1, "k": 1, "template": chat}, [], default="x")
    assert gen.raw[0][1] is True and gen.raw[0][0] == [{"role": "user", "content": gen.log[0][0]}]
    assert gen.log[0][0].startswith("Doc 1 (Title:") and gen.log[0][0].endswith(Q)
    sure_tpl = {"candidates": {"user": "{N} passages\n{reference}{question}\nAnswer:"}}
    (o,), gen, _ = run("sure", {"k": 2, "templates": sure_tpl}, [("Answer:", "(a) A")])
    assert "2 passages" in gen.log[0][0] and o.answer.prediction == "A"


@pytest.mark.parametrize(
    "method,params,match",
    [
        ("ircot", {"template": {"user": "{question} {answer}"}}, "unknown fields"),
        ("self-ask", {"answer_template": {"user": "{cot}"}}, "unknown fields"),
        ("sure", {"templates": {"judge": {"user": "{question}"}}}, "unknown template"),
        ("sure", {"templates": {"rank": {"user": "{summary3}"}}}, "unknown fields"),
        ("iter-retgen", {"iterations": 0}, "iterations"),
    ],
)
def test_bad_params_are_refused(method, params, match):
    with pytest.raises(MethodError, match=match):
        get_method(method).params(params)


def test_many_questions_share_batched_calls():
    qs = [Question(str(i), Q) for i in range(4)]
    outs, gen, ret = run("iter-retgen", {"iterations": 2}, [], default="Titanic", questions=qs)
    assert gen.calls == [4, 4] and ret.calls == [4, 4] and len(outs) == 4


class Counting(Script):
    """Replies in turn, one per prompt (`replies` as a list of texts)."""

    def __init__(self, texts: list[str]):
        super().__init__([])
        self.texts = iter(texts)

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        self.log += [(str(p), s) for p, s in zip(prompts, samplings)]
        return [Completion(next(self.texts), prompt_tokens=1, completion_tokens=1) for _ in prompts]


def test_iter_retgen_each_query_carries_the_latest_generation_and_the_last_one_answers():
    gen = Counting(["Rome is old.", "Ottawa is a capital.", "So the answer is: Ottawa"])
    engine = Engine(Backends(DynragConfig(), generator=gen, retriever=MemoryRetriever(PASSAGES)))
    spec = get_method("iter-retgen")
    (o,) = engine.run([Question("1", Q)], spec.program, spec.params({"iterations": 3, "k": 1}))
    a = o.answer
    assert a.extra["queries"] == [Q, f"{Q} Rome is old.", f"{Q} Ottawa is a capital."]
    assert a.prediction == "Ottawa" and a.raw_output == "So the answer is: Ottawa"
    assert [h.id for h in a.used_docs] == [d["id"] for d in o.trace.retrieved if d["round"] == 3]


def test_self_ask_a_follow_up_before_a_final_answer_is_asked_first():
    assert read_step("Follow up: A?\nSo the final answer is: X") == ("Follow up: A?\n", "A?", None)


def test_self_ask_an_empty_intermediate_answer_is_inserted_as_unknown():
    replies = [
        ("Intermediate answer: unknown\n", "So the final answer is: none"),
        ("Answer the question:", ""),
    ] + SELF_ASK[-1:]
    (o,), _, _ = run("self-ask", {}, replies)
    assert o.answer.extra["follow_ups"][0]["answer"] == "unknown" and o.answer.prediction == "none"
