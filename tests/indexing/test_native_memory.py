"""The settings behind `index.memory_budget_mb` (indexing/shards/native_memory.py), each checked in a fresh
interpreter: they only work when applied before pyarrow's first import or the JVM's start. The
bounded-memory build itself is measured in tests/faults/test_faults_memory.py."""

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
    code = (
        "import jnius_config; from indexing.shards.native_memory import bound_native_memory; bound_native_memory(256); "
        "print(' '.join(jnius_config.options))"
    )
    opts = run(code).split()
    assert {"-Xms256m", "-Xmx256m", "-XX:+AlwaysPreTouch", "-XX:TieredStopAtLevel=1"} <= set(opts)


def test_a_process_that_measures_search_keeps_the_c2_jit():
    """`dynrag bench scale`'s search probe fixes the heap but not the JIT: BM25 ran 1.7-2.0x slower on C1 alone."""
    code = (
        "import os; os.environ.pop('DYNRAG_JVM_OPTIONS', None); import jnius_config; "
        "from platform_shims.java import bound_jvm_memory; bound_jvm_memory(256, c1_only=False); "
        "print(' '.join(jnius_config.options))"
    )
    opts = run(code).split()
    assert {"-Xms256m", "-Xmx256m", "-XX:+AlwaysPreTouch"} <= set(opts)
    assert not any(o.startswith("-XX:TieredStopAtLevel") for o in opts)


def test_a_memory_budget_caps_shards_and_the_embedding_batch():
    """The largest shard gets 3/4 of index.memory_budget_mb, one embedding batch the rest (worked numbers)."""
    from indexing.shards.chunking import effective_embed_batch, effective_shard_size
    from pipeline.config import load_config

    minilm = {"hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12}
    cfg = load_config(None, ["index.memory_budget_mb=512", "embedding.max_seq_length=128"])
    # a passage: 100 words x 21 B + 600 + 6,144 = 8,844 B; 0.75 x 512 MiB / (4 x 8,844) = 11,382
    assert effective_shard_size(cfg) == 11_382
    # a text: 2 x 4 x 128 x (4 x 384 + 1,536 + 2 x 12 x 128) + 100 x 100 = 6,301,456 B; 128 MiB of them: 21
    assert effective_embed_batch(cfg, minilm) == 21
    assert effective_embed_batch(cfg, {}) < 21  # unknown sizes count as a large model's
    unbounded = load_config(None, ["embedding.batch_size=96"])
    assert (effective_shard_size(unbounded), effective_embed_batch(unbounded, minilm)) == (50_000, 96)
