"""ERM4 in the authors' setting (pipeline/methods/erm4_authors.py) and its `dynrag conform` harness
(jobs/conform/erm4.py, erm4_driver.py): their code's flow on worked examples, the OpenAI-shaped endpoint the
reference's LLM calls reach, and the driver's Bing stand-in. The prompts here are made up: theirs are read from a
checkout at run time (CC BY-NC-SA)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from fakes import MemoryRetriever

from jobs.conform import erm4_driver, traces
from jobs.conform.erm4 import MAX_TOKENS, PROMPTS, STAGES, serve_llm, stage_of, template_pattern
from jobs.conform.harness import serve_retrieval
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question
from pipeline.methods.erm4_authors import json_schema
from pipeline.methods.registry import get_method

PASSAGES = [
    ("p1", "Titanic", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Titanic", "Titanic is a 1997 film directed by James Cameron."),
    ("p4", "Rome", "Rome is the capital of Italy."),
]
AUTHORS = {
    "rewriter_prompt": "Rewrite: {Original_Question} as JSON",
    "filter_prompt": "Knowledge: {External_Knowledge}\nQ: {Question}\nNLI as JSON",
    "reader_prompt": "Q: {Question}\nK:\n{External_Knowledge}Answer as a JSON list",
    "page_num": 2,
}
REWRITE = json.dumps({"Rewritten Question": ["Who directed Titanic?", "Which film?"], "Query": ["Titanic", "Cameron"]})


class Script:
    """Replies in order; records each prompt and its sampling."""

    def __init__(self, replies: list[str]):
        self.replies, self.prompts, self.samplings = list(replies), [], []

    def generate(self, prompts, samplings, chats):
        self.prompts += prompts
        self.samplings += samplings
        return [Completion(self.replies.pop(0), 1, 5, "stop", None, [1] * 5) for _ in prompts]


def run(method: str, replies: list[str], question: str = "who made titanic", **settings):
    out, script = run_script(method, replies, question, **settings)
    return out, script.prompts


def run_script(method: str, replies: list[str], question: str = "who made titanic", **settings):
    script = Script(replies)
    backends = Backends(DynragConfig(), generator=script, retriever=MemoryRetriever(PASSAGES))
    spec = get_method(method)
    params = spec.params({"authors": {**AUTHORS, **settings}})
    return Engine(backends).run([Question("q1", question)], spec.program, params)[0], script


def test_erm4_in_the_authors_setting_follows_their_code_step_by_step():
    nli = [json.dumps({"NLI result": r}) for r in ("entailment", "neutral")]
    out, prompts = run("erm4", [REWRITE, *nli, '["James Cameron"]'])
    assert out.error is None, out.error
    assert prompts[0] == "Rewrite: who made titanic as JSON"
    # knowledge is title -> text in the order the queries' results come: query "Titanic" finds p1 then p3 (same
    # title: p3's text replaces p1's and keeps its place), "Cameron" finds p2 then p3 (Titanic again)
    titanic = "Titanic is a 1997 film directed by James Cameron."
    assert out.answer.extra["retrieved_titles"] == ["Titanic", "James Cameron"]
    # one filter prompt per title, each with the *original* question (main.py passes it)
    assert prompts[1] == f"Knowledge: {titanic}\nQ: who made titanic\nNLI as JSON"
    assert prompts[2] == "Knowledge: James Cameron directed Titanic.\nQ: who made titanic\nNLI as JSON"
    # only "entailment" is kept; the reader reads the rewritten questions joined by a space
    reader = prompts[-1]
    assert reader == (
        "Q: Who directed Titanic? Which film?\nK:\n"
        f"\t[Source 0]\n\t\tTitle: Titanic\n\t\tContent: {titanic}\n\nAnswer as a JSON list"
    )
    assert out.answer.extra["kept"] == ["Titanic"] and [h.id for h in out.answer.used_docs] == ["p3"]
    assert out.answer.prediction == "James Cameron" and out.answer.raw_output == '["James Cameron"]'


def test_erm4_rewriter_in_the_authors_setting_reads_everything_retrieved():
    out, prompts = run("erm4-rewriter", [REWRITE, "James Cameron, surely"])
    assert out.error is None, out.error
    assert len(prompts) == 2 and "[Source 1]" in prompts[1] and "Title: James Cameron" in prompts[1]
    # an answer that is not JSON is kept as its text (Reader.read's fallback)
    assert out.answer.prediction == "James Cameron, surely" and out.answer.extra["kept"] == ["Titanic", "James Cameron"]


def test_a_rewritten_question_given_as_one_string_is_joined_by_characters_as_their_code_does():
    rewrite = json.dumps({"Rewritten Input": "Who?", "Query": []})
    out, prompts = run("erm4", [rewrite, '["x"]'])
    assert out.error is None, out.error
    assert prompts[-1].startswith("Q: W h o ?\nK:\nAnswer") and out.answer.extra["kept"] == []


def test_output_their_json_reading_refuses_ends_the_question_with_an_error_row():
    out, _ = run("erm4", ["Rewritten: who made it; queries: titanic"])
    assert out.answer is None and "not their JSON" in str(out.error)
    out, _ = run("erm4", [REWRITE, "entailment", "x"])
    assert out.answer is None and "filter output" in str(out.error)


def test_the_filter_s_kept_titles_are_decisions():
    ref = {"id": "q", "events": [], "prediction": "x", "kept": ["A", "B"]}
    same = traces.compare(ref, {**ref})
    other = traces.compare(ref, {**ref, "kept": ["A"]})
    assert same["same_decisions"] and not other["same_decisions"] and other["same_prediction"]


def test_the_reference_s_llm_calls_and_searches_reach_dynrag_s_backends():
    """The endpoint answers OpenAI's chat shape from the generator (one user message: the prompt as dynrag
    asks it); the driver's searchbing returns the retriever's passages in Bing's shape and traces them."""
    script = Script(['{"NLI result":"entailment"}'])
    backends = Backends(DynragConfig(), generator=script, retriever=MemoryRetriever(PASSAGES))
    llm, retrieval = serve_llm(backends, 16), serve_retrieval(backends)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "judge"}], "temperature": 0.0, "n": 1}
        url = f"http://127.0.0.1:{llm.server_address[1]}/v1/chat/completions"
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            answer = json.loads(r.read())["choices"][0]["message"]["content"]
        assert answer == '{"NLI result":"entailment"}' and script.prompts == ["judge"]
        erm4_driver.TRACE.clear()
        found = erm4_driver.search_with(f"http://127.0.0.1:{retrieval.server_address[1]}/")("Rome capital", 1)
        assert found == {"webPages": {"value": [{"name": "Rome", "url": "p4", "snippet": PASSAGES[3][2]}]}}
        assert erm4_driver.TRACE == [{"kind": "retrieve", "query": "Rome capital", "ids": ["p4"]}]
    finally:
        llm.shutdown()
        retrieval.shutdown()


