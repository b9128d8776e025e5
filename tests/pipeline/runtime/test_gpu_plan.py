"""A replica's GPU memory plan (pipeline/runtime/gpu_plan.py): vLLM's share, the models, the FAISS index, for
the sizes of a real cluster run (an 8B generator on an 80 GiB GPU, 21M DPR passages), without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from indexing.shards.faiss_gpu import GiB, IndexPlacement, IndexShape
from pipeline.config import DynragConfig
from pipeline.runtime import gpu_plan
from pipeline.runtime.gpu_plan import (
    EMBEDDING_METHOD_MODULES,
    GpuPlanError,
    MiB,
    ModelNeed,
    parameter_count,
    plan_gpu,
    replica_gpu_plan,
    replica_models,
)

DPR = 21_015_324
H100 = 80 * GiB
ENCODER = ModelNeed("query encoder", 110_000_000 * 2)  # bge-base in bfloat16
ATTENTION_8B = ModelNeed("DRAGIN attention model", 8_030_000_000 * 2 + 256 * MiB)  # Llama-3-8B in bfloat16


def test_8b_generator_with_a_21m_ivf_pq64_index_fits_with_float16_lookup_tables():
    plan = plan_gpu(H100, 0.9, (ENCODER,), IndexShape.from_factory("IVF4096,PQ64", 768, DPR))
    assert plan.vllm == int(0.9 * H100)
    assert plan.index.on_gpu and plan.index.use_float16
    # 21M x (64 code bytes + 8 id bytes) + quantizer + PQ centroids, and faiss's 1.5 GiB scratch
    assert plan.index.gpu_bytes == DPR * 72 + 4096 * 768 * 4 + 256 * 768 * 4
    assert plan.index.scratch_bytes == 3 * GiB // 2
    used = plan.vllm + ENCODER.bytes + plan.cuda_context + plan.index.gpu_bytes + plan.index.scratch_bytes
    assert used <= H100
    text = plan.describe()
    assert "vLLM (0.90) 72.0 GiB" in text and "float16 lookup tables" in text and "IVF4096,PQ64 21.0M x 768" in text


def test_a_21m_flat_index_stays_on_the_cpu_or_is_refused_when_required():
    flat = IndexShape.from_factory("Flat", 768, DPR)  # 60 GiB in float32, 30 GiB in float16
    plan = plan_gpu(H100, 0.9, (ENCODER,), flat)
    assert not plan.index.on_gpu and plan.index.gpu_bytes == DPR * 768 * 2  # float16 was tried
    assert "on CPU" in plan.describe()
    with pytest.raises(GpuPlanError, match=r"index\.faiss_gpu=gpu.*Flat 21\.0M x 768.*needs 31\.6 GiB, 7\.3 GiB left"):
        plan_gpu(H100, 0.9, (ENCODER,), flat, index_mode="gpu")
    # with vLLM at 0.5 the float16 copy fits
    assert plan_gpu(H100, 0.5, (ENCODER,), flat).index.use_float16


def test_hnsw_stays_on_the_cpu_and_cpu_mode_keeps_any_index_there():
    plan = plan_gpu(H100, 0.9, (), IndexShape.from_factory("HNSW32", 768, 1_000_000))
    assert not plan.index.on_gpu and "HNSW" in plan.index.reason
    pq = IndexShape.from_factory("IVF4096,PQ64", 768, DPR)
    assert not plan_gpu(H100, 0.9, (), pq, index_mode="cpu").index.on_gpu
    with pytest.raises(GpuPlanError, match="faiss has no GPU HNSW"):
        plan_gpu(H100, 0.9, (), IndexShape.from_factory("HNSW32", 768, 10), index_mode="gpu")


def test_models_beyond_the_gpu_are_refused_with_their_figures():
    """vLLM's 0.9 and DRAGIN's own bfloat16 copy of an 8B model do not fit one 80 GiB GPU: one line with the parts."""
    with pytest.raises(GpuPlanError) as err:
        plan_gpu(H100, 0.9, (ATTENTION_8B, ENCODER), IndexShape.from_factory("IVF4096,PQ64", 768, DPR))
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(
        r"vLLM \(0\.90\) 72\.0 GiB \+ DRAGIN attention model 15\.2 GiB \+ query encoder 0\.2 GiB "
        r"\+ CUDA context 0\.5 GiB = 87\.9 GiB > the GPU's 80\.0 GiB",
        msg,
    ), msg
    most = float(re.search(r"at most (\d\.\d\d)", msg)[1])  # the share that would fit, and does
    assert most == 0.80
    assert plan_gpu(H100, most, (ATTENTION_8B, ENCODER)).vllm <= H100 - ATTENTION_8B.bytes - ENCODER.bytes


def _safetensors(folder: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, str(folder / "model.safetensors"))


def test_replica_models_read_parameter_counts_from_the_model_folders(tmp_path):
    gen, enc = tmp_path / "gen", tmp_path / "enc"
    _safetensors(gen, {"a": (10, 20), "b": (5,)})
    _safetensors(enc, {"w": (4, 4)})
    assert parameter_count(gen) == 205
    cfg = DynragConfig.model_validate(
        {
            "generation": {"model": str(gen), "backend": "vllm", "attention_batch_mib": 1},
            "embedding": {"model": str(enc), "dtype": "bfloat16"},
            "method": {"name": "dragin"},
        }
    )
    needs = {m.name: m.bytes for m in replica_models(cfg, dense_index=True)}
    assert needs == {"DRAGIN attention model": 205 * 2 + 2 * MiB, "query encoder": 16 * 2}
    assert replica_models(cfg, dense_index=True, pooled=frozenset({"retrieval"})) == (
        ModelNeed("DRAGIN attention model", 205 * 2 + 2 * MiB),
    )
    cfg.embedding.device = "cpu"
    cfg.method.name = "sr-rag"
    assert replica_models(cfg, dense_index=True) == ()


def test_embedding_and_attention_users_are_the_ones_the_plan_counts():
    """The plan counts the embedder for the methods whose programs yield Embed and the attention model for
    dragin: the method sources must agree, or a new method's model goes unbudgeted."""
    methods = Path(__file__).resolve().parents[3] / "pipeline" / "methods"
    embeds = {p.stem for p in methods.glob("*.py") if "yield Embed(" in p.read_text()}
    assert embeds == set(EMBEDDING_METHOD_MODULES)
    attention = [p.stem for p in methods.glob("*.py") if re.search(r'Call\(\s*"attention"', p.read_text())]
    # dragin_authors: the authors' setting (dynrag conform, on the transformers generator's model): token counts,
    # query cuts, their RIND and query
    assert sorted(attention) == ["dragin", "dragin_authors"]
    assert len(re.findall(r'Call\(\s*"attention"', (methods / "dragin.py").read_text())) == 1  # dynrag's RIND


