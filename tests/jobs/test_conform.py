"""`dynrag conform` on scripted sides: trace comparison and first divergence, a reference that fails, the
reference's cache; and the authors' setting of DRAGIN's Table 1 methods (pipeline/methods/dragin_authors.py)
against what DRAGIN's code does, on a scripted generator: its prompt layout, its stopping, its answer reading."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import MemoryRetriever

from jobs.conform import harness, traces
from jobs.conform import run as conform_run
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question, TokenLogprob
from pipeline.methods import dragin_authors as authors
from pipeline.methods.registry import get_method

FEWSHOT = "Question: Where is Rome?\nAnswer: Rome is in Italy. So the answer is Italy.\n"
CASE = "Answer the question step by step.\nQuestion: {question}\nAnswer:"
PASSAGES = [
    ("p1", "Titanic", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Rome", "Rome is the capital of Italy."),
]


def gen(prompt: str, text: str) -> dict:
    return {"kind": "generate", "prompt_sha": traces.prompt_sha(prompt), "prompt": prompt, "text": text}


def ret(query: str, ids: list[str]) -> dict:
    return {"kind": "retrieve", "query": query, "ids": ids}


# -- traces ------------------------------------------------------------------------------------------------
def test_same_traces_are_the_same_decisions_and_predictions():
    events = [gen("Q\nAnswer:", "A is B."), ret("A is B", ["p1", "p2"]), gen("ctx Q\nAnswer: A is B.", "x")]
    r = traces.compare(
        {"id": "q1", "events": events, "prediction": "The Paris."},
        {"id": "q1", "events": events, "prediction": "paris"},
    )
    assert r["same_decisions"] and r["same_prediction"] and "first_divergence" not in r
    assert traces.decisions(events) == [{"after": "A is B.", "query": "A is B", "ids": ["p1", "p2"]}]


def test_first_divergence_names_the_event_and_both_sides():
    ref = [gen("Q\nAnswer:", "A is B."), ret("A is B", ["p1"]), gen("ctx Q\nAnswer: A is B.", "So the answer is x.")]
    ours = [gen("Q\nAnswer:", "A is B."), ret("A B", ["p3"]), gen("ctx Q\nAnswer: A is B.", "So the answer is y.")]
    r = traces.compare({"id": "q", "events": ref, "prediction": "x"}, {"id": "q", "events": ours, "prediction": "y"})
    assert not r["same_decisions"] and not r["same_prediction"]
    d = r["first_divergence"]
    assert d["event"] == 1
    assert d["reference"] == {"kind": "retrieve", "query": "A is B", "ids": ["p1"]}
    assert d["dynrag"] == {"kind": "retrieve", "query": "A B", "ids": ["p3"]}


def test_the_same_prompt_answered_otherwise_is_a_divergence():
    ref = [gen("P\nAnswer:", "So the answer is 1980.")]
    ours = [gen("P\nAnswer:", "So the answer is 1984.")]
    d = traces.first_divergence(ref, ours)
    assert d["event"] == 0 and (d["reference"]["output"], d["dynrag"]["output"]) == (ref[0]["text"], ours[0]["text"])


def test_a_side_that_stops_early_diverges_where_it_stopped():
    ref = [gen("P\nAnswer:", "a"), gen("P\nAnswer: a", "b")]
    d = traces.first_divergence(ref, ref[:1])
    assert d["event"] == 1 and d["dynrag"] is None and d["reference"]["prompt_tail"].endswith("Answer: a")


def test_a_retrieval_at_another_point_is_another_decision():
    first = [ret("q", ["p1"]), gen("Q\nAnswer: one.", "two")]
    later = [ret("q", ["p1"]), gen("Q\nAnswer: one. two.", "three")]
    assert traces.decisions(first) != traces.decisions(later)


def test_reference_errors_are_counted_not_compared():
    rows = [
        traces.compare(
            {"id": "a", "error": "KeyError: 'x'", "events": []}, {"id": "a", "events": [], "prediction": ""}
        ),
        traces.compare({"id": "b", "events": [], "prediction": "x"}, {"id": "b", "events": [], "prediction": "x"}),
    ]
    s = traces.summary(rows)
    assert (s["questions"], s["reference_errors"], s["same_decisions"], s["same_predictions"]) == (2, 1, 1, 1)
    assert [d["id"] for d in s["differing"]] == ["a"]


def test_both_sides_failing_after_the_same_events_is_counted():
    before = [gen("Rewrite Q", "not json")]
    rows = [
        traces.compare({"id": "a", "error": "E", "events": before}, {"id": "a", "error": "E'", "events": before}),
        traces.compare(
            {"id": "b", "error": "E", "events": before}, {"id": "b", "error": "E", "events": [gen("Rewrite Q", "x")]}
        ),
    ]
    s = traces.summary(rows)
    assert (s["reference_errors"], s["dynrag_errors"], s["both_errors_after_the_same_events"]) == (2, 2, 1)


# -- the harness's reference process ----------------------------------------------------------------------
def scripted_driver(tmp_path: Path, body: str) -> Path:
    """A python that runs `body` instead of the driver (argv[1]: -P, argv[2]: the driver, argv[3]: the job)."""
    script = tmp_path / "side.py"
    script.write_text("import json, sys\njob = json.load(open(sys.argv[3]))\n" + body)
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    py.chmod(0o755)
    return py


def job(tmp_path: Path, commit: str = "abc") -> dict:
    return {
        "questions": [{"id": "q1", "question": "Q?"}],
        "out": str(tmp_path / "out.jsonl"),
        "commit": commit,
        "cache": str(tmp_path / "cache"),
        "retrieval_url": "http://x/",
    }


def test_a_failing_reference_stops_with_its_own_error(tmp_path):
    py = scripted_driver(tmp_path, "raise SystemExit('elasticsearch is not running')\n")
    with pytest.raises(SystemExit, match="elasticsearch is not running"):
        harness.run_reference(py, job(tmp_path), tmp_path, lambda m: None, conform_run.DRIVER)


ANSWERING = (  # a reference that answers every question it is given with its id, and logs which it got
    "open(job['out'] + '.asked', 'a').write(' '.join(q['id'] for q in job['questions']) + '\\n')\n"
    "out = open(job['out'], 'w')\n"
    "out.write(json.dumps({'setup': True, 'fewshot': 'F'}) + '\\n')\n"
    "for q in job['questions']:\n"
    "    out.write(json.dumps({'id': q['id'], 'events': [], 'prediction': q['id'], 'seconds': 1.0}) + '\\n')\n"
)


def test_reference_rows_are_cached_per_question(tmp_path):
    py = scripted_driver(tmp_path, ANSWERING)
    one = job(tmp_path)
    setup, rows = harness.run_reference(py, one, tmp_path, lambda m: None, conform_run.DRIVER)
    assert setup["fewshot"] == "F" and [r["prediction"] for r in rows] == ["q1"]
    two = {**one, "questions": [{"id": "q0", "question": "Q0?"}, *one["questions"]]}
    _, rows = harness.run_reference(py, two, tmp_path, lambda m: None, conform_run.DRIVER)
    assert [r["prediction"] for r in rows] == ["q0", "q1"]  # in the order asked
    asked = (tmp_path / "out.jsonl.asked").read_text().split("\n")
    assert asked[:2] == ["q1", "q0"]  # the second run asked the reference for the new question only
    harness.run_reference(
        py, {**two, "commit": "def"}, tmp_path, lambda m: None, conform_run.DRIVER
    )  # other code: again
    assert (tmp_path / "out.jsonl.asked").read_text().split("\n")[2] == "q0 q1"


# `dynrag conform`'s own CLI in a process of its own, its reference venv's python given (argv[1]) and no model or
# index: the reference process is what is under test
CONFORM_WITHOUT_MODEL = """\
import sys
import jobs.conform.env, pipeline.assets.models, pipeline.backends

