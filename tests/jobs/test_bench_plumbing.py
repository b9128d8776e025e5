"""The benchmarks' plumbing (never their timings): the FlashRAG driver's configuration, prompt parity and
result parsing, the process-tree RSS helper; a slow end-to-end run of `dynrag bench flashrag`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from bench_fixtures import fake_sides, run_driver_with, save_weights

from indexing.search.hits import Hit
from jobs.bench.flashrag.driver import flashrag_config, read_result
from jobs.bench.flashrag.prepare import driver_config, flashrag_prompt
from jobs.bench.flashrag.run import agreement
from jobs.bench.rig.rss import TreeRss, run_measured
from pipeline.config import load_config
from pipeline.methods.prompts import rag_prompt


def test_flashrag_prompt_renders_dynrag_prompt():
    system, user, doc_format = flashrag_prompt()
    hits = [Hit("a", "Alpha", "first {text}", 1.0), Hit("b", "Beta", "second", 0.5)]
    # what the driver's template does with FlashRAG's documents (contents = "title\ntext")
    reference = "\n".join(doc_format.format(i=i, title=h.title, text=h.text) for i, h in enumerate(hits, 1))
    want = rag_prompt("Who? {x}", hits)
    assert system == want[0]["content"]
    assert user.format(question="Who? {x}", reference=reference) == want[1]["content"]


def test_driver_config_is_complete_and_matches_dynrag(tmp_path):
    cfg = load_config(None, ["generation.max_new_tokens=24", "index.bm25_k1=1.1"])
    c = driver_config(cfg, "/models/smollm2-135m-instruct", tmp_path, k=4, warmup=True, batch=8)
    assert c["warmup_questions"] == str(tmp_path / "warmup.jsonl")
    assert driver_config(cfg, "/m", tmp_path, k=4, warmup=False, batch=8)["warmup_questions"] is None
    json.dumps(c)  # handed over as a JSON file
    fc = flashrag_config(c)
    assert fc["generator_model_path"] == "/models/smollm2-135m-instruct" and fc["retrieval_topk"] == 4
    assert fc["generation_params"] == {"max_tokens": 24, "do_sample": False}
    assert fc["framework"] == "vllm" and fc["gpu_id"] is None and fc["retrieval_method"] == "bm25"
    # FlashRAG's vLLM engine gets dynrag's engine settings for what FlashRAG leaves unset (never the model)
    engine = c["engine_kwargs"]
    assert engine["dtype"] == "float32" and engine["enforce_eager"] is True and engine["max_model_len"] == 2048
    assert "model" not in engine
    hf = driver_config(cfg, "/m", tmp_path, k=4, warmup=False, batch=8, framework="hf", threads=3)
    assert flashrag_config(hf)["framework"] == "hf" and hf["threads"] == 3
    assert fc["bm25_backend"] == "bm25s" and fc["generator_batch_size"] == 8 and fc["metrics"] == []
    assert c["bm25_k1"] == 1.1 and c["dtype"] == "float32" and c["corpus"].endswith("corpus_flashrag.jsonl")
    # every key FlashRAG's Config reads while building the standard pipeline (its basic_config.yaml is missing)
    for key in (
        "split",
        "dataset_name",
        "data_dir",
        "model2path",
        "model2pooling",
        "method2index",
        "index_path",
        "rerank_model_name",
        "rerank_pooling_method",
        "metric_setting",
        "save_note",
        "save_dir",
        "seed",
        "save_retrieval_cache",
        "use_retrieval_cache",
        "use_reranker",
        "refiner_name",
        "use_fid",
        "save_metric_score",
        "save_intermediate_data",
        "generator_max_input_len",
        "gpu_num",
    ):
        assert key in fc, key


def test_read_result_and_agreement():
    out = 'progress...\n{"not": "this"}\nnoise\n{"questions_per_s": 2.0, "predictions": {"q": "x"}}\n'
    assert read_result(out)["questions_per_s"] == 2.0
    a = {"predictions": {"1": "Paris", "2": "no"}, "doc_ids": {"1": ["a", "b"], "2": ["c", "d"]}}
    b = {"predictions": {"1": " Paris", "2": "yes"}, "doc_ids": {"1": ["b", "a"], "2": ["c", "e"]}}
    assert agreement(a, b) == {"same_prediction": 1, "compared": 2, "normalized": False, "topk_overlap": 0.75}
    b["predictions"]["2"], a["predictions"]["2"] = "The No.", None  # normalised: "no" == "no"; None: no answer
    assert agreement(a, b, normalized=True)["same_prediction"] == 1
    a["predictions"]["2"] = "no"
    assert agreement(a, b, normalized=True)["same_prediction"] == 2 and agreement(a, b)["same_prediction"] == 1
    # a reasoning pipeline's placeholder where its budget ran out reads as dynrag's empty prediction
    a["predictions"]["2"], b["predictions"]["2"] = "", "No answer here"
    assert agreement(a, b, normalized=True)["same_prediction"] == 1
    assert agreement(a, b, normalized=True, no_answer="No answer here")["same_prediction"] == 2


CHILD = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import time; b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # not holding the pipes: the child's exit ends the run
    time.sleep(2.0)
    print("done", grandchild.pid, flush=True)
""")  # exits leaving its grandchild running, like an orphaned engine core


