"""FlashRAG's side of `dynrag bench flashrag`: its standard RAG pipeline (SequentialPipeline, BM25 via
bm25s, transformers generation) over the bench's corpus and questions, timed; prints one JSON line.

Runs with the python of FlashRAG's own venv (jobs/bench/flashrag_env.py): `python flashrag_driver.py CONFIG.json`.
Standard library only at import, so dynrag's tests can check the config it writes and its output.
Workarounds for flashrag-dev 0.1.2 (see the STACK notes): its wheel lacks `basic_config.yaml`, so the
whole configuration is given here; its BM25 builder indexes characters, so the bm25s index is built here
from text tokenised the way its retriever tokenises queries (bm25s.tokenize with an English stemmer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T_START = time.perf_counter()


def flashrag_config(c: dict) -> dict:
    """The complete FlashRAG configuration for the bench's driver config `c` (see jobs/bench/flashrag.py)."""
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
        "framework": "hf",
        "device": "cpu",
        "generator_model": "smollm2",
        "generator_model_path": c["model_path"],
        "generator_lora_path": None,
        "generator_max_input_len": 2048,
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


def _build_bm25(c: dict, index_dir: Path) -> None:
    import bm25s
    import Stemmer

    docs = [json.loads(line) for line in Path(c["corpus"]).read_text(encoding="utf-8").splitlines() if line]
    tokens = bm25s.tokenize([d["contents"] for d in docs], stemmer=Stemmer.Stemmer("english"), show_progress=False)
    bm25 = bm25s.BM25(k1=c["bm25_k1"], b=c["bm25_b"])
    bm25.index(tokens, show_progress=False)
    bm25.save(str(index_dir), corpus=docs)


def main(config_path: str) -> None:
    c = json.loads(Path(config_path).read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(c["threads"])
    from flashrag.config import Config
    from flashrag.dataset import Dataset
    from flashrag.pipeline import SequentialPipeline
    from flashrag.prompt import PromptTemplate

    class DocsAsDynrag(PromptTemplate):  # the documents formatted as dynrag's prompt lists them
        def format_reference(self, retrieval_result):
            return "\n".join(
                c["doc_format"].format(
                    i=i, title=d["contents"].split("\n")[0], text="\n".join(d["contents"].split("\n")[1:])
                )
                for i, d in enumerate(retrieval_result, 1)
            )

    Config._get_internal_config = lambda self: {}  # the wheel has no basic_config.yaml
    fc = flashrag_config(c)
    index_dir = Path(fc["index_path"])
    if not (index_dir / "params.index.json").is_file():
        _build_bm25(c, index_dir)
    config = Config(config_dict=fc)
    template = DocsAsDynrag(config, system_prompt=c["system_prompt"], user_prompt=c["user_prompt"])
    pipeline = SequentialPipeline(config, prompt_template=template)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(c["dtype"])
    if dtype is not None:
        pipeline.generator.model.to(dtype)

    def read(path):
        return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]

    questions = read(c["questions"])
    if c["warmup_questions"]:  # other questions than the timed ones
        pipeline.run(Dataset(config, data=[_item(q) for q in read(c["warmup_questions"])]), do_eval=False)
    startup = time.perf_counter() - T_START
    dataset = Dataset(config, data=[_item(q) for q in questions])
    t0 = time.perf_counter()
    out = pipeline.run(dataset, do_eval=False)
    secs = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "side": "flashrag",
                "questions": len(questions),
                "seconds": round(secs, 3),
                "questions_per_s": len(questions) / secs,
                "startup_s": round(startup, 2),
                "generator_dtype": str(pipeline.generator.model.dtype),
                "predictions": {it.id: it.pred for it in out},
                "doc_ids": {it.id: [d["id"] for d in it.retrieval_result] for it in out},
            }
        ),
        flush=True,
    )


def _item(q: dict):
    from flashrag.dataset import Item

    return Item({"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"]})


if __name__ == "__main__":
    main(sys.argv[1])
