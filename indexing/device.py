"""Which GPU this process may use: the one check of every part that places a model, an index or vLLM.

- `cuda_available`: this process sees a CUDA GPU (vLLM's engine, the run's dtype: resolve_dtype).
- `own_cuda`: this process's own models and index may use one. Outside Ray, that is the same. In a Ray
  actor or task, only where Ray assigned it GPUs (it then sets CUDA_VISIBLE_DEVICES to them, so device 0 is
  its own): since Ray 2.60 an actor that asked for none still sees all of its node's GPUs, and a
  tensor-parallel replica's engine actor asks for none (its GPUs are its vLLM workers'), so its query
  encoder, classifiers, DRAGIN's attention model and FAISS would land on another process's GPU 0.
"""

from __future__ import annotations

import sys


def cuda_available() -> bool:
    """Whether this process sees a CUDA GPU (False without torch)."""
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def ray_assigned_gpus() -> list[str] | None:
    """The GPU ids Ray assigned this process when it is a Ray worker (an actor or a task), None otherwise
    (no Ray, or the driver)."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    from indexing.compat import in_ray_worker

    if not in_ray_worker():
        return None
    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def owns_gpu(cuda: bool, assigned: list[str] | None) -> bool:
    """The decision of `own_cuda`: CUDA seen, and in a Ray worker at least one GPU assigned to it."""
    return cuda and (assigned is None or bool(assigned))


def own_cuda() -> bool:
    return owns_gpu(cuda_available(), ray_assigned_gpus())


def own_device(device: str = "auto") -> str:
    """A model's device setting resolved: "auto" is "cuda" where this process owns a GPU, else "cpu"."""
    if device != "auto":
        return device
    return "cuda" if own_cuda() else "cpu"