def test_run_measured_counts_descendants_and_reaps_the_session():
    m = run_measured([sys.executable, "-c", CHILD], interval=0.1)
    assert m.returncode == 0 and m.stdout.startswith("done")
    assert m.peak_rss > 150 * 2**20  # the grandchild's memory is in the tree's peak
    grandchild = int(m.stdout.split()[1])
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_tree_rss_phases():
    with TreeRss(os.getpid(), interval=0.05) as m:
        m.phase = "small"
        m.sample()
        m.phase = "big"
        held = bytearray(100 * 2**20)
        held[::4096] = b"x" * len(held[::4096])
        m.sample()
    assert m.peaks["big"] >= m.peaks["small"] + 80 * 2**20 and m.peak == max(m.peaks.values())
    del held


@pytest.mark.slow
def test_bench_flashrag_end_to_end(data_dir, tmp_path):
    """Installs FlashRAG into its venv if needed (minutes), then runs both sides on 3 questions."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.cli",
            "--log-level",
            "WARNING",
            "bench",
            "flashrag",
            "--limit",
            "3",
            "--warmup",
            "1",
            "--json",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout)  # one document, nothing else (jobs/jsonout.py)
    rep = figures["repeats"][0]
    assert rep["dynrag"]["questions"] == 3 and rep["flashrag"]["questions"] == 3
    assert rep["dynrag"]["peak_rss_gib"] > 0 and rep["flashrag"]["peak_rss_gib"] > 0
    assert rep["agreement"]["compared"] == 3 and figures["warmup_questions"] == 1


def test_bench_all_runs_each_benchmark_in_its_own_process(monkeypatch, capsys, tmp_path):
    import jobs.bench.all as bench_all
    from jobs.bench.rig.rss import Measured
    from jobs.cli import build_parser

    seen = []

    def fake(cmd, **_):
        seen.append(cmd)
        name = cmd[cmd.index("bench") + 1]
        return Measured(0 if "dragin" not in cmd else 1, f"figures of {name}\n", "boom", 1.0, 2**30)

    monkeypatch.setattr(bench_all, "run_measured", fake)
    args = build_parser().parse_args(
        [
            "bench",
            "all",
            "--index",
            "IDX",
            "--quick",
            "--only",
            "answer",
            "dragin",
            "--workdir",
            str(tmp_path),
            "--set",
            "generation.max_new_tokens=8",
        ]
    )
    assert args.func(args) == 1  # dragin "failed"
    assert [c[c.index("bench") + 1] for c in seen] == ["answer", "dragin"]
    assert seen[0][-4:] == ["--limit", "64", "--set", "generation.max_new_tokens=8"] and "IDX" in seen[0]
    out = capsys.readouterr().out
    assert "figures of answer" in out and "peak RSS of its process tree 1.00 GiB" in out


def test_bench_flashrag_alternates_sides_and_reports_ratios(monkeypatch, capsys, tmp_path):
    from jobs.cli import build_parser

    order, commands, model, _ = fake_sides(monkeypatch, tmp_path)
    args = build_parser().parse_args(
        ["bench", "flashrag", "--limit", "2", "--repeats", "2", "--json", "--workdir", str(tmp_path)]
    )
    assert args.func(args) == 0
    assert order == ["dynrag", "flashrag", "flashrag", "dynrag"]
    figures = json.loads(capsys.readouterr().out)
    assert figures["ratio_median"] == 10.0 and len(figures["repeats"]) == 2
    assert figures["method"] == "sr-rag" and figures["flashrag_pipeline"] == "SequentialPipeline"
    # both sides warm up on the questions after the timed ones (16 asked, 3 left in the file), never on timed ones
    assert figures["warmup_questions"] == 3
    assert commands["dynrag"][commands["dynrag"].index("--warmup") + 1] == str(tmp_path / "warmup.jsonl")
    assert json.loads((tmp_path / "flashrag.json").read_text())["warmup_questions"] == str(tmp_path / "warmup.jsonl")
    rep = figures["repeats"][0]
    assert rep["agreement"] == {"same_prediction": 2, "compared": 2, "normalized": False, "topk_overlap": 0.75}
    assert rep["flashrag"]["peak_rss_gib"] == 1.0 and "predictions" not in rep["dynrag"]
    assert json.loads((tmp_path / "flashrag.json").read_text())["model_path"] == str(model)
    # 2 questions x (2 x 64 FLOPs a prompt token x 100 + 2 x (64 + 400) a generated token x 10) in 4 us
    assert rep["dynrag"]["model_gflops"] == rep["flashrag"]["model_gflops"] == 11.0
    assert figures["matmul_gflops"] == 0.0  # rounded to 0.1
    # each side scored on its own answers: dynrag's "Paris" is right, FlashRAG's raw "x" is not
    assert (rep["dynrag"]["em"], rep["flashrag"]["em"]) == (0.5, 0.0)


def test_flops_per_token_counts_every_matrix_and_the_head_only_for_generated_tokens(tmp_path):
    from jobs.bench.rig.roofline import achieved_gflops, flops_per_token

    hidden, vocab, inter = 8, 50, 12
    layer = {"q": (hidden, hidden), "k": (4, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    body = sum(a * b for a, b in layer.values())
    shapes = {f"model.layers.0.{k}.weight": s for k, s in layer.items()}
    shapes |= {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}  # 1-D: no matmul
    tied = save_weights(tmp_path / "tied", shapes)
    assert flops_per_token(tied) == (2 * body, 2 * (body + vocab * hidden))
    untied = save_weights(tmp_path / "untied", shapes | {"lm_head.weight": (vocab + 2, hidden)})
    assert flops_per_token(untied) == (2 * body, 2 * (body + (vocab + 2) * hidden))
    assert achieved_gflops(untied, 10, 2, questions=3, seconds=2.0) == pytest.approx(
        (2 * body * 10 + 2 * (body + (vocab + 2) * hidden) * 2) * 3 / 2.0 / 1e9
    )
    with pytest.raises(FileNotFoundError):
        flops_per_token(tmp_path)


def test_matmul_gflops_is_a_positive_rate():
    from jobs.bench.rig.roofline import matmul_gflops

    assert 0.1 < matmul_gflops(n=128, seconds=0.2) < 1e5


def test_bench_pipeline_runs_every_method_on_both_engines(capsys):
    """`dynrag bench pipeline --simulate-gpu --json` with a few questions and no sleeping (no speed asserted)."""
    from jobs.cli import main

    main(["bench", "pipeline", "--simulate-gpu", "--questions", "6", "--time-scale", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["engine"]) for r in out] == [
        (m, e) for m in ("sr-rag", "cfs", "pairs", "dragin") for e in ("lockstep", "continuous")
    ]
    assert all({"questions_per_s", "generator_busy", "mean_latency_s"} <= set(r) for r in out)
    assert all(0 <= r["generator_busy"] <= 1 and r["decode_steps"] >= 1 for r in out)


def test_the_flashrag_side_imports_the_flashrag_package_not_the_bench_module_beside_the_driver(tmp_path):
    """jobs/bench/flashrag/run.py lies beside the driver script: the side's command must import the real package."""
    fake = tmp_path / "site" / "flashrag"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "config.py").write_text("import sys\nprint('the flashrag package')\nsys.exit(0)\n")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"threads": 1}))
    r = run_driver_with(tmp_path / "site", config)
    assert "the flashrag package" in r.stdout, r.stderr[-2000:]


