"""A FAISS index on a GPU: what it costs there, whether it goes there, and the one call that moves it.

The index half of a replica's GPU plan (pipeline/runtime/gpu_plan.py adds vLLM and the models). Pure
arithmetic from the index factory and the manifest; faiss is imported only by `FaissGpuMover`.

Bytes on the GPU (faiss wiki "Faiss indexes", column Bytes/vector; GPU storage read from faiss/gpu/GpuCloner.cpp):
- Flat: 4·d per vector, 2·d with GpuClonerOptions.useFloat16 (GpuIndexFlat stores float16); no ids.
- IVF-Flat: 4·d + 8 (an 8-byte id). GpuIndexIVFFlatConfig has no float16 storage: the cloner gives useFloat16
  only to Flat and IVF-PQ (IVF,SQfp16 is the float16 IVF index).
- IVF-SQ: d (SQ8), d/2 (SQ4) or 2·d (SQfp16), + 8.   IVF-PQ: M·nbits/8 + 8.
- IVF also: the coarse quantizer, nlist·d·4 (GpuIndexIVF::copyFrom clones it in float32); PQ centroids
  2^nbits·d·4; lists stored interleaved (IVF-Flat, IVF-SQ) are padded to blocks of 32 vectors.
- the scratch memory of StandardGpuResources: 512 MiB on a GPU of up to 4 GiB, 1 GiB up to 8 GiB, else 1.5 GiB
  (StandardGpuResources.cpp), set explicitly here so the plan holds.
GPU limits (faiss/gpu/GpuIndexIVFPQ.cu, verifyPQSettings_): IVF-PQ needs nbits = 8 and M in `_GPU_PQ_M`; its
lookup table, M·2^nbits·4 bytes (2 with float16 lookup tables), must fit a block's 48 KiB of shared memory, so
M > 48 (PQ64 of a 21M DPR index) needs useFloat16 (for IVF-PQ the cloner maps it to useFloat16LookupTables).
HNSW has no GPU index ("This index type is not implemented on GPU", GpuCloner.cpp): it stays on the CPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

GiB = 2**30
SHARED_MEMORY_PER_BLOCK = 48 * 1024  # CUDA's static shared-memory limit per block, what faiss checks against
_GPU_PQ_M = (1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96)  # IVFPQ::isSupportedPQCodeLength
_SQ_BYTES_PER_DIM = {"8": 1.0, "4": 0.5, "fp16": 2.0}
_INTERLEAVE = 32  # vectors per block of an interleaved inverted list (IVF-Flat, IVF-SQ on the GPU)

Kind = Literal["flat", "hnsw", "ivf-flat", "ivf-sq", "ivf-pq", "other"]


@dataclass(frozen=True)
class IndexShape:
    """What the plan needs to know of an index: its kind and sizes (from `index.faiss_factory` and the manifest)."""

    kind: Kind
    dim: int
    vectors: int
    nlist: int = 0
    code_bytes: int = 0  # IVF-SQ, IVF-PQ: bytes of one vector's code
    pq_m: int = 0
    pq_nbits: int = 8

    @classmethod
    def from_factory(cls, factory: str, dim: int, vectors: int) -> IndexShape:
        f = factory.replace(" ", "")
        if f == "Flat":
            return cls("flat", dim, vectors)
        if f.startswith("HNSW"):
            return cls("hnsw", dim, vectors)
        # "np": PQ codes without polysemous training, the same IndexIVFPQ (jobs/bench/scale.py's earlier factory)
        m = re.fullmatch(r"IVF(\d+),(Flat|SQ(8|4|fp16)|PQ(\d+)(?:x(\d+))?(?:np)?)", f)
        if not m:
            return cls("other", dim, vectors)  # pre-transforms, HNSW coarse quantizers, ...: kept on the CPU
        nlist = int(m[1])
        if m[2] == "Flat":
            return cls("ivf-flat", dim, vectors, nlist)
        if m[3]:
            return cls("ivf-sq", dim, vectors, nlist, math.ceil(dim * _SQ_BYTES_PER_DIM[m[3]]))
        pq_m, nbits = int(m[4]), int(m[5] or 8)
        return cls("ivf-pq", dim, vectors, nlist, math.ceil(pq_m * nbits / 8), pq_m, nbits)

    def describe(self) -> str:
        ivf = f"IVF{self.nlist},"
        name = {"flat": "Flat", "hnsw": "HNSW", "ivf-flat": ivf + "Flat", "ivf-sq": ivf + "SQ"}.get(self.kind)
        name = ivf + f"PQ{self.pq_m}" if self.kind == "ivf-pq" else name or "index"
        return f"{name} {self.vectors / 1e6:.1f}M x {self.dim}"


def gpu_index_bytes(shape: IndexShape, float16: bool = False) -> int:
    """Bytes the index takes on a GPU (without faiss's scratch memory); `float16` is Flat's float16 storage."""
    n, d = shape.vectors, shape.dim
    if shape.kind == "flat":
        return n * d * (2 if float16 else 4)
    quantizer = shape.nlist * d * 4
    if shape.kind == "ivf-flat":
        per_vector = 4 * d
    elif shape.kind in ("ivf-sq", "ivf-pq"):
        per_vector = shape.code_bytes
    else:
        raise ValueError(f"no GPU index for a {shape.kind} index")
    ids = 8 * n
    if shape.kind == "ivf-pq":
        return n * per_vector + ids + quantizer + 2**shape.pq_nbits * d * 4  # + PQ centroids
    padding = shape.nlist * _INTERLEAVE * per_vector
    return n * per_vector + padding + ids + quantizer


def faiss_scratch_bytes(total_gpu_bytes: int) -> int:
    """The temporary memory StandardGpuResources reserves on a GPU of this size (StandardGpuResources.cpp)."""
    if total_gpu_bytes <= 4 * GiB:
        return GiB // 2
    return GiB if total_gpu_bytes <= 8 * GiB else 3 * GiB // 2


@dataclass(frozen=True)
class IndexPlacement:
    """Where a replica's FAISS index lives. On the GPU it is one merged index cloned once with these options
    (GpuClonerOptions.useFloat16; scratch memory by StandardGpuResources.setTempMemory)."""

    on_gpu: bool
    reason: str
    gpu_bytes: int = 0
    scratch_bytes: int = 0
    use_float16: bool = False
    device: int = 0

    def describe(self) -> str:
        if not self.on_gpu:
            return f"on CPU ({self.reason})"
        return f"on GPU {self.gpu_bytes / GiB:.1f} GiB + {self.scratch_bytes / GiB:.1f} GiB scratch ({self.reason})"


def place_index(shape: IndexShape, room_bytes: int, total_gpu_bytes: int) -> IndexPlacement:
    """The index on the GPU if it fits in `room_bytes` (what vLLM and the models leave), else on the CPU."""
    if shape.kind == "hnsw":
        return IndexPlacement(False, "faiss has no GPU HNSW")
    if shape.kind == "other":
        return IndexPlacement(False, "this factory is not placed on a GPU")
    float16 = False
    why = "float32"
    if shape.kind == "ivf-pq":
        if shape.pq_nbits != 8 or shape.pq_m not in _GPU_PQ_M:
            return IndexPlacement(False, f"faiss's GPU IVF-PQ takes 8-bit codes with M in {_GPU_PQ_M}")
        float16 = shape.pq_m * 2**shape.pq_nbits * 4 > SHARED_MEMORY_PER_BLOCK
        why = "float16 lookup tables" if float16 else "float32 lookup tables"
    scratch = faiss_scratch_bytes(total_gpu_bytes)
    need = gpu_index_bytes(shape)
    if shape.kind == "flat" and need + scratch > room_bytes:  # exact scores when they fit, else half the memory
        float16, why, need = True, "float16 vectors", gpu_index_bytes(shape, float16=True)
    if need + scratch > room_bytes:
        return IndexPlacement(
            False, f"needs {(need + scratch) / GiB:.1f} GiB, {max(room_bytes, 0) / GiB:.1f} GiB left", need, scratch
        )
    return IndexPlacement(True, why, need, scratch, float16)


class GpuMover(Protocol):
    """Clones one CPU index to the GPU as `placement` says and returns the GPU index."""

    def to_gpu(self, index: Any, placement: IndexPlacement) -> Any: ...


class FaissGpuMover:
    """faiss-gpu's `index_cpu_to_gpu` with one StandardGpuResources per moved index (kept alive with it)."""

    def __init__(self) -> None:
        self._resources: list[Any] = []

    def to_gpu(self, index: Any, placement: IndexPlacement) -> Any:
        import faiss

        res = faiss.StandardGpuResources()
        res.setTempMemory(placement.scratch_bytes)
        options = faiss.GpuClonerOptions()
        options.useFloat16 = placement.use_float16  # Flat: float16 storage; IVF-PQ: float16 lookup tables
        options.usePrecomputed = False  # precomputed tables would add nlist x M x 256 x 4 bytes
        moved = faiss.index_cpu_to_gpu(res, placement.device, index, options)
        self._resources.append(res)  # the GPU index allocates through it
        return moved