def test_the_driver_redirects_only_openai_s_url():
    import types

    utils = types.SimpleNamespace()
    erm4_driver.redirect_transport(utils, "http://127.0.0.1:9/v1")
    sent = []
    real = erm4_driver.__dict__.get("requests")
    assert real is None  # the driver imports requests inside, for the reference's venv
    import requests

    orig = requests.post
    requests.post = lambda url, *a, **k: sent.append(url)
    try:
        utils.requests.post("https://api.openai.com/v1/chat/completions", json={})
        utils.requests.post("https://example.org/x", json={})
    finally:
        requests.post = orig
    assert sent == ["http://127.0.0.1:9/v1/chat/completions", "https://example.org/x"]
    assert utils.ClientSession.__mro__[1].__name__ == "ClientSession"


def test_unfence_reads_one_markdown_code_block_as_its_content():
    from pipeline.methods.erm4_authors import unfenced

    assert unfenced('```json\n{"Query": ["a"]}\n```') == '{"Query": ["a"]}'
    assert unfenced('```\n["x"]\n```\n') == '["x"]'
    assert unfenced('["x"]') == '["x"]'
    two = "```json\n{}\n```\ntext\n```\n[]\n```"
    assert unfenced(two) == two  # more than one block: as it is


def post_chat(server, prompt: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0.0, "n": 1}
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def test_constrain_json_asks_each_of_dynrag_s_calls_for_the_format_of_its_prompt():
    nli = [json.dumps({"NLI result": r}) for r in ("entailment", "neural")]
    out, script = run_script("erm4", [REWRITE, *nli, '["James Cameron"]'], constrain_json=True)
    assert out.error is None, out.error
    asked = [s.json_schema for s in script.samplings]
    assert asked == [json_schema(x) for x in ("rewrite", "filter", "filter", "answer")]
    assert json.loads(asked[1])["properties"]["NLI result"]["enum"] == ["entailment", "contradiction", "neural"]
    assert list(json.loads(asked[0])["properties"]) == ["Rewritten Question", "Query"]  # the format's order
    _, script = run_script("erm4", [REWRITE, *nli, '["James Cameron"]'])
    assert [s.json_schema for s in script.samplings] == [None] * 4  # without it: as before


def test_the_endpoint_decodes_each_reference_prompt_under_its_template_s_format():
    """The reference's prompts are their templates filled by str.replace; the endpoint finds the template and asks
    the generator for its schema, the one dynrag's side asks for the same stage."""
    formats = {AUTHORS[f"{k}_prompt"]: json_schema(STAGES[k]) for k in ("rewriter", "filter", "reader")}
    script = Script(["{}", "{}", "{}", "{}"])
    backends = Backends(DynragConfig(), generator=script, retriever=MemoryRetriever(PASSAGES))
    llm = serve_llm(backends, 16, formats=formats)
    try:
        post_chat(llm, "Rewrite: who {Question} made it?\nline two as JSON")
        post_chat(llm, "Knowledge: Titanic is a film.\nQ: who made titanic\nNLI as JSON")
        post_chat(llm, "Q: who\nK:\n\t[Source 0]\n\t\tTitle: T\n\nAnswer as a JSON list")
        assert [s.json_schema for s in script.samplings] == [json_schema(x) for x in ("rewrite", "filter", "answer")]
        assert [s.max_tokens for s in script.samplings] == [16] * 3
        with pytest.raises(OSError):  # a prompt from none of the templates is refused, never run unconstrained
            post_chat(llm, "free text")
        assert len(script.prompts) == 3
    finally:
        llm.shutdown()
    plain = serve_llm(backends, 16)
    try:
        post_chat(plain, "free text")
        assert script.samplings[-1].json_schema is None
    finally:
        plain.shutdown()