# -- bench flashrag --method: methods, FlashRAG's templates, counts ------------------------------------------------
FLASHRAG_CLASSES = {
    "sr-rag": "SequentialPipeline",
    "flare": "FLAREPipeline",
    "ircot": "IRCOTPipeline",
    "self-ask": "SelfAskPipeline",
    "iter-retgen": "IterativePipeline",
    "sure": "SuRePipeline",
    "search-r1": "SearchR1Pipeline",
    "search-o1": "SimpleDeepSearcherPipeline",
}


def made_up_dump() -> dict:
    """What the driver's --templates writes, with made-up text (the project carries no FlashRAG prompt)."""

    def tpl(user, chat=True, doc="D{idx} {title}: {text}\n"):
        return {"system": "", "user": user, "doc": doc, "chat": chat}

    return {
        "defaults": {"max_iter": 4, "iter_num": 3, "threshold": 0.25, "max_iter_num": 6, "single_hop": True},
        "templates": {
            "standard": tpl("{reference}Q: {question}"),
            "prompt": tpl("{reference}Q {question}\nT:", False),
            "head": tpl("Ask.\n{reference}Q: {question}\nNeeded: No.\n", False),
            "candidates": tpl("{N} docs\n{reference}Q: {question}"),
            "summary": tpl("{reference}Q: {question} P: {pred}"),
            "validity": tpl("Q: {question} P: {pred} S: {summary}"),
            "rank": tpl("Q: {question} 1: {summary1} 2: {summary2}"),
        },
    }


