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
"""

from __future__ import annotations

import os
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

ERM4_METHODS = {"erm4": True, "erm4-rewriter": False}  # dynrag's method -> the Knowledge Filter on
PROMPTS = {  # their Prompt/ files for HotpotQA (their datset2id's "hotpot")
    "rewriter": "Prompt/question_rewritter_plus_prompt_hotpot.txt",
    "filter": "Prompt/knowledge_filter_prompt.txt",
    "reader": "Prompt/reader_prompt_hotpot.txt",
}
PAGE_NUM = 5  # config.py --page_num
MAX_TOKENS = 256
DRIVER = Path(__file__).with_name("erm4_driver.py")


def serve_llm(backends, max_tokens: int, unfence: bool = False) -> ThreadingHTTPServer:
    """POST /v1/chat/completions {messages, temperature} -> {choices: [{message: {content}}]}, greedy, from
    `backends`' generator, one request at a time; a single user message is the prompt as dynrag asks it.
    `unfence`: an answer that is one markdown code block is sent as its content."""
    from jobs.conform.harness import serve_json
    from pipeline.engine.requests import SamplingSpec
    from pipeline.methods.erm4_authors import unfenced

    lock = threading.Lock()

    def answer(body: dict) -> dict:
        msgs = body["messages"]
        prompt = msgs[0]["content"] if len(msgs) == 1 and msgs[0]["role"] == "user" else msgs
        with lock:
            out = backends.generate([prompt], [SamplingSpec(max_tokens=max_tokens)], [True])[0]
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


def conform_erm4(
    cfg, method: str, source: str, dataset: str, index: str, limit: int, log, model_dtype: str, unfence: bool = False
) -> dict:
    import tempfile

    from jobs.conform import traces
    from jobs.conform.env import ensure_reference_env
    from jobs.conform.harness import float32_copy, mean_seconds, run_dynrag, run_reference, serve_retrieval
    from pipeline.assets.models import resolve_model
    from pipeline.backends import Backends
    from pipeline.io.datasets import load_questions

    ref = checkout_of(source)
    texts = {k: (Path(ref["path"]) / f).read_text() for k, f in PROMPTS.items()}
    use_filter = ERM4_METHODS[method]
    questions = [q for q in load_questions(dataset, cfg) if not q.error][:limit]
    py = ensure_reference_env(cfg.paths.cache_dir, "erm4", log=log)
    model = resolve_model(cfg.generation.model, cfg.paths.cache_dir)
    if model_dtype == "float32":
        model = float32_copy(model, cfg.paths.cache_dir)
    gen = cfg.generation.model_copy(update={"model": model, "batch_size": 1})
    same = cfg.model_copy(update={"generation": gen})
    backends = Backends(same, index)
    retrieval, llm = serve_retrieval(backends), serve_llm(backends, MAX_TOKENS, unfence)
    argv = ["--question_rewritter_prompt", str(Path(ref["path"]) / PROMPTS["rewriter"])]
    argv += ["--knowledge_filter_prompt", str(Path(ref["path"]) / PROMPTS["filter"])]
    argv += ["--reader_prompt", str(Path(ref["path"]) / PROMPTS["reader"]), "--dataset", "hotpot"]
    argv += ["--page_num", str(PAGE_NUM), "--model_name", Path(model).name]
    try:
        with tempfile.TemporaryDirectory(prefix="dynrag-conform-") as tmp:
            job = {
                "source": ref["path"],
                "commit": ref["commit"],
                "cache": str(Path(cfg.paths.cache_dir) / "conform" / "runs"),
                "argv": argv,
                "filter": use_filter,
                "max_tokens": MAX_TOKENS,
                "unfence": unfence,
                "model": model,
                "questions": [{"id": q.id, "question": q.question} for q in questions],
                "retrieval_url": f"http://127.0.0.1:{retrieval.server_address[1]}/",
                "llm_url": f"http://127.0.0.1:{llm.server_address[1]}/v1",
                "out": str(Path(tmp) / "reference.jsonl"),
            }
            t0 = time.perf_counter()
            _, ref_rows = run_reference(py, job, Path(tmp), log, DRIVER)
            log(f"reference: {time.perf_counter() - t0:.0f} s")
        authors = {
            "rewriter_prompt": texts["rewriter"],
            "filter_prompt": texts["filter"] if use_filter else None,
            "reader_prompt": texts["reader"],
            "page_num": PAGE_NUM,
            "max_tokens": MAX_TOKENS,
            "unfence": unfence,
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
        "max_tokens": MAX_TOKENS,
        "unfence": unfence,
        "load_average": os.getloadavg()[0],
    }