class Backends:
    retriever = None
    def __init__(self, *a, **k): pass
    def close(self): pass

jobs.conform.env.ensure_reference_env = lambda *a, **k: sys.argv[1]
pipeline.assets.models.resolve_model = lambda name, cache: "/models/m"
pipeline.backends.Backends = Backends
from jobs.cli import main
sys.exit(main(sys.argv[2:]))
"""


def running(pid: int) -> bool:
    """Neither gone nor a zombie (one whose parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_sigterm_to_dynrag_conform_ends_its_reference_process_and_the_reference_s_children(tmp_path):
    src = tmp_path / "DRAGIN"
    (src / "src").mkdir(parents=True)
    (src / "src" / "generate.py").write_text('class SingleRAG:\n    outro = "Answer in the same format."\n')
    configs = src / "config" / "Llama2-7b-chat" / "HotpotQA"
    configs.mkdir(parents=True)
    (configs / "SR-RAG.json").write_text(json.dumps({"method": "single-retrieval", "dataset": "hotpotqa"}))
    dataset = tmp_path / "q.jsonl"
    dataset.write_text(json.dumps({"id": "q1", "question": "Who?", "answers": ["A"]}) + "\n")
    pids = tmp_path / "pids"
    python = tmp_path / "python"  # the reference: its driver's process with a child, both waiting
    python.write_text(f'#!/bin/sh\nsleep 600 &\necho "$$ $!" > {pids}.tmp\nmv {pids}.tmp {pids}\nwait\n')
    python.chmod(0o755)
    (tmp_path / "conform.py").write_text(CONFORM_WITHOUT_MODEL)
    argv = ["conform", "--method", "sr-rag", "--reference-source", str(src), "--dataset", str(dataset)]
    argv += ["--index", str(tmp_path / "index"), "--model-dtype", "checkpoint"]
    argv += ["--set", f"paths.cache_dir={tmp_path / 'cache'}"]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    cmd = [sys.executable, str(tmp_path / "conform.py"), str(python), *argv]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reference: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not pids.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids.is_file(), proc.communicate(timeout=5)[1][-3000:] if proc.poll() is not None else "no reference"
        reference = [int(p) for p in pids.read_text().split()]
        assert all(running(p) for p in reference)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "dynrag: interrupted" in err, err[-3000:]
        deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously
        while any(running(p) for p in reference) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in reference if running(p)]
    finally:
        proc.kill()
        proc.communicate()
        for p in reference:  # a failed test leaves nothing behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_reference_strings_read_a_class_of_the_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "generate.py").write_text(
        "class A:\n    def f(self):\n        return 'Answer in t he same format.\\n'\n"
        "class B:\n    def f(self):\n        return 'Answer in the same format.\\n'\n"
    )
    assert "Answer in t he same format.\n" in conform_run.reference_strings(tmp_path, "A")
    assert "Answer in t he same format.\n" not in conform_run.reference_strings(tmp_path, "B")