def test_each_method_maps_to_flashrags_pipeline_class_and_a_dynrag_method(tmp_path):
    from jobs.bench.flashrag.methods import METHODS, bench_method
    from pipeline.methods.registry import get_method

    assert {m: spec.pipeline for m, spec in METHODS.items()} == FLASHRAG_CLASSES
    cfg = load_config(None, ["generation.max_new_tokens=24"])
    for name in METHODS:
        assert get_method(name).name == name
        c = driver_config(cfg, "/m", tmp_path, k=3, warmup=False, batch=8, method=name)
        assert c["pipeline"] == FLASHRAG_CLASSES[name] and c["dynrag_prompt"] == (name == "sr-rag")
        assert (METHODS[name].differs is None) == (name == "sr-rag")  # every other method says what differs
    assert driver_config(cfg, "/m", tmp_path, 3, False, 8, "flare")["pipeline_kwargs"] == {
        "max_generation_length": 24,
        "look_ahead_steps": 24,
    }
    with pytest.raises(ValueError, match="unknown method 'self-rag'.*ircot"):
        bench_method("self-rag")


def test_unknown_method_is_a_clear_cli_error_and_help_lists_the_methods(capsys):
    from jobs.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "flashrag", "--method", "self-rag"])
    assert "invalid choice: 'self-rag'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "flashrag", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(f"{m} ({c})" in out for m, c in FLASHRAG_CLASSES.items())


@pytest.mark.parametrize("method", ["ircot", "self-ask", "iter-retgen", "sure", "flare"])
def test_flashrags_templates_and_budgets_reach_the_dynrag_methods_params(method):
    from jobs.bench.flashrag.methods import dynrag_params
    from pipeline.methods.registry import get_method
    from pipeline.methods.templates import PromptTemplate

    d = made_up_dump()
    values = dynrag_params(method, d, k=4, max_new_tokens=24)
    p = get_method(method).params(json.loads(json.dumps(values)))  # as the side reads its --params file
    assert p.k == 4
    t = d["templates"]
    if method == "ircot":
        assert p.template == PromptTemplate(**t["prompt"]) and p.max_steps == 4 and p.sentence_tokens == 24
    elif method == "self-ask":
        assert p.template == PromptTemplate(**t["head"]) and p.answer_template == PromptTemplate(**t["standard"])
        assert p.max_follow_ups == 2  # FlashRAG's 4 generate calls alternate follow-up and intermediate answer
        assert p.retrieve_question  # FlashRAG's single_hop: the question's passages in the head prompt
    elif method == "iter-retgen":
        assert p.template == PromptTemplate(**t["prompt"]) and p.iterations == 3 and p.max_tokens == 24
    elif method == "sure":
        assert {s: p.template(s) for s in ("candidates", "summary", "validity", "rank")} == {
            s: PromptTemplate(**t[s]) for s in ("candidates", "summary", "validity", "rank")
        }
        assert not p.constrained and p.candidates == 2
    else:  # FlashRAG's template, threshold and retrieval budget; a retrieval serves one sentence
        assert p.template == PromptTemplate(**t["prompt"]) and not p.keep_docs
        assert p.prob_threshold == 0.25 and p.max_retrievals == 6 and p.max_tokens == 24


