"""The JVM (pyserini) and vLLM in one process: vLLM's xgrammar loads tvm_ffi, whose library installs its
own SIGSEGV handler when it loads. The JVM takes SIGSEGV internally, so if that handler replaces the
JVM's, the process dies at the JVM's next such fault (seen: `dynrag demo` built its index, started vLLM,
then segfaulted). `ensure_java` loads tvm_ffi before the JVM starts, so the JVM's handler stays."""

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