# -- the authors' setting ------------------------------------------------------------------------------------
def test_prediction_reads_as_their_data_and_eval_do():
    text = "Cameron directed it. So the answer is James Cameron.\n\nQuestion: Who else?"
    assert authors.prediction(authors.cut(text, at_start_too=False)) == "James Cameron.\n\n"  # as data.py reads it
    assert authors.prediction("So the answer is James Cameron.") == "James Cameron"
    assert authors.prediction("no marker here") == ""
    assert authors.cut("Question: x", at_start_too=False) == "Question: x"  # eval.py keeps a cut at 0 the first time
    assert authors.cut("a Note: b", at_start_too=False) == "a "


def logprobs(tokens: list[tuple[str, float]]) -> list[TokenLogprob]:
    return [TokenLogprob(t, math.log(p)) for t, p in tokens]


def test_flare_modifier_drops_the_first_unsure_sentence_and_its_unsure_tokens():
    text = "Rome is in Italy. Titanic was directed by Spielberg."
    toks = [("Rome", 0.99), (" is", 0.99), (" in", 0.99), (" Italy", 0.99), (".", 0.99)]
    toks += [(" Titanic", 0.95), (" was", 0.99), (" directed", 0.95), (" by", 0.99), (" Spielberg", 0.2), (".", 0.9)]
    out = Completion(text, 10, len(toks), "length", logprobs(toks))
    prev, query = authors.flare_modifier(text, out, threshold=0.08)
    assert prev == "Rome is in Italy."
    # worked by hand through TokenRAG.modifier: sentence 1 takes tokens 0-5 (its five and " Titanic", the
    # one after), mean 1 - p = 0.017; sentence 2 starts at token 6 (" Titanic" is skipped, as the code
    # skips it) and takes " was" .. ".", mean 1 - p = 0.194 > 0.08; token by token " Spielberg" (0.8) and
    # "." (0.1) pass 0.08 and leave the query
    assert query == "Titanic was directed by"
    sure = Completion(text, 10, len(toks), "length", logprobs([(t, 0.999) for t, _ in toks]))
    assert authors.flare_modifier(text, sure, threshold=0.08) is None