def test_a_template_with_a_field_the_method_does_not_fill_is_refused_before_any_side_runs():
    from jobs.bench.flashrag.methods import dynrag_params
    from pipeline.methods.registry import MethodError

    d = made_up_dump()
    d["templates"]["prompt"]["user"] += "{examplars}"
    with pytest.raises(MethodError, match="examplars"):
        dynrag_params("ircot", d, k=3, max_new_tokens=24)


def test_bench_flashrag_method_passes_templates_and_prints_counts(monkeypatch, capsys, tmp_path):
    from jobs.cli import build_parser

    order, commands, _, _ = fake_sides(monkeypatch, tmp_path, dumped=made_up_dump())
    args = build_parser().parse_args(
        ["bench", "flashrag", "--method", "ircot", "--limit", "2", "--workdir", str(tmp_path)]
    )
    assert args.func(args) == 0
    dyn = commands["dynrag"]
    assert dyn[dyn.index("--method") + 1] == "ircot"
    params = json.loads(open(dyn[dyn.index("--params") + 1]).read())
    assert params["template"] == made_up_dump()["templates"]["prompt"] and params["max_steps"] == 4
    assert json.loads((tmp_path / "flashrag.json").read_text())["pipeline"] == "IRCOTPipeline"
    for side in ("dynrag", "flashrag"):  # each side's predictions are kept in the workdir
        assert len(json.loads((tmp_path / f"{side}-repeat1.json").read_text())["predictions"]) == 2
    out = capsys.readouterr().out
    assert "ircot vs FlashRAG IRCOTPipeline" in out and "prompts/steps differ: same prompt text" in out
    assert "dynrag's template: FlashRAG's own" in out
    assert "LLM calls 2.50, retrievals 1.50, prompt tokens 100.0 (0 in all from vLLM's prefix cache), generated" in out
    assert "LLM calls 3.00" in out and "EM 0.500 F1 0.500" in out
    assert "identical predictions (answers after SQuAD normalisation) 2/2 (100%)" in out
    assert "overlap" not in out  # top-k overlap: sr-rag only
    assert "no ratio above" in out and "questions/s: 10.0" in out


class _Tokens(list):
    @property
    def shape(self):
        return (len(self), len(self[0]))

    def sum(self):
        return sum(map(sum, self))


class _Seqs(_Tokens):
    def __getitem__(self, key):
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        return _Seqs(r[cols] for r in list.__getitem__(self, rows))

    def tolist(self):
        return [list(r) for r in self]


def test_counts_wrap_flashrags_generator_and_retriever():
    from types import SimpleNamespace

    from jobs.bench.flashrag.probe import Counts

    def model_generate(input_ids, attention_mask, **_):  # two prompts of 3 and 2 tokens; 0 pads, 9 ends
        return SimpleNamespace(sequences=_Seqs([input_ids[0] + [5, 6, 9, 0], input_ids[1] + [7, 0, 0, 0]]))

    model = SimpleNamespace(generate=model_generate)
    gen = SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=9))
    gen.generate = lambda prompts, **_: (
        [gen.model.generate(input_ids=_Tokens([[1, 2, 3], [0, 1, 2]]), attention_mask=_Tokens([[1, 1, 1], [0, 1, 1]]))]
        * 2
    )
    ret = SimpleNamespace(search=lambda q, **_: [], batch_search=lambda qs, **_: [[] for _ in qs])
    counts = Counts(SimpleNamespace(generator=gen, retriever=ret))
    gen.generate(["p1", "p2"])
    ret.search("q")
    ret.batch_search(["a", "b", "c"], return_score=True)
    # generated: each row's tokens up to and with its first end (or pad) token
    totals = {"llm_calls": 2, "retrievals": 4, "prompt_tokens": 5, "completion_tokens": 3 + 2}
    assert counts.totals == {**totals, "cached_prompt_tokens": 0}  # transformers: no prefix cache
    assert counts.per_question(2)["retrievals_per_question"] == 2.0
    counts.reset()
    assert counts.per_question(2)["llm_calls_per_question"] == 0.0


class _FakeTemplate:
    """A FlashRAG-shaped PromptTemplate (made-up text)."""

    system_prompt, user_prompt, is_chat, enable_chat = "Sys {reference}", "Q: {question}", True, False

    def format_reference(self, docs):
        return "".join(f"[{i + 1}] {{{d['title']}}} {d['text']}\n" for i, d in enumerate(docs))


