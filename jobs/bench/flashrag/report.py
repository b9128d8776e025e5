"""Figures of one repeat of `dynrag bench flashrag`, and their printout: per side framework and threads, answered
questions/s, error rows, whole-process seconds, startup (dynrag's by stage), EM/F1, LLM calls, retrievals, prompt
and generated tokens per question, seconds per LLM call and tokens/s, model GFLOP/s; the share of identical
predictions; the arithmetic bound on the ratio (jobs/bench/rig/roofline.py) from each side's own tokens. A ratio is
refused (None, with the reason) where either side has error rows, unless errors are allowed."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

SIDES = ("dynrag", "flashrag")


# The ratios each method aims at against FlashRAG on vLLM (issue 38), as (questions/s, whole process): FlashRAG
# runs FLARE, IRCoT and Self-Ask one question at a time, ITER-RETGEN and SuRe batched; sr-rag's goal is the whole
# process, startup included.
GOALS: dict[str, tuple[float | None, float | None]] = {
    "sr-rag": (None, 1.0),
    "flare": (3, 2),
    "ircot": (3, 2),
    "self-ask": (3, 2),
    "iter-retgen": (1.2, None),
    "sure": (1.2, None),
}


def goal_text(method: str) -> str:
    qps, wall = GOALS.get(method, (None, None))
    parts = ([f">= {qps}x questions/s"] if qps else []) + ([f">= {wall}x whole process"] if wall else [])
    return "goal " + ", ".join(parts) if parts else "no goal set"


def startup_text(side: dict) -> str:
    """Startup seconds, with dynrag's stages (those that overlap marked as such)."""
    stages = side.get("startup_stages")
    if not stages:
        return f"startup {side['startup_s']:.1f} s"
    return f"startup {side['startup_s']:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + ")"


def answer_scores(predictions: dict[str, str], golds: dict[str, list[str]]) -> dict[str, float]:
    """Mean EM and F1 of the predictions (dynrag's metrics: SQuAD normalisation, best over the gold answers)."""
    from pipeline.text.metrics import answer_metrics

    rows = [answer_metrics(p or "", golds.get(q, [])) for q, p in predictions.items()]
    rows = [r for r in rows if r["em"] is not None]
    return {m: round(statistics.fmean(float(r[m] or 0.0) for r in rows), 3) if rows else 0.0 for m in ("em", "f1")}


def refusal(dyn: dict, fr: dict) -> str | None:
    """Why no ratio is given: the error rows of either side (None: none)."""
    if not (dyn["errors"] or fr["errors"]):
        return None
    return (
        f"error rows: dynrag {dyn['errors']} of {dyn['questions']}, FlashRAG {fr['errors']} of {fr['questions']} "
        "(--allow-errors gives the ratios of answered questions)"
    )


def score_repeat(
    got: dict[str, Any], golds: dict[str, list[str]], model_path: str | Path, peak: float, allow_errors: bool = False
) -> dict:
    """Ratios (None where refused), EM/F1, the work-normalised rates and the model arithmetic of one repeat (each
    side's rows counted its own calls and tokens); the predictions and retrieved ids are dropped."""
    from jobs.bench.rig.roofline import flops_per_token

    per_prompt, per_generated = flops_per_token(model_path)
    dyn, fr = got["dynrag"], got["flashrag"]
    got["ratio_refused"] = None if allow_errors else refusal(dyn, fr)
    refused = got["ratio_refused"] is not None
    got["ratio"] = None if refused else round(dyn["questions_per_s"] / fr["questions_per_s"], 2)
    got["wall_ratio"] = None if refused else round(fr["process_wall_s"] / dyn["process_wall_s"], 2)
    for s in SIDES:
        side = got[s]
        side.update(answer_scores(side.pop("answers", None) or side["predictions"], golds))  # each side's answer
        flops = per_prompt * side["prompt_tokens_per_question"] + per_generated * side["completion_tokens_per_question"]
        side["gflop_per_question"] = round(flops / 1e9, 2)
        total = per_prompt * side["prompt_tokens"] + per_generated * side["completion_tokens"]
        side["model_gflops"] = round(total / side["seconds"] / 1e9, 1)
        side["s_per_llm_call"] = round(side["seconds"] / max(1, side["llm_calls"]), 3)
        side["tokens_per_s"] = round((side["prompt_tokens"] + side["completion_tokens"]) / side["seconds"], 1)
        del side["predictions"], side["doc_ids"]
    # dynrag at the matrix product's rate, with its own FLOPs a question, against FlashRAG as measured
    got["ratio_bound"] = (
        round(peak / max(dyn["gflop_per_question"], 1e-9) / fr["questions_per_s"], 1) if fr["questions_per_s"] else None
    )
    # the bound counts every prompt token as computed; vLLM's prefix cache computes a shared prefix once
    bounded = None not in (got["ratio"], got["ratio_bound"])
    got["ratio_above_bound"] = bounded and got["ratio"] > got["ratio_bound"]
    return got