def test_no_plan_without_cuda():
    """Here (no CUDA) a replica makes no plan, so its index opens on the CPU as before."""
    import torch

    assert not torch.cuda.is_available()
    assert replica_gpu_plan(DynragConfig(), None) is None


def test_the_index_is_opened_once_and_gets_the_plans_placement_before_its_first_search(monkeypatch):
    """preflight opens the run's index once, plans from its stated resources (no second manifest read), hands
    the plan's FAISS placement to it before it searches, and the backends search that very index."""
    import contextlib

    import indexing
    import pipeline.runtime.answer as answer
    from indexing.search.retrievers import Resources

    shape = IndexShape.from_factory("IVF4096,PQ64", 768, DPR)
    events = []

    class FakeIndex:
        manifest = {"settings": {"lucene": {"analyzer": {"stemmer": "porter", "stopwords": True}}}}

        def resources(self):
            return Resources(1, shape)

        def place_faiss(self, placement):
            events.append(("place", placement))

        def search(self, queries, k, retriever):
            events.append(("search", retriever))
            return [[] for _ in queries]

        def close(self):
            events.append(("close", None))

    opened = []
    monkeypatch.setattr(indexing, "open_index", lambda d, settings: opened.append(d) or FakeIndex())
    placement = IndexPlacement(True, "test")

    def plan(cfg, retriever, pooled=frozenset()):
        assert retriever.resources().faiss == shape
        return plan_gpu(H100, 0.5, (), shape).__class__(H100, 0.5, (), placement, shape)

    monkeypatch.setattr(gpu_plan, "replica_gpu_plan", plan)  # as the in-process runner calls it (runners.py)
    cfg = DynragConfig()
    cfg.generation.backend = "none"
    with contextlib.ExitStack() as stack:
        _, backends = answer.preflight(cfg, "idx", stack)
        assert backends.search(["q"], 1, "bm25") == [[]]
    assert opened == ["idx"]
    assert events[:2] == [("place", placement), ("search", "bm25")] and ("close", None) in events