def test_probe_reads_flashrags_template_objects_as_dynrag_templates():
    from jobs.bench.flashrag.probe import doc_format, self_ask_head, template_fields
    from pipeline.methods.templates import PromptTemplate

    fields = template_fields(_FakeTemplate())
    assert fields == {
        "system": "Sys {reference}",
        "user": "Q: {question}",
        "doc": "[{idx}] {{{title}}} {text}\n",
        "chat": False,
    }
    hits = [Hit("a", "T1", "one", 1.0), Hit("b", "T2", "two", 0.5)]
    assert PromptTemplate(**fields).reference(hits) == _FakeTemplate().format_reference(
        [{"title": h.title, "text": h.text} for h in hits]
    )
    with pytest.raises(ValueError, match="count from 1"):
        doc_format(lambda docs: "".join(f"({i}) {d['text']}" for i, d in enumerate(docs)))

    class SelfAsk:  # assembles its prompt in run_item, as FlashRAG's Self-Ask does
        format_reference = _FakeTemplate.format_reference

        def run_item(self, item):
            ref = self.format_reference(self.retriever.search(item.question))
            self.generator.generate("Ask {sub}.\n" + ref + "Q: " + item.question + "\nNeeded: No.\n")

    head = self_ask_head(SelfAsk())
    assert head["user"] == "Ask {{sub}}.\n{reference}Q: {question}\nNeeded: No.\n" and not head["chat"]
    rendered = PromptTemplate(**head).render(hits[:1], question="Who?")
    assert rendered == "Ask {sub}.\n[1] {T1} one\nQ: Who?\nNeeded: No.\n"


def test_the_driver_reads_retrieved_passages_of_every_pipelines_items():
    from types import SimpleNamespace

    import numpy as np

    from jobs.bench.flashrag.driver import _retrieved

    class NeverRetrieved:  # FlashRAG's Item raises AttributeError for an output it never set (FLARE, no trigger)
        def __getattr__(self, name):
            raise AttributeError(name)

    class NeverRetrievedOnMain:  # FlashRAG's GitHub main: Item.__getattr__ reads its data dict
        def __getattr__(self, name):
            raise KeyError(name)

    docs = [{"id": "a"}, {"id": "b"}]
    assert _retrieved(SimpleNamespace(retrieval_result=np.array(docs, dtype=object))) == docs  # IterativePipeline
    assert _retrieved(SimpleNamespace(retrieval_result=docs)) == docs and _retrieved(NeverRetrieved()) == []
    assert _retrieved(NeverRetrievedOnMain()) == []


def test_flashrags_search_of_a_query_with_no_tokens_finds_nothing_instead_of_ending_the_run():
    from jobs.bench.flashrag.driver import no_tokens_no_hits

    def search(query, num=None, return_score=False):  # bm25s's refusal, as FlashRAG's BM25 retriever raises it
        if query == "bad":
            raise ValueError("The query_tokens must be a list of list of tokens")
        if query == "other":
            raise ValueError("something else")
        return ([{"id": "1"}], [1.0]) if return_score else [{"id": "1"}]

    shim = no_tokens_no_hits(search)
    assert shim("bad") == [] and shim("bad", return_score=True) == ([], [])
    assert shim("good", 3, True) == ([{"id": "1"}], [1.0]) and shim("good") == [{"id": "1"}]
    with pytest.raises(ValueError, match="something else"):
        shim("other")


# -- reasoning pipelines (FlashRAG's GitHub main): search-r1 and search-o1 -----------------------------------------
class _FakeReasoning:
    """A ReasoningPipeline-shaped object (made-up text): its template, block of documents and stop strings."""

    prompt_template = _FakeTemplate()
    stop_tokens = ["</q>", " </q>", "</a>"]

    def _retrieved_docs_to_string(self, docs):
        return "\n\n<r>\n" + "".join(f"#{i + 1}[{d['title']}] {d['text']}\n" for i, d in enumerate(docs)) + "\n</r>\n\n"


def test_probe_reads_a_reasoning_pipelines_block_of_documents():
    from jobs.bench.flashrag.probe import reasoning_templates, result_block

    block = result_block(_FakeReasoning()._retrieved_docs_to_string)
    assert block == {"head": "\n\n<r>\n", "tail": "\n</r>\n\n", "doc": "#{idx}[{title}] {text}\n"}
    t = reasoning_templates(_FakeReasoning())
    assert t["prompt"]["doc"] == "#{idx}[{title}] {text}\n" and t["prompt"]["user"] == "Q: {question}"
    assert t["result"] == {"head": "\n\n<r>\n", "tail": "\n</r>\n\n", "stop": ["</q>", " </q>", "</a>"]}
    with pytest.raises(ValueError, match="head, one string per document, tail"):
        result_block(lambda docs: f"{len(docs)} documents")