def ratio_median(reps: list[dict]) -> float | None:
    """The median questions/s ratio of the repeats that give one (None: every repeat's was refused)."""
    ratios = [r["ratio"] for r in reps if r["ratio"] is not None]
    return round(statistics.median(ratios), 3) if ratios else None


def print_figures(f: dict[str, Any], repeats: int) -> None:
    print(
        f"{f['method']} vs FlashRAG {f['flashrag_pipeline']}: {f['questions']} questions of {f['dataset']}, "
        f"{f['passages']} passages, BM25 top-{f['k']}, {f['model']} ({f['dtype']}), {f['max_new_tokens']} new "
        f"tokens, greedy; {repeats} repeat(s), alternating which side runs first; untimed warm-up on "
        f"{f['warmup_questions']} other questions on each side"
    )
    print(f"  FlashRAG {f['flashrag_source']} on {f['flashrag_framework']}; {f['threads']} threads a side")
    if f["flashrag_vllm_failed"]:
        print(f"  FlashRAG's vLLM generator failed, so its side ran on hf: {f['flashrag_vllm_failed']}")
    if f["prompts_differ"]:
        print(f"  prompts/steps differ: {f['prompts_differ']}")
    if f["templates_from_flashrag"]:
        print(f"  dynrag's {', '.join(f['templates_from_flashrag'])}: FlashRAG's own, read from its installed package")
    print(f"  dynrag params: {f['dynrag_params']}")
    for i, r in enumerate(f["repeats"], 1):
        for side in SIDES:
            s = r[side]
            print(
                f"  repeat {i} {side:8s} {s['questions_per_s']:.3f} q/s ({s['answered']}/{s['questions']} answered, "
                f"{s['errors']} error rows; {s['seconds']:.1f} s timed; process {s['process_wall_s']:.1f} s; peak RSS "
                f"{s['peak_rss_gib']:.2f} GiB; {s['framework']}, {s['threads']} threads; load average "
                f"{s['load_average_1min_before']} -> {s['load_average_1min_after']})"
            )
            print(
                f"           {'':8s} {startup_text(s)}; {s['s_per_llm_call']:.3f} s per LLM call, "
                f"{s['tokens_per_s']:.1f} tokens/s (prompt and generated)"
            )
            print(
                f"           {'':8s} EM {s['em']:.3f} F1 {s['f1']:.3f}; per question: LLM calls "
                f"{s['llm_calls_per_question']:.2f}, retrievals {s['retrievals_per_question']:.2f}, prompt tokens "
                f"{s['prompt_tokens_per_question']:.1f} ({s.get('cached_prompt_tokens', 0)} in all from vLLM's prefix "
                f"cache), generated tokens {s['completion_tokens_per_question']:.1f} "
                f"({s['gflop_per_question']} GFLOP; model {s['model_gflops']} GFLOP/s)"
            )
        a = r["agreement"]
        overlap = f", top-{f['k']} overlap {a['topk_overlap']}" if f["method"] == "sr-rag" else ""
        how = " (answers after SQuAD normalisation)" if a["normalized"] else ""
        ratio = (
            f"ratio refused ({r['ratio_refused']})"
            if r["ratio_refused"]
            else f"ratio {r['ratio']}x (whole process {r['wall_ratio']}x)"
        )
        print(
            f"  repeat {i} {ratio}; identical predictions{how} "
            f"{a['same_prediction']}/{a['compared']} ({a['same_prediction'] / max(1, a['compared']):.0%}){overlap}"
        )
        if r["ratio_bound"] is not None:
            print(
                f"  repeat {i} arithmetic: a {f['dtype']} matrix product runs at {f['matmul_gflops']} GFLOP/s here; "
                f"dynrag at that rate with its {r['dynrag']['gflop_per_question']} GFLOP a question against FlashRAG "
                f"as measured: no ratio above {r['ratio_bound']}x is possible on this machine"
                + (
                    f" if every prompt token is computed; measured {r['ratio']}x, so vLLM's prefix cache served part of"
                    " dynrag's prompts (shared exemplars, a question's earlier rounds)"
                    if r.get("ratio_above_bound")
                    else ""
                )
            )
    print(
        f"dynrag {f['method']} / FlashRAG {f['flashrag_pipeline']} questions/s: {f['ratio_median']} "
        f"(median of the {len(f['repeats'])} repeat(s) not refused; {goal_text(f['method'])})"
    )
