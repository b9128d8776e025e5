"""One replica's GPU memory plan: vLLM's share, the models this process loads on the GPU, and the FAISS index.

`plan_gpu` is pure: vLLM takes `gpu_memory_utilization` of the GPU (vLLM's default 0.9; its engine checks at
start that this share is free), this process's models (weights x dtype bytes, plus DRAGIN's attention maps) and
a CUDA-context allowance come next; a plan whose fixed parts exceed the GPU is refused with its figures. The
FAISS index takes what is left, if it fits (`indexing.faiss_gpu.place_index`: one merged index, float16 where
needed, HNSW on the CPU), else it stays on the CPU; `index.faiss_gpu=gpu` refuses instead, `cpu` never moves it.

`replica_gpu_plan` makes the plan at the start of a replica (the Ray engine actor, an in-process run) when CUDA
is visible, from the replica's open index's stated resources (indexing/search/retrievers.py: the index is opened once
and handed over, never read again here); without CUDA it returns None and nothing changes.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from indexing.shards.faiss_gpu import GiB, IndexPlacement, IndexShape, place_index
from pipeline.config import DynragConfig, replica_share, vllm_utilization
from pipeline.errors import DynragError

if TYPE_CHECKING:
    from indexing.search.retrievers import Resources

log = logging.getLogger(__name__)

MiB = 2**20
CUDA_CONTEXT = 512 * MiB  # an allowance for this process's CUDA context and allocator slack (an estimate: no GPU here)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
EMBEDDING_METHOD_MODULES = ("pairs", "erm4")  # methods whose programs yield Embed (tests keep this list true)
_WEIGHT_FILES = (".bin", ".pt", ".pth", ".gguf")


class GpuPlanError(DynragError, ValueError):
    """What a replica needs on its GPU exceeds the GPU: the message lists the parts in GiB."""


@dataclass(frozen=True)
class ModelNeed:
    name: str
    bytes: int


@dataclass(frozen=True)
class GpuPlan:
    total: int  # the GPU's memory
    vllm_utilization: float  # of the whole GPU, as vLLM counts it
    models: tuple[ModelNeed, ...]
    index: IndexPlacement
    index_shape: IndexShape | None = None
    cuda_context: int = CUDA_CONTEXT
    share: float = 1.0  # of the GPU this replica owns (ray.actor_num_gpus below 1: replicas sharing one GPU)

    @property
    def vllm(self) -> int:
        return int(self.total * self.vllm_utilization)

    @property
    def budget(self) -> int:
        return int(self.total * self.share)

    def parts(self) -> list[tuple[str, int]]:
        head = [(f"vLLM ({self.vllm_utilization:.2f})", self.vllm)] if self.vllm else []
        return head + [(m.name, m.bytes) for m in self.models] + [("CUDA context", self.cuda_context)]

    def describe(self) -> str:
        index = "no FAISS index"
        if self.index_shape is not None:
            index = f"FAISS {self.index_shape.describe()} {self.index.describe()}"
        used = sum(b for _, b in self.parts()) + self.index.gpu_bytes + self.index.scratch_bytes
        of = f"{self.share:g} of {_gib(self.total)}" if self.share < 1 else _gib(self.total)
        return f"GPU plan ({of}): {_sum(self.parts())}; {index}; {_gib(self.budget - used)} unplanned"


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _sum(parts: list[tuple[str, int]]) -> str:
    return " + ".join(f"{name} {_gib(b)}" for name, b in parts)


def plan_gpu(
    total_bytes: int,
    vllm_utilization: float,
    models: tuple[ModelNeed, ...] = (),
    index_shape: IndexShape | None = None,
    index_mode: str = "auto",
    cuda_context: int = CUDA_CONTEXT,
    share: float = 1.0,
) -> GpuPlan:
    """The plan of this replica's `share` of one GPU (`vllm_utilization`, of the whole GPU, 0 when no vLLM runs
    here); GpuPlanError when it cannot fit."""
    plan = GpuPlan(
        total_bytes, vllm_utilization, tuple(models), IndexPlacement(False, "no index"), None, cuda_context, share
    )
    fixed, budget = sum(b for _, b in plan.parts()), plan.budget
    if fixed > budget:
        most = max(0.0, (budget - fixed + plan.vllm) / total_bytes)
        mine = f"its share {share:g} of the GPU, {_gib(budget)}" if share < 1 else f"the GPU's {_gib(budget)}"
        raise GpuPlanError(
            f"the GPU plan does not fit: {_sum(plan.parts())} = {_gib(fixed)} > {mine}; "
            f"lower generation.engine_kwargs.gpu_memory_utilization (at most {math.floor(most * 100) / 100:.2f} "
            "here) or move models to the CPU (embedding.device, classifier.device, ray.scorer_actors)"
        )
    if index_shape is None:
        return plan
    if index_mode == "cpu":
        index = IndexPlacement(False, "index.faiss_gpu=cpu")
    else:
        index = place_index(index_shape, budget - fixed, budget)
    if index_mode == "gpu" and not index.on_gpu:
        raise GpuPlanError(
            f"index.faiss_gpu=gpu, but the FAISS index {index_shape.describe()} cannot go on the GPU: {index.reason} "
            f"({_sum(plan.parts())} of {_gib(budget)}); set index.faiss_gpu=auto to keep it on the CPU"
        )
    return GpuPlan(total_bytes, vllm_utilization, plan.models, index, index_shape, cuda_context, share)


# -- the replica's side: sizes read from the configuration, the model folders and the open index ---------------


def parameter_count(folder: Path) -> int | None:
    """Parameters in a folder's safetensors files (read from their JSON headers), None without any."""
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        return None
    count = 0
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        count += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return count


