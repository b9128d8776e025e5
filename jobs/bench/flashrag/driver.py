"""FlashRAG's side of `dynrag bench flashrag`: the FlashRAG pipeline class the config names (SequentialPipeline,
FLAREPipeline, IRCOTPipeline, ...; BM25 via bm25s; its vLLM generator, `framework: vllm`, or transformers, `hf`)
over the bench's corpus and questions, timed, with its generator and retriever wrapped to count calls and
tokens; prints one JSON line. Where the vLLM generator fails (starting, or serving the method's calls), the
driver prints a JSON line with `vllm_failed` (the error and the frame it came from) and exits with
VLLM_FAILED: the bench then runs this method on hf.

FlashRAG's vLLM generator passes `LLM(...)` the tensor parallel size it computes from the GPU count (0 on a
machine without one: the driver gives 1, what it computes on a one-GPU machine) and its own memory and logprob
settings; what it leaves unset (dtype, eager mode, prefix caching, block size, seed, max_model_len) the driver fills with
dynrag's engine settings (`engine_kwargs` of the config), recorded as `engine_kwargs_added`.

Runs with the python of FlashRAG's own venv (jobs/bench/flashrag/env.py): `python -P driver.py
CONFIG.json`; with `--bm25` it only builds FlashRAG's BM25 index; with `--templates OUT.json` it only writes the pipeline's prompt templates and defaults (read from
the installed package by probe.py, no model loaded) for dynrag's side to ask the same prompts.
Standard library only at import, so dynrag's tests can check the config it writes and its output.
Workarounds for flashrag-dev 0.1.2 (see the STACK notes): its wheel lacks `basic_config.yaml`, so the
whole configuration is given here (a checkout's own file, where there is one, stays under it); its BM25 builder
indexes characters, so the bm25s index is built here from text tokenised the way its retriever tokenises
queries (`build_bm25`).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.perf_counter()
VLLM_FAILED = 3  # exit status: FlashRAG's vLLM generator could not serve the method


def flashrag_config(c: dict) -> dict:
    """The complete FlashRAG configuration for the bench's driver config `c` (see jobs/bench/flashrag/run.py)."""
    work = Path(c["work"])
    return {
        "dataset_name": "bench",
        "data_dir": str(work),
        "split": ["test"],
        "test_sample_num": None,
        "random_sample": False,
        "save_dir": str(work / "output"),
        "save_note": "bench",
        "seed": 2024,
        "gpu_id": None,
        "gpu_num": 0,
        "framework": c["framework"],
        "device": "cpu",
        "generator_model": "smollm2",
        "generator_model_path": c["model_path"],
        "generator_lora_path": None,
        "generator_max_input_len": c.get("max_input_len", 2048),  # dynrag's generation.max_model_len
        "generator_batch_size": c["batch_size"],
        "use_fid": False,
        "generation_params": {"max_tokens": c["max_new_tokens"], "do_sample": False},
        "retrieval_method": "bm25",
        "bm25_backend": "bm25s",
        "index_path": str(work / "bm25"),
        "corpus_path": c["corpus"],
        "retrieval_topk": c["k"],
        "retrieval_batch_size": 256,
        "retrieval_use_fp16": False,
        "retrieval_query_max_length": 128,
        "retrieval_pooling_method": "mean",
        "use_sentence_transformer": False,
        "instruction": "",
        "faiss_gpu": False,
        "save_retrieval_cache": False,
        "use_retrieval_cache": False,
        "retrieval_cache_path": None,
        "use_reranker": False,
        "rerank_model_name": None,
        "rerank_model_path": None,
        "rerank_pooling_method": None,
        "refiner_name": None,
        "model2path": {},
        "model2pooling": {},
        "method2index": {},
        "metrics": [],
        "metric_setting": {},
        "save_metric_score": False,
        "save_intermediate_data": False,
    }


def read_result(stdout: str) -> dict:
    """The driver's result: the last stdout line that is a JSON object."""
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])


