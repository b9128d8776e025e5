"""`dynrag conform` for ERM4: `erm4` (configuration iv: Rewriter+, retriever, Knowledge Filter, reader) and
`erm4-rewriter` (iii: no filter) against the authors' code (Ancientshi/ERM4; CC BY-NC-SA: run, never copied).

Their LLM calls go to an OpenAI-compatible endpoint served here (`serve_llm`) by dynrag's generator on the same
model, greedy, one request at a time; their Bing search to dynrag's retriever (jobs/conform/erm4_driver.py).
dynrag's side runs erm4 in the authors' setting (pipeline/methods/erm4_authors.py) with their prompt files on the
same generator, one prompt at a time (`generation.batch_size=1`), so each of its calls computes exactly as the
served one. The reference's prompt files and options are those of their HotpotQA run: `Prompt/*hotpot*` and
config.py's defaults (page_num 5); their API calls set no token limit, so both sides stop at `MAX_TOKENS`.
`--unfence`: their code reads each answer with `json.loads`, as the API model of their time gave it; a small
instruct model wraps it in a markdown code block (Qwen2.5-0.5B) and every question would end at the rewriter. With
it, an answer that is one code block counts as its content, on both sides alike.
`--constrain-json`: every LLM call of both sides is decoded under the JSON format its prompt states
(erm4_authors.JSON_FORMATS, SamplingSpec.json_schema), the instruction-following their API model (gpt-3.5) gave
and a small model lacks (SmolLM2-135M answers with the prompt's example text, and in JSON repeats an item until
the token limit). dynrag's side asks it per call; the endpoint knows the reference's call by the prompt template
its prompt was filled from (`stage_of`) and applies the same schema. The grammar bounds each answer, so neither
side caps its tokens then (the window's room, as their API calls set no limit): cut at MAX_TOKENS, a bounded
answer could still end inside its JSON (SmolLM2 writes a string of digits a token a digit).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path

ERM4_METHODS = {"erm4": True, "erm4-rewriter": False}  # dynrag's method -> the Knowledge Filter on
PROMPTS = {  # their Prompt/ files for HotpotQA (their datset2id's "hotpot")
    "rewriter": "Prompt/question_rewritter_plus_prompt_hotpot.txt",
    "filter": "Prompt/knowledge_filter_prompt.txt",
    "reader": "Prompt/reader_prompt_hotpot.txt",
}
STAGES = {"rewriter": "rewrite", "filter": "filter", "reader": "answer"}  # prompt file -> dynrag's stage
SLOTS = ("{Original_Question}", "{Question}", "{External_Knowledge}")  # what their code fills (str.replace)
PAGE_NUM = 5  # config.py --page_num
MAX_TOKENS = 256
DRIVER = Path(__file__).with_name("erm4_driver.py")


def template_pattern(template: str) -> re.Pattern:
    """The prompts their code fills from `template`: its text, each slot any text."""
    parts = re.split("(" + "|".join(map(re.escape, SLOTS)) + ")", template)
    return re.compile("".join("(.*?)" if x in SLOTS else re.escape(x) for x in parts), re.DOTALL)


def stage_of(prompt: str, patterns: Mapping[str, re.Pattern]) -> str:
    """Which template (a key of `patterns`) `prompt` was filled from; an error unless exactly one."""
    found = [k for k, pat in patterns.items() if pat.fullmatch(prompt)]
    if len(found) != 1:
        raise ValueError(f"--constrain-json: a prompt filled from {len(found)} of the templates, not 1: {found}")
    return found[0]


def serve_llm(
    backends, max_tokens: int, unfence: bool = False, formats: Mapping[str, str] | None = None
) -> ThreadingHTTPServer:
    """POST /v1/chat/completions {messages, temperature} -> {choices: [{message: {content}}]}, greedy, from
    `backends`' generator, one request at a time; a single user message is the prompt as dynrag asks it.
    `unfence`: an answer that is one markdown code block is sent as its content. `formats`: prompt template ->
    the JSON schema (SamplingSpec.json_schema) that each prompt filled from it is decoded under; a prompt from
    none of them is refused (the request fails)."""
    from jobs.conform.harness import serve_json
    from pipeline.engine.requests import SamplingSpec
    from pipeline.methods.erm4_authors import unfenced

    lock = threading.Lock()
    patterns = {t: template_pattern(t) for t in formats or {}}

    def answer(body: dict) -> dict:
        msgs = body["messages"]
        prompt = msgs[0]["content"] if len(msgs) == 1 and msgs[0]["role"] == "user" else msgs
        schema = None
        if formats:
            if not isinstance(prompt, str):
                raise ValueError("--constrain-json: a request that is not one user message")
            schema = formats[stage_of(prompt, patterns)]
        with lock:
            out = backends.generate([prompt], [SamplingSpec(max_tokens=max_tokens, json_schema=schema)], [True])[0]
        if isinstance(out, BaseException):
            raise out
        text = unfenced(out.text) if unfence else out.text
        return {"choices": [{"message": {"role": "assistant", "content": text}}]}

    return serve_json(answer)


def checkout_of(source: str) -> dict[str, str]:
    from jobs.conform.harness import git_info

    path = Path(source).expanduser().resolve()
    if not (path / "Components.py").is_file():
        raise SystemExit(f"--reference-source {source}: not an ERM4 checkout (no Components.py)")
    return git_info(path)


def reference_job(
    cfg, ref: dict, model: str, questions: list, use_filter: bool, max_tokens: int, unfence: bool, schemas: dict
) -> dict:
    """The reference run's job (run_reference): the authors' command line and settings, all in its cache key; the
    caller adds the endpoints it serves and the output file."""
    argv = ["--question_rewritter_prompt", str(Path(ref["path"]) / PROMPTS["rewriter"])]
    argv += ["--knowledge_filter_prompt", str(Path(ref["path"]) / PROMPTS["filter"])]
    argv += ["--reader_prompt", str(Path(ref["path"]) / PROMPTS["reader"]), "--dataset", "hotpot"]
    argv += ["--page_num", str(PAGE_NUM), "--model_name", Path(model).name]
    job = {
        "source": ref["path"],
        "commit": ref["commit"],
        "cache": str(Path(cfg.paths.cache_dir) / "conform" / "runs"),
        "argv": argv,
        "filter": use_filter,
        "max_tokens": max_tokens,
        "unfence": unfence,
        "model": model,
        "questions": [{"id": q.id, "question": q.question} for q in questions],
    }
    if schemas:  # in the reference's cache key (run_reference), as every setting is
        job["json_schemas"] = schemas
    return job


def conform_erm4(
    cfg,
    method: str,
    source: str,
    dataset: str,
    index: str,
    limit: int,
    log,
    model_dtype: str,
    unfence: bool = False,
    constrain_json: bool = False,
) -> dict:
    import tempfile

    from jobs.conform import traces
    from jobs.conform.env import ensure_reference_env
    from jobs.conform.harness import float32_copy, mean_seconds, run_dynrag, run_reference, serve_retrieval
    from pipeline.assets.models import resolve_model
    from pipeline.backends import Backends
    from pipeline.io.datasets import load_questions
    from pipeline.methods.erm4_authors import json_schema

    ref = checkout_of(source)
    texts = {k: (Path(ref["path"]) / f).read_text() for k, f in PROMPTS.items()}
    use_filter = ERM4_METHODS[method]
    # the reference's calls by their template; its filter's prompt is sent only with the filter on
    schemas = {k: json_schema(STAGES[k]) for k in PROMPTS if use_filter or k != "filter"} if constrain_json else {}
    questions = [q for q in load_questions(dataset, cfg) if not q.error][:limit]
    py = ensure_reference_env(cfg.paths.cache_dir, "erm4", log=log)
    model = resolve_model(cfg.generation.model, cfg.paths.cache_dir)
    if model_dtype == "float32":
        model = float32_copy(model, cfg.paths.cache_dir)
    max_tokens = cfg.generation.max_model_len if constrain_json else MAX_TOKENS  # cut to the room the prompt leaves
    gen = cfg.generation.model_copy(update={"model": model, "batch_size": 1})
    same = cfg.model_copy(update={"generation": gen})
    backends = Backends(same, index)
    formats = {texts[k]: schema for k, schema in schemas.items()}
    retrieval, llm = serve_retrieval(backends), serve_llm(backends, max_tokens, unfence, formats)
    try:
        with tempfile.TemporaryDirectory(prefix="dynrag-conform-") as tmp:
            job = reference_job(cfg, ref, model, questions, use_filter, max_tokens, unfence, schemas)
            job["retrieval_url"] = f"http://127.0.0.1:{retrieval.server_address[1]}/"
            job["llm_url"] = f"http://127.0.0.1:{llm.server_address[1]}/v1"
            job["out"] = str(Path(tmp) / "reference.jsonl")
            t0 = time.perf_counter()
            _, ref_rows = run_reference(py, job, Path(tmp), log, DRIVER)
            log(f"reference: {time.perf_counter() - t0:.0f} s")
        authors = {
            "rewriter_prompt": texts["rewriter"],
            "filter_prompt": texts["filter"] if use_filter else None,
            "reader_prompt": texts["reader"],
            "page_num": PAGE_NUM,
            "max_tokens": max_tokens,
            "unfence": unfence,
            "constrain_json": constrain_json,
        }
        log(f"dynrag: {len(questions)} questions, {method} in the authors' setting")
        ours = run_dynrag(backends, questions, method, {"authors": authors, "retriever": "bm25"})
    finally:
        retrieval.shutdown()
        llm.shutdown()
        backends.close()
    per_q = [traces.compare(r, o) for r, o in zip(ref_rows, ours)]
    return {
        "method": method,
        "model": cfg.generation.model,
        "reference": {**ref, "prompts": PROMPTS, "page_num": PAGE_NUM, "filter": use_filter},
        **traces.summary(per_q),
        "seconds_per_question": {"reference": mean_seconds(ref_rows), "dynrag": mean_seconds(ours)},
        "max_tokens": max_tokens,
        "unfence": unfence,
        "json_schemas": schemas,
        "load_average": os.getloadavg()[0],
    }
