"""The JVM (pyserini) and vLLM in one process: vLLM's xgrammar loads tvm_ffi, whose library installs its
own SIGSEGV handler when it loads. The JVM takes SIGSEGV internally, so if that handler replaces the
JVM's, the process dies at the JVM's next such fault (seen: `dynrag demo` built its index, started vLLM,
then segfaulted). `ensure_java` loads tvm_ffi before the JVM starts, so the JVM's handler stays. Ray's
`ray.init` replaces them too; dynrag restores the JVM's around it."""

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import ctypes
    from indexing.java import ensure_java

    class Action(ctypes.Structure):
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]

    def segv_handler():
        a = Action()
        assert ctypes.CDLL(None).sigaction(11, None, ctypes.byref(a)) == 0
        return a.handler

    ensure_java()
    import jnius
    jnius.autoclass("java.lang.String")
    jvm = segv_handler()
    import xgrammar  # noqa: F401  (what vLLM's engine imports)
    print("same" if segv_handler() == jvm else "replaced")
""")


def test_the_jvm_keeps_its_segv_handler_when_vllm_loads_after_it():
    pytest.importorskip("xgrammar")
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "same"


RAY_PROBE = textwrap.dedent("""
    import ctypes
    from indexing.java import ensure_java, _SigAction

    def handlers():
        out = []
        for sig in (11, 7, 8, 4):
            a = _SigAction()
            assert ctypes.CDLL(None).sigaction(sig, None, ctypes.byref(a)) == 0
            out.append(a.handler)
        return out

    ensure_java()
    import jnius
    jnius.autoclass("java.lang.String")
    jvm = handlers()
    from indexing.raytools import ensure_ray
    from pipeline.config import DynragConfig
    cfg = DynragConfig()
    cfg.ray.num_cpus = 1
    ensure_ray(cfg.index_settings())
    kept = handlers() == jvm
    import ray
    ray.shutdown()
    print("same" if kept else "replaced")
""")


def test_the_jvm_keeps_its_signal_handlers_when_ray_starts_after_it():
    """Ray's core worker installs SIGSEGV/SIGBUS/SIGFPE/SIGILL handlers in ray.init (checked: without
    `jvm_signals_kept` all four are replaced), which would kill the JVM at its next internal fault."""
    out = subprocess.run([sys.executable, "-c", RAY_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "same"