def test_flare_query_keeps_what_a_missed_token_leaves_of_an_earlier_mark():
    """TokenRAG marks unsure tokens "[xxx]" and removes the marks; a token its search cannot find lands one
    character before the search's start, inside the previous mark, and "[xxx" stays in the query (worked by
    hand through the code: "abc" -> "[xxx]bc" -> "[xxx" + "[xxx]" + "bc" -> "[xxxbc")."""
    text = "abc"
    out = Completion(text, 3, 3, "length", logprobs([("a", 0.1), ("x", 0.1), ("c", 0.1)]))
    prev, query = authors.flare_modifier(text, out, threshold=0.08)
    assert (prev, query) == ("", "[xxxbc")


class Script:
    """Replies in order; records each prompt."""

    def __init__(self, replies: list[str]):
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts, samplings, chats):
        self.prompts += prompts
        return [Completion(self.replies.pop(0), 1, 5, "length", None, [1] * 5) for _ in prompts]


class Counter:
    """The attention backend's text operations, a word a token."""

    def __init__(self):
        self.cut: list[tuple[str, int]] = []

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]

    def last_tokens(self, items):
        self.cut += items
        return [" ".join(t.split()[-n:]) for t, n in items]


def run_authors(method: str, replies: list[str], **params):
    script = Script(replies)
    backends = Backends(
        DynragConfig(), generator=script, retriever=MemoryRetriever(PASSAGES), named={"attention": Counter()}
    )
    spec = get_method(method)
    p = spec.params({"authors": {"fewshot": FEWSHOT, "case_template": CASE}, **params})
    out = Engine(backends).run([Question("q1", "Who directed Titanic?", dataset="hotpotqa")], spec.program, p)[0]
    assert out.error is None, out.error
    return out.answer, script.prompts


def test_fs_rag_in_the_authors_setting_lays_out_prompts_as_their_code():
    ans, prompts = run_authors(
        "fs-rag",
        ["Titanic was directed by James Cameron. Then more.", "So the answer is James Cameron. Question: x"],
        k=2,
    )
    case = CASE.format(question="Who directed Titanic?")
    ctx = "Context:\n[1] James Cameron directed Titanic.\n[2] Titanic won Best Picture at the 1998 Academy Awards.\n"
    assert prompts[0] == FEWSHOT + ctx + "Answer in the same format as before.\n" + case + " "
    # the first sentence is kept and is the next query; the answer so far follows a blank, as FixLengthRAG joins
    assert prompts[1].endswith(case + "  Titanic was directed by James Cameron.")
    assert ans.prediction == "James Cameron" and len(prompts) == 2 and ans.extra["retrievals"] == 2


