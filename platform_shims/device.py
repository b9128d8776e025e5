"""Which GPU this process may use: the one check of every part that places a model, an index or vLLM.

- `cuda_available`: this process sees a CUDA GPU (vLLM's engine, the run's dtype: resolve_dtype).
- `own_cuda`: this process's own models and index may use one. Outside Ray, that is the same. In a Ray
  actor or task, only where Ray assigned it GPUs (it then sets CUDA_VISIBLE_DEVICES to them, so device 0 is
  its own): since Ray 2.60 an actor that asked for none still sees all of its node's GPUs, and a
  tensor-parallel replica's engine actor asks for none (its GPUs are its vLLM workers'), so its query
  encoder, classifiers, DRAGIN's attention model and FAISS would land on another process's GPU 0.
- `own_device`: a device setting resolved; an explicit `cuda` where this process owns no GPU is refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from platform_shims.errors import DeviceError

GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/dxg", "/dev/kfd")


def gpu_driver_present(exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Whether any GPU driver's device or proc file is here (NVIDIA's; WSL2's /dev/dxg; ROCm's /dev/kfd): without
    one torch sees no GPU, so `cuda_available` answers without importing torch (3 s of a CPU job's start)."""
    return any(exists(path) for path in GPU_DRIVER_FILES)


def cuda_available() -> bool:
    """Whether this process sees a CUDA GPU (False without torch, or without a GPU driver)."""
    if "torch" not in sys.modules and not gpu_driver_present():
        return False
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
    from platform_shims.compat import in_ray_worker

    if not in_ray_worker():
        return None
    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


def owns_gpu(cuda: bool, assigned: list[str] | None) -> bool:
    """The decision of `own_cuda`: CUDA seen, and in a Ray worker at least one GPU assigned to it."""
    return cuda and (assigned is None or bool(assigned))


def own_cuda() -> bool:
    return owns_gpu(cuda_available(), ray_assigned_gpus())


def check_explicit_device(device: str, assigned: list[str] | None, visible: str | None) -> str:
    """An explicit `cuda` / `cuda:N` device, refused (DeviceError, one line) where this process owns no GPU:
    a Ray worker that Ray assigned no GPU (`assigned` == []; it still sees the node's GPUs, so `cuda` would be
    another process's GPU 0), or CUDA_VISIBLE_DEVICES set empty (`visible` == ""); or N past the GPUs Ray
    assigned it. Any other device is returned as it is."""
    if not device.startswith("cuda"):
        return device
    where = (
        "this Ray worker was assigned no GPU by Ray"
        if assigned is not None and not assigned
        else "CUDA_VISIBLE_DEVICES is empty in this process"
        if visible is not None and not visible.strip()
        else None
    )
    n = device.partition(":")[2]
    if where is None and assigned and n.isdigit() and int(n) >= len(assigned):
        where = f"this Ray worker was assigned {len(assigned)} GPU(s) by Ray"
    if where:
        raise DeviceError(
            f"device {device!r} is set explicitly, but {where}: it would run on a GPU another process owns; "
            "use device 'auto' (or 'cpu'), or give the actor its GPUs (num_gpus)"
        )
    return device


def own_device(device: str = "auto") -> str:
    """A model's device setting resolved: "auto" is "cuda" where this process owns a GPU, else "cpu"; an explicit
    CUDA device where this process owns none is refused (`check_explicit_device`)."""
    if device != "auto":
        return check_explicit_device(device, ray_assigned_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return "cuda" if own_cuda() else "cpu"
