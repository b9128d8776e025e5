"""The settings behind `index.memory_budget_mb` (indexing/native_memory.py), each checked in a fresh
interpreter: they only work when applied before pyarrow's first import or the JVM's start. The
bounded-memory build itself is measured in tests/test_faults_memory.py."""

from __future__ import annotations

import subprocess
import sys

from fault_tools import ROOT


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_arrow_uses_the_system_allocator_once_pipeline_is_imported():
    assert run("import pipeline, pyarrow as pa; print(pa.default_memory_pool().backend_name)") == "system"


def test_a_user_choice_of_arrow_pool_is_kept():
    code = "import os; os.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'jemalloc'; import pipeline; print(os.environ['ARROW_DEFAULT_MEMORY_POOL'])"
    assert run(code) == "jemalloc"


def test_the_budget_fixes_the_jvm_heap_and_its_jit_before_the_jvm_starts():
    code = ("import jnius_config; from indexing.native_memory import bound_native_memory; bound_native_memory(256); "
            "print(' '.join(jnius_config.options))")
    opts = run(code).split()
    assert {"-Xms256m", "-Xmx256m", "-XX:+AlwaysPreTouch", "-XX:TieredStopAtLevel=1"} <= set(opts)