def test_no_retrieval_in_the_authors_setting_forces_an_answer_as_their_eval():
    ans, prompts = run_authors("no-retrieval", ["Titanic was directed by James Cameron.", "James Cameron."])
    case = CASE.format(question="Who directed Titanic?")
    assert prompts[0] == FEWSHOT + case
    assert prompts[1] == FEWSHOT + case + " Titanic was directed by James Cameron. So the answer is "
    assert ans.prediction == "James Cameron" and ans.extra["answer_forced"]


def test_a_query_is_cut_to_its_last_64_tokens_as_their_bm25_cuts_it():
    """The code's retrieve(max_query_length=64): FixLengthRAG's query (the text so far) searched by its tail."""
    script, counter, memory = Script(["w " * 70 + "James Cameron.", "So the answer is James Cameron."]), Counter(), []
    retriever = MemoryRetriever(PASSAGES)
    search = retriever.search
    retriever.search = lambda queries, k, retriever="bm25": memory.extend(queries) or search(queries, k, retriever)
    backends = Backends(DynragConfig(), generator=script, retriever=retriever, named={"attention": counter})
    spec = get_method("fs-rag")
    p = spec.params({"authors": {"fewshot": FEWSHOT, "case_template": CASE}, "k": 1})
    Engine(backends).run([Question("q1", "Who directed Titanic?", dataset="hotpotqa")], spec.program, p)
    assert memory[0] == "Who directed Titanic?"  # short: searched whole
    assert len(memory[1].split()) == 64 and memory[1].endswith("James Cameron.")  # the first 8 words cut
    assert [n for _, n in counter.cut] == [64, 64]


def test_the_length_limit_ends_a_question_in_the_authors_setting():
    long = " ".join(["word"] * 60) + "."
    _, prompts = run_authors("fl-rag", [long, long, long], window=60, max_tokens=100)
    assert len(prompts) == 3  # two rounds pass 100 words, then the forced answer


def test_params_for_reads_the_reference_config():
    setup = {"fewshot": "F", "case_template": "C {question}"}
    args = {"generate_max_length": 100, "retrieve_topk": 3, "hallucination_threshold": 0.8, "retrieve_keep_top_k": 35}
    args.update(conform_run.ATTN_WEIGHT_RAG)
    p = conform_run.params_for("dragin", args, setup, "Answer in t he same format as before.\n")
    assert (p["theta"], p["top_n"], p["k"], p["max_tokens"], p["authors"]["fewshot"]) == (0.8, 35, 3, 100, "F")
    get_method("dragin").params(p)  # valid parameters
    with pytest.raises(SystemExit, match="last_sentence"):  # another query of their code is not computed
        conform_run.params_for("dragin", {**args, "query_formulation": "last_sentence"}, setup, "x")
    flare = conform_run.params_for("flare", {**args, "hallucination_threshold": 0.08}, setup, "x")
    assert flare["mean_threshold"] == 0.08 and flare["authors"]["context_outro"] == "x"
    assert get_method("flare").params(flare).authors.case_template == "C {question}"


@pytest.mark.parametrize("driver", ["dragin_driver.py", "erm4_driver.py"])
def test_a_driver_takes_of_dynrag_only_the_standard_library_record_module(driver):
    """The drivers run in the reference's venv, without dynrag's packages: at import they reach record.py alone (here
    with no site-packages at all), so its rows and prompt hashes are the comparison's own."""
    path = Path(conform_run.__file__).with_name(driver)
    code = f"import runpy, sys; runpy.run_path({str(path)!r}); print(sorted(m for m in sys.modules if m.startswith('jobs')))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-S", "-P", "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[-2] == str(["jobs", "jobs.conform", "jobs.conform.record"])


def test_sentences_from_a_spacy_pipeline_folder(tmp_path):
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer", config={"punct_chars": [";"]})  # a pipeline that splits where dynrag's does not
    nlp.to_disk(tmp_path / "pipe")
    text = "One; two. Three"
    assert authors.sentences(text, str(tmp_path / "pipe")) == ["One;", "two. Three"]
    assert authors.sentences(text) == ["One; two.", "Three"]