def weights_bytes(folder: str | Path, dtype_bytes: int) -> int:
    """A model's weights in memory at `dtype_bytes` per parameter (other formats: their files' sizes)."""
    folder = Path(folder)
    count = parameter_count(folder)
    if count is not None:
        return count * dtype_bytes
    return sum(f.stat().st_size for f in folder.rglob("*") if f.suffix in _WEIGHT_FILES)


def _on_gpu(device: str) -> bool:
    return device == "auto" or device.startswith("cuda")


def replica_models(cfg: DynragConfig, dense_index: bool, pooled: frozenset[str] = frozenset()) -> tuple[ModelNeed, ...]:
    """The models this replica's process may load on its GPU (`pooled`: parts served by Ray pools instead)."""
    from pipeline.assets.models import resolve_model
    from pipeline.methods.registry import get_method

    def size(name: str, dtype_bytes: int) -> int:
        return weights_bytes(resolve_model(name, cfg.paths.cache_dir), dtype_bytes)

    g, e, needs = cfg.generation, cfg.embedding, []
    if g.backend == "transformers":
        needs.append(ModelNeed("generator", size(g.model, DTYPE_BYTES[g.dtype])))
    if g.backend == "vllm" and cfg.method.name == "dragin":  # the attention backend's own copy, half precision
        # the last layer's weights of one forward batch, in the making and kept (the layers below run SDPA)
        maps = 2 * int(g.attention_batch_mib * MiB)
        dtype_bytes = 2 if g.attention_dtype == "auto" else DTYPE_BYTES[g.attention_dtype]
        needs.append(ModelNeed("DRAGIN attention model", size(g.model, dtype_bytes) + maps))
    if dense_index and "retrieval" not in pooled and _on_gpu(e.device):
        needs.append(ModelNeed("query encoder", size(e.model, DTYPE_BYTES[e.dtype])))
    if "scorer" not in pooled:
        module = get_method(cfg.method.name).program.__module__.rsplit(".", 1)[-1]
        if module in EMBEDDING_METHOD_MODULES and _on_gpu(e.device):
            needs.append(ModelNeed("embedder", size(e.model, 4)))
        folders = {*cfg.scoring.classifiers.values(), *([cfg.classifier.path] if cfg.classifier.path else [])}
        for folder in sorted(folders):
            if _on_gpu(cfg.classifier.device) and (Path(folder) / "dynrag-classifier.json").is_file():
                needs.append(ModelNeed(f"classifier {Path(folder).name}", weights_bytes(folder, 4)))
    return tuple(needs)


class StatesResources(Protocol):
    def resources(self) -> Resources: ...


def replica_gpu_plan(
    cfg: DynragConfig, retriever: StatesResources | None, pooled: frozenset[str] = frozenset()
) -> GpuPlan | None:
    """The plan of this replica's GPU (CUDA device 0: the one Ray gives the actor, or its share of it), None
    where this process owns no GPU (no CUDA; a Ray actor that Ray gave none, as a tensor-parallel replica's
    engine actor, whose GPUs are its vLLM workers': its models and index stay on the CPU). `retriever`: the
    replica's open index (None: none, or searched by a retrieval pool), whose stated resources name the FAISS
    index to place; the caller hands the plan's placement back to it."""
    from platform_shims.compat import in_ray_worker
    from platform_shims.device import own_cuda

    if not own_cuda():
        return None
    import torch

    total = int(torch.cuda.get_device_properties(0).total_memory)
    shape = retriever.resources().faiss if retriever is not None and "retrieval" not in pooled else None
    in_ray = in_ray_worker()  # a Ray engine replica, which may own a share of its GPU
    utilization = vllm_utilization(cfg, in_ray) if cfg.generation.backend == "vllm" else 0.0
    needs = replica_models(cfg, shape is not None, pooled)
    plan = plan_gpu(total, utilization, needs, shape, cfg.index.faiss_gpu, share=replica_share(cfg, in_ray))
    log.info("%s", plan.describe())
    return plan
