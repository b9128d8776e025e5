"""DRAGIN's attention pass on a GPU, torch and transformers only (no vLLM, Ray or Java needed): the
incremental pass (pipeline/backends/rind_pass.py: SDPA below the last layer, the shared prefix once)
against the official implementation's (every layer eager over the whole sequence), on random-weight
models of SmolLM2-135M's and Llama-2-7B's shapes (DRAGIN's Table 9 model) in bf16.

The workload is DRAGIN-shaped (32 questions of a round with documents: 260 exemplar tokens shared by
all, 480 document tokens, 45 question and answer-so-far tokens, 100 generated tokens). Prints JSON: per
model, ms per question of each pass one at a time and batched, the peak GPU memory of each, and the
largest difference between the two passes' entropy and a_max (fp32 and bf16).

    python scripts/gpu_rind_pass.py [--questions 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location(
    "rind_pass", Path(__file__).resolve().parents[1] / "pipeline" / "backends" / "rind_pass.py"
)
rind_pass = sys.modules["rind_pass"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rind_pass)

SHAPES = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "llama-2-7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
}
PREFIX, DOCS, QUESTION, GENERATED = 260, 480, 45, 100
CUDA = torch.cuda.is_available()  # without one (a dry run of the script), the CPU


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def build(shape: str, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    rind_pass.register()
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096)
    cfg._attn_implementation = rind_pass.IMPLEMENTATION
    torch.manual_seed(0)
    with torch.device("cuda" if CUDA else "cpu"):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def workload(n: int, vocab: int) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(10, vocab, (PREFIX,), generator=g).tolist()
    seqs, starts = [], []
    for _ in range(n):
        rest = torch.randint(10, vocab, (DOCS + QUESTION + GENERATED,), generator=g).tolist()
        seqs.append(prefix + rest)
        starts.append(PREFIX + DOCS + QUESTION)
    return seqs, starts


def stats(model, outs):
    ent, amax = [], []
    head = model.get_output_embeddings()
    with torch.no_grad():
        for hidden, rows in outs:
            logp = torch.log_softmax(head(hidden).float(), -1)
            ent.append(-(logp.exp() * logp).sum(-1))
            n = rows.shape[0]
            gen = rows[:, rows.shape[1] - n :].float()  # the generated columns
            low = torch.tril(gen, -1)
            amax.append(low.max(0).values)
    return ent, amax


def timed(passes: rind_pass.RindPass, seqs, starts, batch: int, full: bool) -> tuple[float, float, list]:
    sync()
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    passes.prefix = None
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(seqs), batch):
        s, st = seqs[i : i + batch], starts[i : i + batch]
        prefix = None if full else passes.shared_prefix(s, st)
        outs += passes.run(s, st, prefix, full=full)
    sync()
    peak = torch.cuda.max_memory_allocated() / 2**30 if CUDA else 0.0
    return (time.perf_counter() - t0) * 1000 / len(seqs), peak, outs


def measure(shape: str, n: int) -> dict:
    out: dict = {"shape": shape}
    model = build(shape, torch.bfloat16)
    passes = rind_pass.RindPass(model, 0)
    seqs, starts = workload(n, model.config.vocab_size)
    timed(passes, seqs[:2], starts[:2], 2, False)  # warm-up (kernels, allocator)
    timed(passes, seqs[:2], starts[:2], 1, True)
    for name, batch, full in [
        ("reference_one_at_a_time", 1, True),
        ("reference_batched_8", 8, True),
        ("incremental_one_at_a_time", 1, False),
        ("incremental_batched", n, False),
    ]:
        ms, gib, outs = timed(passes, seqs, starts, batch, full)
        out[name] = {"ms_per_question": round(ms, 2), "peak_gib": round(gib, 2)}
        if name == "reference_one_at_a_time":
            ref_bf16 = stats(model, outs)
        if name == "incremental_batched":
            new_bf16 = stats(model, outs)
    out["bf16_max_abs_diff"] = {
        "entropy": max(float((a - b).abs().max()) for a, b in zip(ref_bf16[0], new_bf16[0])),
        "amax": max(float((a - b).abs().max()) for a, b in zip(ref_bf16[1], new_bf16[1])),
        "entropy_mean": float(torch.cat(ref_bf16[0]).mean()),
    }
    del model, passes
    if CUDA:
        torch.cuda.empty_cache()
    if shape == "smollm2-135m":  # exactness in fp32, and what bf16 moves
        model = build(shape, torch.float32)
        passes = rind_pass.RindPass(model, 0)
        few_s, few_st = seqs[:4], starts[:4]
        ref = stats(model, timed(passes, few_s, few_st, 1, True)[2])
        new = stats(model, timed(passes, few_s, few_st, 4, False)[2])
        out["fp32_max_abs_diff"] = {
            "entropy": max(float((a - b).abs().max()) for a, b in zip(ref[0], new[0])),
            "amax": max(float((a - b).abs().max()) for a, b in zip(ref[1], new[1])),
        }
        out["bf16_vs_fp32_entropy_max_rel"] = max(
            float(((a.cpu() - b.cpu()).abs() / b.cpu().clamp_min(1e-3)).max()) for a, b in zip(ref_bf16[0][:4], ref[0])
        )
        del model, passes
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = ap.parse_args()
    import transformers

    report = {
        "device": torch.cuda.get_device_name(0) if CUDA else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "questions": args.questions,
        "tokens_per_question": PREFIX + DOCS + QUESTION + GENERATED,
        "results": [],
    }
    for shape in args.shapes:
        try:
            report["results"].append(measure(shape, args.questions))
        except Exception as exc:  # one shape failing still reports the others
            report["results"].append({"shape": shape, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(report["results"][-1]), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