def build_bm25(c: dict, index_dir: Path) -> None:
    """FlashRAG's bm25s index of the corpus (unless it is there), tokenised as the installed FlashRAG's retriever
    tokenises queries: 0.1.2 with `bm25s.tokenize` and an English stemmer; a FlashRAG whose retriever loads a
    saved tokenizer (its GitHub main) with that tokenizer (English stopwords and stemmer), saved beside it."""
    if (index_dir / "params.index.json").is_file():
        return
    import bm25s
    import Stemmer
    from flashrag.retriever.retriever import BM25Retriever

    docs = [json.loads(line) for line in Path(c["corpus"]).read_text(encoding="utf-8").splitlines() if line]
    texts, stemmer = [d["contents"] for d in docs], Stemmer.Stemmer("english")
    saved_tokenizer = "load_vocab" in inspect.getsource(BM25Retriever)
    if saved_tokenizer:
        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en", stemmer=stemmer)
        tokens = tokenizer.tokenize(texts, return_as="tuple", show_progress=False)
    else:
        tokens = bm25s.tokenize(texts, stemmer=stemmer, show_progress=False)
    bm25 = bm25s.BM25(k1=c["bm25_k1"], b=c["bm25_b"])
    bm25.index(tokens, show_progress=False)
    bm25.save(str(index_dir), corpus=docs)
    if saved_tokenizer:
        tokenizer.save_vocab(str(index_dir))
        tokenizer.save_stopwords(str(index_dir))


def probe_module():
    """probe.py beside this file, loaded by path (the driver's folder is not on sys.path)."""
    spec = importlib.util.spec_from_file_location("flashrag_probe", Path(__file__).with_name("probe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dump_templates(c: dict, config, out: str) -> None:
    """The pipeline class's templates and defaults as JSON, built with its generator and retriever stubbed."""
    import flashrag.pipeline as fp
    import flashrag.pipeline.active_pipeline as active
    import flashrag.pipeline.branching_pipeline as branching
    import flashrag.pipeline.pipeline as basic
    from flashrag.prompt import PromptTemplate

    probe = probe_module()
    modules = [active, branching, basic]
    if importlib.util.find_spec("flashrag.pipeline.reasoning_pipeline"):  # GitHub main; 0.1.2 has none
        modules.append(importlib.import_module("flashrag.pipeline.reasoning_pipeline"))
    for module in modules:
        for factory in ("get_generator", "get_retriever"):
            if hasattr(module, factory):
                setattr(module, factory, lambda *a, **k: probe._Stub())
    cls = getattr(fp, c["pipeline"])
    pipeline = cls(config, **c["pipeline_kwargs"])
    dumped = {
        "pipeline": c["pipeline"],
        "defaults": probe.defaults(cls),
        "templates": probe.templates(pipeline, PromptTemplate(config)),
    }
    Path(out).write_text(json.dumps(dumped, indent=1), encoding="utf-8")


def engine_defaults(extra: dict, added: dict) -> None:
    """`vllm.LLM` (FlashRAG imports it when its generator starts) made to fill the arguments FlashRAG leaves
    unset from `extra`, and a tensor parallel size below 1 with 1; what was filled goes into `added`."""
    import vllm

    class LLM(vllm.LLM):
        def __init__(self, model, **kwargs):
            if kwargs.get("tensor_parallel_size", 1) < 1:
                added["tensor_parallel_size"] = kwargs["tensor_parallel_size"] = 1
            for key, value in extra.items():
                if key not in kwargs:
                    added[key] = kwargs[key] = value
            super().__init__(model, **kwargs)

    vllm.LLM = LLM


def failure(err: BaseException) -> str:
    """The error and the innermost frame of FlashRAG (or, without one, the last frame) it came from."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if "/flashrag/" in f.filename] or frames
    where = f" (at {own[-1].filename}:{own[-1].lineno} in {own[-1].name})" if own else ""
    return f"{type(err).__name__}: {err}{where}"


def load_config(c: dict):
    """FlashRAG's Config for the driver config `c` (torch's threads set first)."""
    import torch

    torch.set_num_threads(c["threads"])
    from flashrag.config import Config  # first: the test of the side's command fakes this module

    if not Path(inspect.getfile(Config)).with_name("basic_config.yaml").is_file():  # PyPI's 0.1.2 wheel lacks it
        Config._get_internal_config = lambda self: {}
    return Config(config_dict=flashrag_config(c))


def main(config_path: str, templates_out: str | None = None, bm25_only: bool = False) -> None:
    c = json.loads(Path(config_path).read_text(encoding="utf-8"))
    if bm25_only:  # before any timed run: FlashRAG's index, as dynrag's, is built outside the sides' processes
        return build_bm25(c, Path(flashrag_config(c)["index_path"]))
    config = load_config(c)
    if templates_out:
        return dump_templates(c, config, templates_out)
    added: dict = {}
    if c["framework"] == "vllm":
        engine_defaults(c["engine_kwargs"], added)
        try:
            result = run_pipeline(c, config)
        except Exception as err:
            print(json.dumps({"side": "flashrag", "vllm_failed": failure(err)}), flush=True)
            sys.exit(VLLM_FAILED)
    else:
        result = run_pipeline(c, config)
    print(json.dumps({**result, "engine_kwargs_added": added}), flush=True)


def run_table(paths: list[str]) -> None:
    """A paper's table in one FlashRAG process: each driver config's pipeline in turn, every one handed the first
    one's generator and retriever (the pipeline modules' `get_generator` and `get_retriever` answer with them);
    prints each pipeline's result as one JSON line (no warm-up: the process is timed whole)."""
    shared: dict = {}
    for path in paths:
        c = json.loads(Path(path).read_text(encoding="utf-8"))
        config = load_config(c)
        if c["framework"] == "vllm" and not shared:
            engine_defaults(c["engine_kwargs"], {})
        print(json.dumps(run_pipeline({**c, "warmup_questions": None}, config, shared)), flush=True)


