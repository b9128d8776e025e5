"""dynrag's side of `dynrag bench flashrag`, run as its own process so its memory is measured alone:
`python -m jobs.bench.flashrag.side --index DIR --questions FILE --out DIR [--method NAME --params FILE] [--set ...]`.

Loads the backends, answers the `--warmup` file's questions (startup, untimed), then times one `run_answer` of
the method (sr-rag by default; `--params`: its parameters as JSON, e.g. FlashRAG's templates) over all questions
(read, retrieve, prompt, generate, score, write Parquet); prints one JSON line with the run's counts (totals and
per question) and its startup by stage: imports, generator (vLLM: importing it, then its engine core and worker
processes, each importing torch and vLLM again, loading the model and the KV cache), index (the JVM and Lucene,
opened by a first search), warm-up.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--index", required=True)
    p.add_argument("--questions", required=True, help="JSONL with id, question, answers")
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", metavar="FILE", help="JSONL of warm-up questions (none of the timed ones)")
    p.add_argument("--method", default="sr-rag")
    p.add_argument("--params", metavar="FILE", help="the method's parameters as a JSON object")
    p.add_argument("--config")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)

    stages: dict[str, float] = {}
    clock = Stages(stages)
    with clock("imports"):
        import polars as pl

        from pipeline.backends import Backends
        from pipeline.config import load_config
        from pipeline.methods.registry import all_one_call
        from pipeline.runtime.answer import generation_dtype, run_answer

    shutil.rmtree(args.out, ignore_errors=True)  # a fresh run, never a resumed one
    cfg = load_config(args.config, [*args.overrides, "dataset.format=generic", "answer.progress=false"])
    cfg.generation.dtype = generation_dtype(cfg)
    if args.params:
        cfg.method.params = json.loads(Path(args.params).read_text(encoding="utf-8"))
    backends = Backends(cfg, args.index, one_call=all_one_call([args.method]))
    try:
        # loaded before the clock, as FlashRAG's pipeline loads its models
        with clock("generator"):
            _ = backends.generator
        with clock("index"):  # the JVM and the index, opened by a first search
            backends.retriever.search(["startup"], 1, cfg.retrieval.retriever)
        if args.warmup:
            with clock("warm-up"):
                run_answer(
                    args.warmup, f"{args.out}/warmup", index=args.index, method=args.method, cfg=cfg, backends=backends
                )
        startup = time.perf_counter() - T_START
        t0 = time.perf_counter()
        summary = run_answer(
            args.questions, f"{args.out}/run", index=args.index, method=args.method, cfg=cfg, backends=backends
        )
        secs = time.perf_counter() - t0
    finally:
        backends.close()
    rows = pl.read_parquet(
        f"{args.out}/run/parts/*.parquet",
        columns=["question_id", "prediction", "raw_output", "retrieved", *TOTALS],
    )
    # sr-rag is compared on the raw output (FlashRAG's standard pipeline returns it whole), the others on the answer
    said = rows["raw_output"] if args.method == "sr-rag" else rows["prediction"]
    print(
        json.dumps(
            {
                "side": "dynrag",
                "method": args.method,
                "framework": cfg.generation.backend,
                "threads": cfg.index.threads,
                "questions": summary["rows"],
                "answered": summary["answered"],
                "errors": summary["errors"],
                "seconds": round(secs, 3),
                "questions_per_s": summary["answered"] / secs,
                "startup_s": round(startup, 2),
                "startup_stages": {k: round(v, 2) for k, v in stages.items()},
                "dtype": cfg.generation.dtype,
                **{col: int(rows[col].fill_null(0).sum()) for col in TOTALS},
                "llm_calls_per_question": summary["llm_calls_per_question"],
                "retrievals_per_question": summary["retrieval_calls_per_question"],
                "prompt_tokens_per_question": summary["prompt_tokens_per_question"],
                "completion_tokens_per_question": summary["completion_tokens_per_question"],
                "predictions": dict(zip(rows["question_id"], said)),
                "answers": dict(zip(rows["question_id"], rows["prediction"])),
                "doc_ids": {q: [d["id"] for d in r] for q, r in zip(rows["question_id"], rows["retrieved"])},
            }
        ),
        flush=True,
    )


# summed over the run's rows (cached: of the prompt tokens, those vLLM's prefix cache served)
TOTALS = ("llm_calls", "prompt_tokens", "completion_tokens", "cached_prompt_tokens")


class Stages:
    """`with stages("name"):` adds the block's seconds to `times["name"]`; "imports" also counts the module's
    own imports since the process started."""

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = T_START if name == "imports" else time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


if __name__ == "__main__":
    main()
