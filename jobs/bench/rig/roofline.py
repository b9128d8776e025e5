"""How close a generation benchmark's side comes to this machine's arithmetic.

A decoder's forward pass costs about 2 FLOPs per weight a token passes through: every weight matrix but the
input embedding, and the output projection only for generated tokens (vLLM and transformers' `generate`
compute logits only where a token is sampled). Attention over the context (a few percent at these lengths)
is left out, so the figure is a slight underestimate. Achieved GFLOP/s = that count x tokens / timed
seconds, set against a large matrix product measured here in the same dtype: a side near the measured rate
cannot get much faster on this machine, and the ratio of two sides is bounded by measured / slower side.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path


def weight_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Tensor name -> shape, read from the headers of the folder's *.safetensors files (no weights loaded)."""
    shapes: dict[str, list[int]] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    for f in files:
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def flops_per_token(model_dir: str | Path) -> tuple[int, int]:
    """(FLOPs per prompt token, FLOPs per generated token) of the model in `model_dir`."""
    shapes = weight_shapes(model_dir)
    matrices = {k: s for k, s in shapes.items() if len(s) == 2}
    embed = [k for k in matrices if k.endswith("embed_tokens.weight")]
    head = [k for k in matrices if k.endswith("lm_head.weight")] or embed  # tied: the embedding is the head
    if not head:
        raise ValueError(f"{model_dir}: no embed_tokens or lm_head weight to tell the input and output matrices by")
    numel = {k: s[0] * s[1] for k, s in matrices.items()}
    body = sum(n for k, n in numel.items() if k not in embed and k not in head)
    return 2 * body, 2 * (body + numel[head[0]])


def achieved_gflops(
    model_dir: str | Path, prompt_tokens: float, completion_tokens: float, questions: int, seconds: float
) -> float:
    """Model GFLOP/s of a timed run: tokens per question as its rows counted them."""
    prompt, completion = flops_per_token(model_dir)
    return (prompt * prompt_tokens + completion * completion_tokens) * questions / seconds / 1e9


def matmul_gflops(dtype: str = "float32", n: int = 1536, seconds: float = 3.0) -> float:
    """GFLOP/s of repeated n x n matrix products on torch's default threads (best of the repeats)."""
    import torch

    a = torch.randn(n, n, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, dtype=a.dtype)
    torch.mm(a, b)  # first call: kernel selection
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best