def share_components(shared: dict) -> None:
    """FlashRAG's pipeline modules made to hand every pipeline the generator and retriever in `shared`."""
    modules = [
        "flashrag.pipeline.pipeline",
        "flashrag.pipeline.active_pipeline",
        "flashrag.pipeline.branching_pipeline",
    ]
    for name in modules:
        module: Any = importlib.import_module(name)
        module.get_generator = lambda *a, **k: shared["generator"]
        module.get_retriever = lambda *a, **k: shared["retriever"]


def run_pipeline(c: dict, config, shared: dict | None = None) -> dict:
    """Builds the pipeline, warms it up, times it over the questions: the side's result. `shared`: one process's
    generator, retriever and counters, made by its first pipeline and handed to the later ones."""
    import torch
    from flashrag.dataset import Dataset
    from flashrag.prompt import PromptTemplate

    fp = importlib.import_module("flashrag.pipeline")

    class DocsAsDynrag(PromptTemplate):  # the documents formatted as dynrag's prompt lists them
        def format_reference(self, retrieval_result):
            return "\n".join(
                c["doc_format"].format(
                    i=i, title=d["contents"].split("\n")[0], text="\n".join(d["contents"].split("\n")[1:])
                )
                for i, d in enumerate(retrieval_result, 1)
            )

    build_bm25(c, Path(config["index_path"]))
    kwargs = dict(c["pipeline_kwargs"])
    if c["dynrag_prompt"]:  # sr-rag: FlashRAG asks dynrag's prompt
        kwargs["prompt_template"] = DocsAsDynrag(config, system_prompt=c["system_prompt"], user_prompt=c["user_prompt"])
    if shared:
        share_components(shared)
    pipeline = getattr(fp, c["pipeline"])(config, **kwargs)
    if shared:
        counts = shared["counts"]
    else:
        pipeline.retriever.search = no_tokens_no_hits(pipeline.retriever.search)
        pipeline.retriever.batch_search = one_by_one_on_no_tokens(
            pipeline.retriever.batch_search, pipeline.retriever.search
        )
        counts = probe_module().Counts(pipeline)
        if shared is not None:
            shared.update(generator=pipeline.generator, retriever=pipeline.retriever, counts=counts)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(c["dtype"])
    if c["framework"] == "hf" and dtype is not None:
        pipeline.generator.model.to(dtype)

    def read(path):
        return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]

    questions = read(c["questions"])
    if c["warmup_questions"]:  # other questions than the timed ones
        pipeline.run(Dataset(config, data=[_item(q) for q in read(c["warmup_questions"])]), do_eval=False)
    startup = time.perf_counter() - T_START
    counts.reset()
    dataset = Dataset(config, data=[_item(q) for q in questions])
    t0 = time.perf_counter()
    out = pipeline.run(dataset, do_eval=False)
    secs, finished_at = time.perf_counter() - t0, time.time()
    answered = sum(isinstance(it.pred, str) for it in out)
    return {
        "side": "flashrag",
        "framework": c["framework"],
        "threads": c["threads"],
        "questions": len(questions),
        "answered": answered,
        "errors": len(questions) - answered,
        "seconds": round(secs, 3),
        "finished_at": finished_at,
        "questions_per_s": answered / secs,
        "startup_s": round(startup, 2),
        "generator_dtype": c["dtype"] if c["framework"] == "vllm" else str(pipeline.generator.model.dtype),
        "pipeline": c["pipeline"],
        **counts.totals,
        **counts.per_question(len(questions)),
        "predictions": {it.id: it.pred for it in out},
        "doc_ids": {it.id: [d["id"] for d in _retrieved(it)] for it in out},
    }