def reasoning_dump(
    tags, answer=True, budget=4, user="Search at most {MAX_SEARCH_LIMIT} times. Q: {question}\n"
) -> dict:
    fields = {
        "system": "",
        "user": user,
        "doc": "#{idx} {text}\n",
    }
    return {
        "defaults": {
            "max_retrieval_num": budget,
            "begin_of_query_token": tags.query[0],
            "end_of_query_token": tags.query[1],
            "begin_of_documents_token": tags.result[0],
            "end_of_documents_token": tags.result[1],
            **({"begin_of_answer_token": tags.answer[0], "end_of_answer_token": tags.answer[1]} if answer else {}),
        },
        "templates": {
            "prompt": {**fields, "chat": True},
            "result": {
                "head": f"\n\n{tags.result[0]}\n",
                "tail": f"\n{tags.result[1]}\n\n",
                "stop": [tags.query[1], tags.answer[1], "<|endoftext|>"],
            },
        },
    }


def test_search_r1_and_o1_take_the_reasoning_pipelines_template_budget_and_strict_turns():
    from jobs.bench.flashrag.methods import dynrag_params
    from pipeline.methods import search_o1, search_r1
    from pipeline.methods.registry import MethodError, get_method
    from pipeline.methods.templates import PromptTemplate

    d = reasoning_dump(search_r1.TAGS, user="Q: {question}\n")
    p = get_method("search-r1").params(json.loads(json.dumps(dynrag_params("search-r1", d, k=3, max_new_tokens=24))))
    assert p.strict and p.k == 3 and p.max_turns == p.max_searches == 4 and p.turn_tokens == 24
    assert p.template == PromptTemplate(system="", user="Q: {question}\n", doc="#{idx} {text}\n", chat=True)
    o1 = dynrag_params("search-o1", reasoning_dump(search_o1.TAGS, answer=False, budget=10), 3, 24)
    p = get_method("search-o1").params(json.loads(json.dumps(o1)))
    assert p.template.user == "Search at most {max_searches} times. Q: {question}\n"  # FlashRAG's MAX_SEARCH_LIMIT
    assert p.max_turns == 10 and p.strict and p.refine_tokens == 24
    bad = reasoning_dump(search_r1.TAGS)
    bad["defaults"]["end_of_query_token"] = "</query>"
    with pytest.raises(MethodError, match="query tags"):
        dynrag_params("search-r1", bad, 3, 24)
    bad = reasoning_dump(search_r1.TAGS)
    bad["templates"]["result"]["tail"] = "</information>"
    with pytest.raises(MethodError, match="block tags"):
        dynrag_params("search-r1", bad, 3, 24)
    bad = reasoning_dump(search_r1.TAGS)
    bad["templates"]["result"]["stop"] = ["</search>"]
    with pytest.raises(MethodError, match="stop strings"):
        dynrag_params("search-r1", bad, 3, 24)


def test_a_reasoning_pipelines_batch_search_refused_for_a_query_without_tokens_searches_one_by_one():
    from jobs.bench.flashrag.driver import _retrieved, no_tokens_no_hits, one_by_one_on_no_tokens

    def search(query, num=None, return_score=False):
        if query == "and":
            raise ValueError("The query_tokens must be a list of list of tokens")
        return ([{"id": query}], [1.0]) if return_score else [{"id": query}]

    def batch_search(queries, num=None, return_score=False):
        if "and" in queries:
            raise ValueError("The query_tokens must be a list of list of tokens")
        raise AssertionError("not reached")

    shim = one_by_one_on_no_tokens(batch_search, no_tokens_no_hits(search))
    assert shim(["x", "and"]) == [[{"id": "x"}], []]
    assert shim(["x", "and"], 3, True) == ([[{"id": "x"}], []], [[1.0], []])
    from types import SimpleNamespace

    item = SimpleNamespace(
        retrieval_results={0: {"query": "a", "docs": [{"id": "1"}]}, 1: {"query": "b", "docs": [{"id": "2"}]}}
    )
    assert _retrieved(item) == [{"id": "2"}] and _retrieved(SimpleNamespace(retrieval_results={})) == []
