"""Search-R1 and Search-o1 on scripted generators and an in-memory BM25 retriever, through the lockstep engine:
the rollout's turns, what each search appends, the budgets, and the documented fallback of each malformed
output (a tag split across tokens, a missing closing tag, an empty search, a malformed answer)."""

from __future__ import annotations

import json

import pytest
from fakes import MemoryRetriever

from pipeline.backends import Backends
from pipeline.backends.chat import cut_at_stop
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question
from pipeline.methods.registry import MethodError, get_method
from pipeline.methods.search_agent import LIMIT, NO_QUERY, read_turn
from pipeline.methods.search_o1 import NOTHING, final_information
from pipeline.methods.search_r1 import TAGS as R1

Q = "Who directed the film that won Best Picture in 1998?"
PASSAGES = [
    ("p1", "Titanic (1997 film)", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Rome", "Rome is the capital of Italy."),
]


class Turns:
    """Replies to the rollout's turns in order (per question id in the prompt: one script each) and to
    Reason-in-Documents calls with `refine`; cuts each reply at its first stop string as vLLM does (the stop
    not returned) unless `cut` is off, and logs every prompt as text with its sampling."""

    def __init__(self, turns: list[str | list[str]], refine: str = "", cut: bool = True):
        self.turns, self.refine, self.cut = turns, refine, cut
        self.log: list[tuple[str, object]] = []
        self.calls: list[int] = []
        self.at = 0

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        assert len(self.calls) < 40, "runaway rollout"
        out = []
        for p, s in zip(prompts, samplings):
            text = p if isinstance(p, str) else "\n\n".join(m["content"] for m in p)
            self.log.append((text, s))
            if "Current search query" in text:
                reply = self.refine
            else:
                reply = self.turns[self.at] if self.at < len(self.turns) else ""
                self.at += 1
            reply = "".join(reply) if isinstance(reply, list) else reply  # token pieces, joined as detokenized
            stop_reason = ""
            if self.cut:  # as vLLM: the stop string that ended the reply is its stop_reason
                cut, stopped = cut_at_stop(reply, s.stop)
                stop_reason = next(st for st in s.stop if reply.startswith(st, len(cut))) if stopped else ""
                reply = cut
            n = len(reply.split()) + 1
            out.append(Completion(reply, prompt_tokens=len(text.split()), completion_tokens=n, stop_reason=stop_reason))
        return out


# the searches counted here are the methods': the retrieval cache would serve a repeated query
NO_CACHE = DynragConfig.model_validate({"answer": {"retrieval_cache": 0}})


def run(method: str, params: dict, gen: Turns, n: int = 1):
    ret = MemoryRetriever(PASSAGES)
    engine = Engine(Backends(NO_CACHE, generator=gen, retriever=ret))
    spec = get_method(method)
    qs = [Question(str(i), Q, answers=["James Cameron"]) for i in range(n)]
    outs = engine.run(qs, spec.program, spec.params(params))
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return outs, ret


# -- Search-R1 -------------------------------------------------------------------------------------------------

R1_CHAIN = [
    "<think> I need the 1998 winner. </think> <search> Best Picture 1998 </search> ignored",
    "<think> Titanic. Who directed it? </think><search>Titanic director</search>",
    "<think> James Cameron. </think> <answer> James Cameron </answer>",
]


def test_search_r1_searches_at_each_closed_query_and_answers_inside_the_tag():
    gen = Turns(R1_CHAIN)
    (o,), ret = run("search-r1", {"k": 2}, gen)
    assert o.answer.prediction == "James Cameron"
    x = o.answer.extra
    assert x["turns"] == 3 and x["searches"] == 2 and x["queries"] == ["Best Picture 1998", "Titanic director"]
    assert x["stopped"] == "answer" and not x["answer_forced"]
    assert ret.calls == [1, 1] and [d["step"] for d in o.trace.retrieved][::2] == ["search-1", "search-2"]
    # each turn stops at </search> or </answer>, and continues the rollout with the passages in <information>
    assert all(s.stop == ("</search>", "</answer>") for _, s in gen.log)
    second = gen.log[1][0]
    assert second.startswith("Answer the given question.") and second.rstrip().endswith("</information>")
    assert "<search> Best Picture 1998 </search>\n\n<information>\nDoc 1 (Title: Titanic (1997 film))" in second
    assert "ignored" not in second
    # tokens: every searching turn is thinking, the answering turn is the answer's
    tokens = [len(cut_at_stop(t, ("</search>", "</answer>"))[0].split()) + 1 for t in R1_CHAIN]
    assert x["think_tokens"] == tokens[0] + tokens[1] and x["answer_tokens"] == tokens[2]
    assert o.answer.retrieval_triggered and {d.id for d in o.answer.used_docs} >= {"p1", "p2"}


def test_a_tag_split_across_tokens_reads_as_the_whole_tag_even_past_an_uncaught_stop():
    pieces = [["<th", "ink> x </thi", "nk> <sea", "rch> Titanic dir", "ector </se", "arch> <answer> no </answer>"]]
    pieces.append(["<ans", "wer> James ", "Cameron </ans", "wer>"])
    (o,), _ = run("search-r1", {}, Turns(pieces, cut=False))
    assert o.answer.extra["queries"] == ["Titanic director"] and o.answer.prediction == "James Cameron"


def test_a_missing_closing_search_tag_still_searches_the_open_query():
    gen = Turns(["<think> hm </think> <search> Titanic director", "<answer>James Cameron</answer>"])
    (o,), _ = run("search-r1", {}, gen)
    assert o.answer.extra["queries"] == ["Titanic director"] and o.answer.prediction == "James Cameron"


def test_an_empty_search_retrieves_nothing_and_says_so():
    gen = Turns(["<search>   </search>", "<answer> James Cameron </answer>"])
    (o,), ret = run("search-r1", {}, gen)
    assert ret.calls == [] and o.answer.extra["searches"] == 0 and o.answer.extra["turns"] == 2
    assert f"<information>\n{NO_QUERY}\n</information>" in gen.log[1][0]


def test_the_turn_budget_forces_one_short_answer_after_the_answer_tag():
    gen = Turns(["<search> a </search>", "<search> b </search>", "James Cameron"])
    (o,), _ = run("search-r1", {"max_turns": 2}, gen)
    x = o.answer.extra
    assert x["turns"] == 2 and x["stopped"] == "max_turns" and x["answer_forced"]
    assert o.answer.prediction == "James Cameron" and gen.log[-1][0].rstrip().endswith("<answer>")
    assert gen.log[-1][1].max_tokens == 32 and "</answer>" in gen.log[-1][1].stop


def test_the_search_budget_answers_a_further_query_with_the_limit_note():
    gen = Turns(["<search> a </search>", "<search> b </search>", "<answer> x </answer>"])
    (o,), ret = run("search-r1", {"max_searches": 1}, gen)
    assert ret.calls == [1] and o.answer.extra["queries"] == ["a"] and LIMIT in gen.log[2][0]


@pytest.mark.parametrize(
    "turns,pred,stopped,forced_calls",
    [
        (["<answer>  </answer>", "Cameron"], "Cameron", "empty answer", 2),  # empty: forced after the open tag
        (["<answer> The answer is: James Cameron. </answer>"], "James Cameron", "answer", 1),  # cleaned
        (["<answer> James Cameron"], "James Cameron", "answer", 1),  # unclosed (token limit): to the end
        (["no tags at all", "<answer> Rome </answer>"], "Rome", "answer", 2),  # invalid: the correction note
        ([""], "", "max_turns", 3),  # nothing at all, to the budget, then an empty forced answer
    ],
)
def test_malformed_answers_fall_back_as_documented(turns, pred, stopped, forced_calls):
    gen = Turns(turns)
    (o,), _ = run("search-r1", {"max_turns": 2}, gen)
    assert o.answer.prediction == pred and o.answer.extra["stopped"] == stopped
    assert len(gen.log) == forced_calls
    if turns[0] == "no tags at all":
        assert R1.invalid in gen.log[1][0]


def test_read_turn_takes_the_tag_opened_last_before_the_first_close():
    assert read_turn("<answer> a </answer> <search> q </search>", R1)[1:] == (None, "a")
    assert read_turn("<answer> draft <search> q", R1)[1:] == ("q", None)
    assert read_turn("<think> x </think>", R1) == ("<think> x </think>", None, None)


def test_questions_share_batched_calls_and_finish_at_their_own_turn():
    gen = Turns(["<search> a </search>", "<answer> b </answer>"] * 3)
    outs, ret = run("search-r1", {}, gen, n=3)
    assert len(outs) == 3 and sum(gen.calls) == 6 and max(gen.calls) > 1


# -- strict: turns read as FlashRAG's ReasoningPipeline reads them (dynrag bench flashrag --method search-r1) -----

STRICT_TEMPLATE = {"user": "Q: {question}\n", "doc": "D{idx}({title}) {text}\n", "chat": False}


def test_strict_turns_continue_the_prompt_with_the_stripped_output_and_the_templates_documents():
    turns = [" <think> x </think> <search> Titanic director </search> ignored", "<answer> James Cameron </answer>"]
    gen = Turns(turns)
    (o,), ret = run("search-r1", {"strict": True, "k": 2, "template": STRICT_TEMPLATE}, gen)
    assert o.answer.prediction == "James Cameron" and o.answer.extra["stopped"] == "answer"
    assert ret.calls == [1] and o.answer.extra["queries"] == ["Titanic director"] and len(gen.log) == 2
    docs = "".join(f"D{i}({d.title}) {d.text}\n" for i, d in enumerate(o.answer.used_docs, 1))
    # FlashRAG: prompt + output.strip() (its stop string included) + "\n\n<information>\n" + docs + "\n</information>\n\n"
    block = "\n\n<information>\n" + docs + "\n</information>\n\n"
    assert gen.log[1][0] == gen.log[0][0] + "<think> x </think> <search> Titanic director </search>" + block
    assert len(o.answer.used_docs) == 2
    assert o.answer.raw_output.endswith("</information>\n\n<answer> James Cameron </answer>".strip())


@pytest.mark.parametrize(
    "turns,pred,stopped,calls,searches",
    [
        (["just words."], "just words.", "no action", 1, []),  # no second try, no correction note
        (
            ["<think> a </think> <search> Titanic director"],
            "<think> a </think> <search> Titanic director",
            "no action",
            1,
            [],
        ),
        (["<search> a </search>"] * 3, "", "max_turns", 2, [1, 1]),  # the budget: no forced answer call
        (["<answer> The answer is: Rome. </answer>"], "The answer is: Rome.", "answer", 1, []),  # as written
        (["<answer></answer>"], "", "answer", 1, []),
    ],
)
def test_strict_turns_end_where_flashrags_reasoning_pipeline_ends(turns, pred, stopped, calls, searches):
    gen = Turns(turns)
    (o,), ret = run("search-r1", {"strict": True, "max_turns": 2}, gen)
    assert o.answer.prediction == pred and o.answer.extra["stopped"] == stopped
    assert len(gen.log) == calls and ret.calls == searches and not o.answer.extra["answer_forced"]
    assert all(R1.invalid not in text for text, _ in gen.log)


def test_strict_empty_query_gets_an_empty_block_without_a_search():
    gen = Turns(["<search> </search>", "<answer> x </answer>"])
    (o,), ret = run("search-r1", {"strict": True}, gen)
    assert ret.calls == [] and gen.log[1][0].endswith("<search> </search>\n\n<information>\n\n</information>\n\n")
    assert o.answer.prediction == "x" and o.answer.extra["searches"] == 0


def test_strict_search_o1_answers_in_any_turn_holding_the_box_and_still_reasons_in_documents():
    turns = ["look <|begin_search_query|> Best Picture 1998 <|end_search_query|>", "so \\boxed{James Cameron} done"]
    gen = Turns(turns, refine="Final Information: Titanic, by James Cameron.")
    (o,), _ = run("search-o1", {"strict": True}, gen)
    assert o.answer.prediction == "James Cameron" and len(gen.log) == 3
    assert gen.log[2][0].endswith("<|begin_search_result|>\nTitanic, by James Cameron.\n<|end_search_result|>\n\n")


# -- Search-o1 -------------------------------------------------------------------------------------------------


def test_search_o1_reasons_in_documents_before_they_enter_the_chain():
    turns = [
        "I should look this up. <|begin_search_query|> Best Picture 1998 <|end_search_query|>",
        "So Titanic, by James Cameron. The answer is \\boxed{James Cameron}. More text.",
    ]
    refine = "**Final Information**\n\nTitanic won; James Cameron directed it."
    gen = Turns(turns, refine=refine)
    (o,), _ = run("search-o1", {"k": 2, "refine_tokens": 40}, gen)
    assert o.answer.prediction == "James Cameron" and o.answer.extra["searches"] == 1
    refine_prompt, spec = gen.log[1]
    assert "Current search query:\nBest Picture 1998" in refine_prompt and "Doc 1 (Title: Titanic" in refine_prompt
    assert spec.max_tokens == 40 and o.answer.extra["refine_tokens"] == len(refine.split()) + 1
    third = gen.log[2][0]
    assert "<|begin_search_result|>\nTitanic won; James Cameron directed it.\n<|end_search_result|>" in third
    assert "Doc 1" not in third.split("Question:")[-1]  # the raw documents do not enter the chain
    assert gen.log[0][1].stop == ("<|end_search_query|>",) and [g["stage"] for g in o.trace.generations] == [
        "reason",
        "reason-in-documents",
        "reason",
    ]


def test_search_o1_without_a_boxed_answer_is_forced_after_the_box():
    gen = Turns(["I think it is Cameron.", "still thinking", "James Cameron"])
    (o,), _ = run("search-o1", {"max_turns": 2}, gen)
    assert o.answer.extra["answer_forced"] and o.answer.prediction == "James Cameron"
    assert gen.log[-1][0].rstrip().endswith("\\boxed{")


def test_final_information_reads_the_marker_or_the_whole_text():
    assert final_information("notes\n**Final Information**: Paris is the capital.") == "Paris is the capital."
    assert final_information("Paris is the capital.") == "Paris is the capital."
    assert final_information("Final Information\n") == NOTHING


@pytest.mark.parametrize(
    "method,params,match",
    [
        ("search-r1", {"template": {"user": "{question} {cot}"}}, "unknown fields"),
        ("search-o1", {"refine_template": {"user": "{reference} {answer}"}}, "unknown fields"),
        ("search-r1", {"max_turns": 0}, "max_turns"),
    ],
)
def test_bad_params_are_refused(method, params, match):
    with pytest.raises(MethodError, match=match):
        get_method(method).params(params)


# -- the latency model's rollouts (`dynrag bench pipeline --simulate-gpu`) -------------------------------------


@pytest.mark.parametrize("method", ["search-r1", "search-o1"])
def test_the_simulated_generator_plans_uneven_rollouts(method):
    from jobs.bench.rig.simulated import PLANNED_SEARCHES, SimGenerator, SimRetriever

    engine = Engine(Backends(DynragConfig(), generator=SimGenerator(), retriever=SimRetriever()))
    spec = get_method(method)
    qs = [Question(str(i), f"Who directed film {i}?") for i in range(60)]
    outs = engine.run(qs, spec.program, spec.params({"turn_tokens": 64, "max_searches": 5}))
    assert all(o.error is None and o.answer.prediction for o in outs)
    searches = [o.answer.extra["searches"] for o in outs]
    assert set(searches) == {min(n, 5) for n in PLANNED_SEARCHES}  # 6 planned: the budget stops it at 5
    for o, n in zip(outs, searches):
        x = o.answer.extra
        assert not x["answer_forced"] and x["turns"] == n + 1 + (n == 5 and x["turns"] > 6)
    think = [
        o.answer.extra["think_tokens"] / max(o.answer.extra["turns"] - 1, 1) for o in outs if o.answer.extra["searches"]
    ]
    assert max(think) > 2 * min(think)  # uneven turns


def test_bench_pipeline_runs_the_reasoning_methods_on_both_engines(capsys):
    from jobs.cli import main

    names = ["search-r1", "search-o1", "adaptive-rag"]
    main(
        [
            "bench",
            "pipeline",
            "--simulate-gpu",
            "--questions",
            "8",
            "--time-scale",
            "0",
            "--json",
            *sum((["--method", m] for m in names), []),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["engine"]) for r in out] == [(m, e) for m in names for e in ("lockstep", "continuous")]
    assert all(0 < r["generator_busy"] <= 1 and r["decode_steps"] >= 1 for r in out)
