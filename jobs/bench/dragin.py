"""`dynrag bench dragin`: questions/s of `dragin` batched across questions by the engine, divided by
the same method run one question at a time (the shape of the official implementation), on the same
model, index and questions, in one process on one set of backends (vLLM engine, attention model,
index: loaded and warmed up once, not timed). Prints both rates, the ratio and how the backends were
called (generate calls, attention forward passes and their sizes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = bsub.add_parser(
        "dragin", help="batched dragin questions/s vs one question at a time", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--index",
        metavar="DIR",
        help="index over the dataset's paragraphs (default: the HotpotQA dev "
        "set's, built under runs/indexes on first use)",
    )
    p.add_argument("--dataset", metavar="FILE", help="default: hotpotqa/dev_400.jsonl of paths.data_dir")
    p.add_argument("--method", default="dragin")
    p.add_argument("--limit", type=int, default=32, help="questions (default 32)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_config_args(p)
    p.set_defaults(func=run)


def _timed(engine, backends, questions, spec, params, one_at_a_time: bool) -> dict:
    att = backends.named("attention")
    passes0, calls0, secs0 = len(att.forward_batches), dict(engine.batch_calls), dict(engine.batch_seconds)
    t0 = time.perf_counter()
    outcomes = []
    for batch in [[q] for q in questions] if one_at_a_time else [questions]:
        outcomes += engine.run(batch, spec.program, params)
    secs = time.perf_counter() - t0
    calls = {k: v - calls0.get(k, 0) for k, v in engine.batch_calls.items()}
    inside = {k: round(v - secs0.get(k, 0.0), 1) for k, v in engine.batch_seconds.items()}
    sizes = att.forward_batches[passes0:]
    return {
        "seconds": secs,
        "questions_per_s": len(questions) / secs,
        "errors": sum(o.error is not None for o in outcomes),
        "predictions": [o.answer.prediction if o.answer else None for o in outcomes],
        "retrievals": sum(o.trace.retrieval_calls for o in outcomes) / len(outcomes),
        "backend_calls": calls,
        "backend_seconds": inside,
        "attention_passes": len(sizes),
        "mean_items_per_attention_pass": sum(sizes) / len(sizes) if sizes else 0.0,
    }


def bench(cfg, dataset: str, index: str, method: str, limit: int) -> dict:
    from pipeline.backends import Backends
    from pipeline.engine.core import Engine
    from pipeline.io.datasets import load_questions
    from pipeline.methods.registry import get_method

    questions = [q for q in load_questions(dataset, cfg) if not q.error][:limit]
    spec = get_method(method)
    params = spec.params(cfg.method.params if cfg.method.name == method else {})
    backends = Backends(cfg, index)
    try:
        engine = Engine(backends)
        engine.run(questions[:2], spec.program, params)  # warm-up: loads vLLM, the attention model, the index
        batched = _timed(engine, backends, questions, spec, params, one_at_a_time=False)
        single = _timed(engine, backends, questions, spec, params, one_at_a_time=True)
    finally:
        backends.close()
    same = sum(a == b for a, b in zip(batched.pop("predictions"), single.pop("predictions")))
    return {
        "method": method,
        "model": cfg.generation.model,
        "generation_backend": cfg.generation.backend,
        "questions": len(questions),
        "batched": batched,
        "one_at_a_time": single,
        "speedup": batched["questions_per_s"] / single["questions_per_s"],
        "same_predictions": same,
    }


def run(args: argparse.Namespace) -> None:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    from pipeline.evaluation.devsets import dev_file, dev_index

    dataset = args.dataset or str(dev_file(cfg, "hotpotqa"))
    index = args.index or dev_index(cfg, "hotpotqa", Path("runs/indexes"))
    r = bench(cfg, dataset, index, args.method, args.limit)
    if args.json:
        print(json.dumps(r, indent=1))
        return
    b, s = r["batched"], r["one_at_a_time"]
    print(f"{r['method']} on {r['questions']} questions, model {r['model']} ({r['generation_backend']})")
    for name, x in (("batched", b), ("one at a time", s)):
        print(
            f"  {name:14s} {x['questions_per_s']:.3f} q/s ({x['seconds']:.1f} s), {x['retrievals']:.2f} retrievals/q, "
            f"calls {x['backend_calls']}, seconds inside them {x['backend_seconds']}, {x['attention_passes']} "
            f"attention passes of {x['mean_items_per_attention_pass']:.1f} items"
        )
    print(
        f"  speedup batched / one at a time: {r['speedup']:.2f}x (same prediction for {r['same_predictions']}"
        f"/{r['questions']} questions)"
    )
