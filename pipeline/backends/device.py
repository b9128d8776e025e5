"""Whether this process sees a GPU: the one check the generators and the run's dtype (resolve_dtype) share."""

from __future__ import annotations


def cuda_available() -> bool:
    """Whether this process sees a CUDA GPU (False without torch)."""
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False
