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
    from platform_shims.java import ensure_java

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
    from platform_shims.java import ensure_java, _SigAction

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
    from platform_shims.raytools import init_ray
    from pipeline.config import DynragConfig
    cfg = DynragConfig()
    cfg.ray.num_cpus = 1
    init_ray(None, 1)
    kept = handlers() == jvm
    from platform_shims.raytools import shutdown_ray
    shutdown_ray()
    print("same" if kept and handlers() == jvm else "replaced")
""")


def test_the_jvm_keeps_its_signal_handlers_when_ray_starts_after_it():
    """Ray's core worker installs SIGSEGV/SIGBUS/SIGFPE/SIGILL handlers in ray.init (checked: without
    `jvm_signals_kept` all four are replaced), and ray.shutdown() sets SIGSEGV back to the default (checked:
    a test process then died with -11, no trace, at the JVM's next internal fault): both keep the JVM's."""
    out = subprocess.run([sys.executable, "-c", RAY_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "same"


HEAP_PROBE = textwrap.dedent("""
    import sys
    from indexing import open_index
    from pipeline.config import load_config

    cfg = load_config(None, sys.argv[2:])
    with open_index(sys.argv[1], cfg.index_settings()) as index:
        assert index.search(["capital of France"], 1, "bm25")[0][0].title == "Paris"
        from jnius import autoclass
        print(autoclass("java.lang.Runtime").getRuntime().maxMemory() // 2**20)
""")


def test_index_jvm_heap_mb_caps_the_heap_of_a_searching_process(tmp_path):
    """index.jvm_heap_mb bounds the JVM a search process starts (default: a quarter of the machine's memory)."""
    from indexing import build_index
    from pipeline.config import load_config

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": "p", "title": "Paris", "text": "Paris is the capital of France."}\n'
        '{"id": "b", "title": "Berlin", "text": "Berlin is the capital of Germany."}\n'
    )
    build_index([str(corpus)], str(tmp_path / "idx"), load_config(None, ["index.dense=false"]).index_settings())

    def max_heap_mib(*sets):
        out = subprocess.run(
            [sys.executable, "-c", HEAP_PROBE, str(tmp_path / "idx"), *sets],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.strip().splitlines()[-1])

    assert 200 <= max_heap_mib("index.jvm_heap_mb=256") <= 256
    assert max_heap_mib() > 1024  # the JVM's default on this machine (24 GiB: about 6 GiB)


def test_dynrag_jvm_options_reach_the_processes_jvm():
    """DYNRAG_JVM_OPTIONS (the tests set C1-only compilation with it) are the JVM's options when it starts."""
    import os

    probe = (
        "from platform_shims.java import ensure_java; ensure_java(); import jnius; "
        "S = jnius.autoclass('java.lang.System'); print(S.getProperty('dynrag.probe'))"
    )
    env = {**os.environ, "DYNRAG_JVM_OPTIONS": "-Ddynrag.probe=42 -XX:TieredStopAtLevel=1"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "42"
