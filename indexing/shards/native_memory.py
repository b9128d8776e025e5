"""What `index.memory_budget_mb` needs besides small shards: native memory that stays flat while a
build runs through thousands of shards in one process. Measured here (80 MiB corpus, 495 shards):
without these, anonymous memory grew by >100 MiB; with them, by a few MiB.

- The JVM: a fixed heap and the C1 JIT only (java.py).
- glibc: the mmap threshold fixed at 128 KiB (by default it rises after the first large free, and
  then torch's and Lucene's large buffers come from the heap and fragment it), at most 2 malloc
  arenas for threads started from now on, and `malloc_trim` after each shard, which returns the
  free pages that interleaved torch, FAISS and JNI allocations leave in the heap. These settings
  last for the rest of the process.
- Arrow on the system allocator (set in pipeline/__init__.py: mimalloc keeps freed pages).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()  # None off glibc (macOS, musl): nothing to tune there


def bound_native_memory(jvm_heap_mb: int) -> None:
    import pyarrow as pa

    from platform_shims.java import bound_jvm_memory

    bound_jvm_memory(jvm_heap_mb)
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024)  # setting it also turns off its dynamic adjustment
        _LIBC.mallopt(M_ARENA_MAX, 2)
    backend = pa.default_memory_pool().backend_name
    if backend != "system":
        log.warning(
            "pyarrow's %s memory pool is in use (ARROW_DEFAULT_MEMORY_POOL was set after pyarrow was "
            "imported): it keeps freed memory, so index.memory_budget_mb may be exceeded",
            backend,
        )


def release_free_memory() -> None:
    """Return the heap's free pages to the system (a few ms)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