def no_tokens_no_hits(search):
    """FlashRAG's `retriever.search` where a query with no token left after bm25s's stopwords and stemming
    (IRCoT sends such thoughts, e.g. "So the answer is:") retrieves nothing, as Lucene does on dynrag's side;
    bm25s raises ValueError for it, which ended FlashRAG's whole run."""

    def search_or_nothing(query, num=None, return_score=False):
        try:
            return search(query, num, return_score)
        except ValueError as err:
            if "query_tokens" not in str(err):
                raise
            return ([], []) if return_score else []

    return search_or_nothing


def one_by_one_on_no_tokens(batch_search, search):
    """FlashRAG's `retriever.batch_search` where bm25s refuses the batch because one query has no token left
    (a reasoning pipeline's query such as "and"): the queries are searched one by one with `search` (the
    shimmed one, which finds nothing for such a query)."""

    def batch_or_each(queries, num=None, return_score=False):
        try:
            return batch_search(queries, num, return_score)
        except ValueError as err:
            if "query_tokens" not in str(err):
                raise
            each = [search(q, num, return_score) for q in queries]
            return ([d for d, _ in each], [s for _, s in each]) if return_score else each

    return batch_or_each


def _retrieved(item) -> list:
    """The passages an item's last retrieval found (none when the pipeline never retrieved for it); a reasoning
    pipeline keeps each search's in `retrieval_results` ({turn: {query, docs}})."""
    for name in ("retrieval_result", "retrieval_results"):
        try:
            docs = getattr(item, name)  # a list, or an array where the pipeline set it for the whole dataset
        except (AttributeError, KeyError):  # never set: 0.1.2's Item raises AttributeError, GitHub main's KeyError
            continue
        if isinstance(docs, dict):
            docs = docs[max(docs)]["docs"] if docs else None
        return [] if docs is None else list(docs)
    return []


def _item(q: dict):
    from flashrag.dataset import Item

    return Item({"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]})


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        run_table(sys.argv[2:])
    else:
        main(sys.argv[1], sys.argv[3] if sys.argv[2:3] == ["--templates"] else None, sys.argv[2:3] == ["--bm25"])