def test_the_driver_runs_a_forward_asked_for_attentions_in_eager_attention(tmp_path_factory):
    import torch
    from engine_fixtures import tiny_model_path
    from transformers import AutoModelForCausalLM

    from jobs.conform import dragin_driver

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(tmp_path_factory)), attn_implementation="sdpa")
    ids = torch.tensor([[5, 6, 7]])
    assert not model(ids, output_attentions=True).attentions  # transformers 5's SDPA: no weights
    dragin_driver.eager_where_attentions_are_asked(model)
    att = model(ids, output_attentions=True).attentions
    assert len(att) == 2 and att[-1].shape == (1, 4, 3, 3)
    assert model.config._attn_implementation == "sdpa"  # generation runs as loaded
    eager = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(tmp_path_factory)), attn_implementation="eager")
    assert torch.allclose(att[-1], eager(ids, output_attentions=True).attentions[-1])


def test_the_float32_copy_holds_the_same_weights_and_says_float32(tmp_path, tmp_path_factory):
    """--model-dtype float32: a bfloat16 checkpoint copied once with its weights cast (exactly) to float32; the
    reference's loader then keeps float32, and a float32 checkpoint is used as it is."""
    import shutil

    import torch
    from engine_fixtures import tiny_model_path
    from safetensors.torch import load_file, save_file

    bf16 = tmp_path / "bf16-model"
    shutil.copytree(tiny_model_path(tmp_path_factory), bf16)
    weights = {k: v.to(torch.bfloat16) for k, v in load_file(bf16 / "model.safetensors").items()}
    save_file(weights, bf16 / "model.safetensors")
    config = json.loads((bf16 / "config.json").read_text())
    (bf16 / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}))

    copy = Path(harness.float32_copy(str(bf16), str(tmp_path / "cache")))
    assert copy != bf16 and json.loads((copy / "config.json").read_text())["dtype"] == "float32"
    cast = load_file(copy / "model.safetensors")
    assert all(cast[k].dtype == torch.float32 and torch.equal(cast[k], v.float()) for k, v in weights.items())
    assert {f.name for f in copy.iterdir()} == {f.name for f in bf16.iterdir()}  # tokenizer and the rest beside
    assert harness.float32_copy(str(bf16), str(tmp_path / "cache")) == str(copy)  # made once
    assert harness.float32_copy(str(copy), str(tmp_path / "cache")) == str(copy)  # float32 already


def test_every_search_of_dynrags_side_is_traced_though_the_backends_cache_queries():
    """The reference searches each time; dynrag's side must too, or a query an earlier question (or the
    reference, through the same backends) asked is served from the retrieval cache and missing from the trace."""
    backends = Backends(DynragConfig(), generator=Script(["x"] * 4), retriever=MemoryRetriever(PASSAGES))
    assert backends.search_cache is not None  # the default: a cache
    qs = [Question(f"q{i}", "Who directed Titanic?", dataset="hotpotqa") for i in range(2)]
    rows = harness.run_dynrag(backends, qs, "sr-rag", {"k": 1})
    assert [[e["query"] for e in r["events"] if e["kind"] == "retrieve"] for r in rows] == [
        ["Who directed Titanic?"],
        ["Who directed Titanic?"],
    ]


def test_a_search_that_finds_fewer_than_k_lists_k_passages_some_blank_as_their_retriever():
    """retriever.py pads with dummy docs: after a search that found nothing the prompt still lists k blank
    passages and the context line; the answer's used passages are only those found."""
    ans, prompts = run_authors("sr-rag", ["So the answer is no."], k=5)  # 3 passages in all
    listed = prompts[0].split("Context:\n")[1].split("Answer in the same format as before.\n")[0].splitlines()
    assert [line.split("]")[0] for line in listed] == ["[1", "[2", "[3", "[4", "[5"]
    assert listed[3:] == ["[4] ", "[5] "] and all(len(line) > 4 for line in listed[:3])
    assert len(ans.used_docs) == 3 and all(d.id for d in ans.used_docs)