def test_stage_of_needs_exactly_one_template():
    patterns = {k: template_pattern(AUTHORS[f"{k}_prompt"]) for k in ("filter", "reader")}
    assert stage_of("Knowledge: a\nb\nQ: c\nNLI as JSON", patterns) == "filter"
    with pytest.raises(ValueError, match="0 of the templates"):
        stage_of("Knowledge: a\nQ: c\nNLI as JSON, please", patterns)
    same = {"a": template_pattern("X {Question} Y"), "b": template_pattern("X {External_Knowledge} Y")}
    with pytest.raises(ValueError, match="2 of the templates"):
        stage_of("X q Y", same)


def test_conform_s_constrain_json_reaches_both_sides(tmp_path, monkeypatch):
    """`dynrag conform --method erm4 --constrain-json`: the reference's requests reach the endpoint and are
    decoded under their format, dynrag's side runs with constrain_json, and the reference's cache key changes."""
    import argparse

    import jobs.conform.env
    import jobs.conform.harness
    import pipeline.assets.models
    import pipeline.backends
    from jobs.conform import run as conform_run

    src = tmp_path / "ERM4"
    (src / "Prompt").mkdir(parents=True)
    (src / "Components.py").write_text("")
    for k, f in PROMPTS.items():
        (src / f).write_text(AUTHORS[f"{k}_prompt"])
    dataset = tmp_path / "q.jsonl"
    dataset.write_text(json.dumps({"id": "q1", "question": "who made titanic", "answers": ["Cameron"]}) + "\n")
    script = Script(["{}"] * 4)
    jobs_seen, params_seen = [], []

    def reference(py, job, workdir, log, driver):  # the driver's calls, as their code fills the prompts
        jobs_seen.append(job)
        llm = type("S", (), {"server_address": ("127.0.0.1", int(job["llm_url"].split(":")[2].split("/")[0]))})
        post_chat(llm, AUTHORS["rewriter_prompt"].replace("{Original_Question}", "who made titanic"))
        post_chat(llm, AUTHORS["filter_prompt"].replace("{Question}", "q").replace("{External_Knowledge}", "k"))
        return {}, [{"id": "q1", "events": [], "prediction": "x", "seconds": 1.0}]

    def dynrag(backends, questions, method, params):
        params_seen.append(params)
        return [{"id": "q1", "events": [], "prediction": "x", "seconds": 1.0}]

    class FakeBackends:
        def __init__(self, cfg, index):
            self.generator = script

        def generate(self, prompts, samplings, chats):
            return script.generate(prompts, samplings, chats)

        def close(self):
            pass

    monkeypatch.setattr(jobs.conform.env, "ensure_reference_env", lambda *a, **k: tmp_path / "python")
    monkeypatch.setattr(pipeline.assets.models, "resolve_model", lambda name, cache: "/models/m")
    monkeypatch.setattr(pipeline.backends, "Backends", FakeBackends)
    monkeypatch.setattr(jobs.conform.harness, "run_reference", reference)
    monkeypatch.setattr(jobs.conform.harness, "run_dynrag", dynrag)
    monkeypatch.setattr(jobs.conform.harness, "serve_retrieval", lambda b: serve_llm(b, 1))
    results = []
    monkeypatch.setattr("jobs.jsonout.emit", lambda r, indent=None: results.append(r))
    for flag in ([], ["--constrain-json"]):
        parser = argparse.ArgumentParser()
        conform_run.register(parser.add_subparsers())
        argv = ["conform", "--method", "erm4", "--reference-source", str(src), "--dataset", str(dataset)]
        argv += ["--index", str(tmp_path / "index"), "--json", "--model-dtype", "checkpoint"]
        args = parser.parse_args([*argv, *flag])
        args.func(args)
    plain, constrained = jobs_seen
    assert "json_schemas" not in plain  # the cache key of runs without the switch is as it was
    assert constrained["json_schemas"] == {k: json_schema(STAGES[k]) for k in ("rewriter", "filter", "reader")}
    assert [s.json_schema for s in script.samplings] == [None, None, json_schema("rewrite"), json_schema("filter")]
    assert [p["authors"]["constrain_json"] for p in params_seen] == [False, True]
    # the grammar bounds each answer: no token cap but the window's room, on both sides (MAX_TOKENS without it)
    window = DynragConfig().generation.max_model_len
    assert [s.max_tokens for s in script.samplings] == [MAX_TOKENS, MAX_TOKENS, window, window]
    assert [p["authors"]["max_tokens"] for p in params_seen] == [MAX_TOKENS, window]
    assert results[1]["json_schemas"] == constrained["json_schemas"] and results[0]["json_schemas"] == {}
