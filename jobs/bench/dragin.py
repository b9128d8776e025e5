"""`dynrag bench dragin`: questions/s of `dragin` batched across questions by the engine, divided by
the same method run one question at a time, on the same model, index and questions, in one process on one
set of backends (vLLM engine, attention model, index: loaded and warmed up once, not timed). With
`--reference`, the same questions also run one at a time through the pass as the official implementation
runs it (every layer eager over the whole sequence, every pass run: `generation.attention_pass=full`, no
skip bound), and the JSON holds `speedup_vs_reference` and `same_as_reference` (questions whose
retrieval points, queries and prediction equal the reference's). Prints, per mode, the rate, the seconds
inside generation, attention and retrieval, the attention tokens computed per question and the passes
the RIND bound skipped.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = bsub.add_parser(
        "dragin", help="batched dragin questions/s vs one question at a time", description=__doc__.split("\n\n")[0]
    )
    add_job_options(
        p,
        index={
            "help": "index over the dataset's paragraphs (default: the HotpotQA dev "
            "set's, built under runs/indexes on first use)",
            "required": False,
        },
    )
    add_job_options(p, dataset={})
    p.add_argument("--method", default="dragin")
    add_job_options(p, limit={"default": 32, "help": "questions (default 32)"})
    p.add_argument(
        "--reference",
        action="store_true",
        help="also run the questions one at a time through the official implementation's pass (all layers "
        "eager, whole sequence, no skip bound) and compare",
    )
    add_job_options(p, json={})
    add_config_args(p)
    p.set_defaults(func=run)


STAGES = {"generat": "generation", "attention": "attention", "retriev": "retrieval"}


def _stage(kind: str) -> str:
    return next((v for k, v in STAGES.items() if k in kind.lower()), kind)


def _timed(engine, backends, questions, spec, params, one_at_a_time: bool) -> dict:
    att = backends.named("attention")
    passes0, skipped0, tokens0 = len(att.forward_batches), att.skipped, att.tokens_computed
    calls0, secs0 = dict(engine.batch_calls), dict(engine.batch_seconds)
    t0 = time.perf_counter()
    outcomes = []
    for batch in [[q] for q in questions] if one_at_a_time else [questions]:
        outcomes += engine.run(batch, spec.program, params)
    secs = time.perf_counter() - t0
    calls = {k: v - calls0.get(k, 0) for k, v in engine.batch_calls.items()}
    inside: dict[str, float] = {}
    for k, v in engine.batch_seconds.items():
        inside[_stage(k)] = round(inside.get(_stage(k), 0.0) + v - secs0.get(k, 0.0), 1)
    sizes = att.forward_batches[passes0:]
    return {
        "seconds": secs,
        "questions_per_s": len(questions) / secs,
        "errors": sum(o.error is not None for o in outcomes),
        "decisions": [_decisions(o) for o in outcomes],
        "retrievals": sum(o.trace.retrieval_calls for o in outcomes) / len(outcomes),
        "backend_calls": calls,
        "seconds_inside": inside,
        "attention_share_of_generation": inside.get("attention", 0.0) / max(inside.get("generation", 0.0), 1e-9),
        "attention_passes": len(sizes),
        "attention_skipped": att.skipped - skipped0,
        "attention_tokens_per_question": (att.tokens_computed - tokens0) / len(questions),
        "mean_items_per_attention_pass": sum(sizes) / len(sizes) if sizes else 0.0,
    }


def _decisions(o) -> dict | None:
    """What DRAGIN decided for one question: where it retrieved (answer tokens accepted), with which
    queries, and what it answered."""
    if o.answer is None:
        return None
    x = o.answer.extra
    return {"at": x.get("retrieval_at_tokens"), "queries": x.get("queries"), "prediction": o.answer.prediction}


def bench(cfg, dataset: str, index: str, method: str, limit: int, reference: bool = False) -> dict:
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
        ref = None
        if reference:
            att = backends.named("attention")
            mode, att.mode = att.mode, "full"
            ref_params = (
                params.model_copy(update={"skip_bound": False}) if "skip_bound" in type(params).model_fields else params
            )
            try:
                ref = _timed(engine, backends, questions, spec, ref_params, one_at_a_time=True)
            finally:
                att.mode = mode
    finally:
        backends.close()
    b_dec, s_dec = batched.pop("decisions"), single.pop("decisions")
    out = {
        "method": method,
        "model": cfg.generation.model,
        "generation_backend": cfg.generation.backend,
        "questions": len(questions),
        "load_average": os.getloadavg()[0],
        "batched": batched,
        "one_at_a_time": single,
        "speedup": batched["questions_per_s"] / single["questions_per_s"],
        "same_predictions": sum(
            a is not None and b is not None and a["prediction"] == b["prediction"] for a, b in zip(b_dec, s_dec)
        ),
    }
    if ref is not None:
        r_dec = ref.pop("decisions")
        out["reference"] = ref
        out["speedup_vs_reference"] = batched["questions_per_s"] / ref["questions_per_s"]
        out["same_as_reference"] = sum(a is not None and a == r for a, r in zip(b_dec, r_dec))
        out["differs_from_reference"] = [
            {"question": q.id, "batched": a, "reference": r} for q, a, r in zip(questions, b_dec, r_dec) if a != r
        ]
    return out


def run(args: argparse.Namespace) -> None:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    from pipeline.evaluation.devsets import dev_file, dev_index

    dataset = args.dataset or str(dev_file(cfg, "hotpotqa"))
    index = args.index or dev_index(cfg, "hotpotqa", Path("runs/indexes"))
    r = bench(cfg, dataset, index, args.method, args.limit, args.reference)
    if args.json:
        from jobs.jsonout import emit

        emit(r, indent=1)
        return
    print(f"{r['method']} on {r['questions']} questions, model {r['model']} ({r['generation_backend']})")
    rows = [("batched", r["batched"]), ("one at a time", r["one_at_a_time"])]
    rows += [("reference", r["reference"])] if "reference" in r else []
    for name, x in rows:
        print(
            f"  {name:14s} {x['questions_per_s']:.3f} q/s ({x['seconds']:.1f} s), {x['retrievals']:.2f} retrievals/q, "
            f"seconds inside {x['seconds_inside']} (attention {x['attention_share_of_generation']:.0%} of "
            f"generation), {x['attention_passes']} attention passes of {x['mean_items_per_attention_pass']:.1f} "
            f"items, {x['attention_skipped']} skipped by the bound, {x['attention_tokens_per_question']:.0f} "
            "attention tokens/q"
        )
    print(
        f"  speedup batched / one at a time: {r['speedup']:.2f}x (same prediction for {r['same_predictions']}"
        f"/{r['questions']} questions)"
    )
    if "reference" in r:
        print(
            f"  speedup batched / reference: {r['speedup_vs_reference']:.2f}x (same decisions and prediction for "
            f"{r['same_as_reference']}/{r['questions']} questions); load average {r['load_average']:.2f}"
        )
