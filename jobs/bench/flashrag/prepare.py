"""What both sides of `dynrag bench flashrag` start from: the timed and warm-up questions, the corpus in each
side's format and dynrag's BM25 index (`prepare`), and the FlashRAG driver's configuration (`driver_config`),
with dynrag's sr-rag prompt as FlashRAG's template (`flashrag_prompt`)."""

from __future__ import annotations

import json
from pathlib import Path

from jobs.bench.flashrag.methods import bench_method


def flashrag_prompt() -> tuple[str, str, str]:
    """dynrag's sr-rag prompt as FlashRAG's (system, user) template with {reference} and {question}, and
    the format of one document in {reference} (documents joined by newlines, {i} counting from 1)."""
    from indexing import Hit
    from pipeline.methods.prompts import format_docs, rag_prompt

    mark = [Hit(id="", title="{title}", text="{text}", score=0.0)]
    system, user = (m["content"] for m in rag_prompt("{question}", mark))
    return system, user.replace(format_docs(mark), "{reference}"), format_docs(mark).replace("Doc 1", "Doc {i}", 1)


def prepare(cfg, dataset: str, limit: int, warmup: int, work: Path) -> dict:
    """Timed questions, warm-up questions (the next `warmup` of the file, as many as there are), corpus (dynrag
    JSONL and FlashRAG JSONL) and the dynrag index under `work`."""
    import itertools

    from indexing import build_index
    from indexing.corpus.passages import passages_of
    from indexing.corpus.readers import read_corpus
    from pipeline.io.datasets import load_questions

    qs = list(itertools.islice((q for q in load_questions(dataset, cfg) if not q.error), limit + warmup))
    for name, part in (("questions.jsonl", qs[:limit]), ("warmup.jsonl", qs[limit:])):
        (work / name).write_text(
            "".join(
                json.dumps({"id": q.id, "question": q.question, "answers": q.answers, "golden_answers": q.answers})
                + "\n"
                for q in part
            )
        )
    passages = list(passages_of(read_corpus(dataset), cfg.index.passage_words))
    (work / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages)
    )
    (work / "corpus_flashrag.jsonl").write_text(
        "".join(json.dumps({"id": p.id, "contents": f"{p.title}\n{p.text}"}) + "\n" for p in passages)
    )
    bm25_only = cfg.model_copy(deep=True)
    bm25_only.index.dense = False  # both sides search BM25: no passage is embedded
    build_index([str(work / "corpus.jsonl")], str(work / "index"), bm25_only.index_settings())
    return {"questions": len(qs[:limit]), "warmup_questions": len(qs[limit:]), "passages": len(passages)}


def driver_config(
    cfg,
    model_path: str,
    work: Path,
    k: int,
    warmup: bool,
    batch: int,
    method: str = "sr-rag",
    framework: str = "vllm",
    threads: int = 1,
) -> dict:
    """The FlashRAG driver's configuration (driver.py): corpus, questions, model, k, the pipeline class
    of `method` with its keyword arguments, dynrag's prompt (asked by FlashRAG's side for sr-rag only), the
    generator framework, the threads, and dynrag's vLLM engine arguments (for those FlashRAG leaves unset)."""
    from pipeline.backends.vllm_gen import llm_kwargs
    from pipeline.runtime.answer import generation_dtype

    system, user, doc_format = flashrag_prompt()
    spec = bench_method(method)
    return {
        "pipeline": spec.pipeline,
        "pipeline_kwargs": spec.flashrag_kwargs(cfg.generation.max_new_tokens),
        "dynrag_prompt": method == "sr-rag",
        "model_path": model_path,
        "corpus": str(work / "corpus_flashrag.jsonl"),
        "questions": str(work / "questions.jsonl"),
        "work": str(work / "flashrag"),
        "k": k,
        "max_new_tokens": cfg.generation.max_new_tokens,
        "max_input_len": cfg.generation.max_model_len,  # FlashRAG's generator_max_input_len (its vLLM max_model_len)
        "dtype": generation_dtype(cfg),  # never "auto": FlashRAG's side would keep the model's own dtype
        "batch_size": batch,
        "framework": framework,
        "threads": threads,
        "engine_kwargs": {k: v for k, v in llm_kwargs(cfg.generation, model_path, gpu=False).items() if k != "model"},
        "warmup_questions": str(work / "warmup.jsonl") if warmup else None,
        "bm25_k1": cfg.index.bm25_k1,
        "bm25_b": cfg.index.bm25_b,
        "system_prompt": system,
        "user_prompt": user,
        "doc_format": doc_format,
    }
