"""The same small run through Ray Data on a local Ray instance gives the in-process predictions."""

from __future__ import annotations

import polars as pl
import pytest
from engine_fixtures import HOTPOT, build_hotpot_index, tiny_model_path

from pipeline.config import DynragConfig
from pipeline.runtime.answer import run_answer

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)

N = 8


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (4 logical CPUs, as the jobs below ask: `ray.num_cpus=4`) for the file's Ray jobs: a job
    joins a Ray already up and leaves it running, and a start and a shutdown per job cost ~5 s each."""
    from platform_shims.raytools import init_ray, shutdown_ray

    init_ray(None, 4)
    yield
    shutdown_ray()


def _cfg(tmp_path_factory, backend: str) -> DynragConfig:
    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = backend
    cfg.generation.kv_cache_gib = 1
    cfg.generation.max_new_tokens = 8
    cfg.generation.max_model_len = 4096
    cfg.answer.progress = False
    cfg.answer.batch_questions = 3  # several batches stream through the actors
    cfg.ray.num_cpus = 4  # logical CPUs: more than cores, as vLLM inside Ray needs (STACK.md)
    cfg.ray.actors = 1
    return cfg


def _predictions(out) -> dict[str, str]:
    df = pl.read_parquet(f"{out}/parts/*.parquet")
    assert df.height == N and df["question_id"].n_unique() == N and df["error"].null_count() == N
    return dict(zip(df["question_id"], df["prediction"]))


# slow on both backends (70 s and more): tests/pipeline/runtime/test_ray_stream.py checks the same (sr-rag rows through Ray Data
# equal the in-process rows, transformers backend) on every run; the pools test below keeps one Ray run here
@pytest.mark.parametrize(
    "backend", [pytest.param("transformers", marks=pytest.mark.slow), pytest.param("vllm", marks=pytest.mark.slow)]
)
def test_ray_matches_in_process(backend, data_dir, tmp_path_factory, tmp_path, local_ray):
    index = build_hotpot_index(data_dir, tmp_path_factory, 20)
    cfg = _cfg(tmp_path_factory, backend)
    dataset = str(data_dir / HOTPOT)
    local = run_answer(dataset, str(tmp_path / "local"), index=str(index), method="sr-rag", limit=N, cfg=cfg)
    cfg.runtime.mode = "ray"
    remote = run_answer(dataset, str(tmp_path / "ray"), index=str(index), method="sr-rag", limit=N, cfg=cfg)
    assert remote["runtime"] == "ray" and remote["rows"] == N
    assert _predictions(tmp_path / "ray") == _predictions(tmp_path / "local")
    assert remote["retrieval_calls_per_question"] == local["retrieval_calls_per_question"] == 1


def test_separate_retrieval_and_scorer_pools_give_the_in_process_rows(
    data_dir, tmp_path_factory, tmp_path, caplog, local_ray
):
    """PAIRS (retrieval on two paths, AIS embeddings, generation) with the index in a retrieval pool and
    the embedder in a scorer pool: the engine actor holds only the generator. The test encoder
    (`embedding.model=hash`): what is checked is where each call runs, and loading MiniLM in the three pool
    processes cost ~20 CPU-s (the Ray build tests load it in Ray workers)."""
    import logging

    caplog.set_level(logging.INFO, logger="pipeline.runtime.ray_runner")
    index = build_hotpot_index(data_dir, tmp_path_factory, 20, encoder="hash")
    cfg = _cfg(tmp_path_factory, "transformers")
    cfg.embedding.model = "hash"
    cfg.method.params = {"k": 2, "n": 3}
    dataset = str(data_dir / HOTPOT)
    local = run_answer(dataset, str(tmp_path / "local"), index=str(index), method="pairs", limit=N, cfg=cfg)
    cfg.runtime.mode = "ray"
    cfg.ray.retrieval_actors, cfg.ray.retrieval_actor_num_cpus = 2, 0.5
    cfg.ray.scorer_actors, cfg.ray.scorer_actor_num_cpus = 1, 0.5
    remote = run_answer(dataset, str(tmp_path / "ray"), index=str(index), method="pairs", limit=N, cfg=cfg)
    assert remote["runtime"] == "ray" and remote["rows"] == N
    rows = {
        kind: pl.read_parquet(f"{tmp_path / kind}/parts/*.parquet").sort("question_id") for kind in ("local", "ray")
    }
    assert _predictions(tmp_path / "ray") == _predictions(tmp_path / "local")
    for col in ("llm_calls", "retrieval_calls", "embedding_calls", "docs_in_prompt"):
        assert rows["ray"][col].to_list() == rows["local"][col].to_list(), col
    docs = {
        kind: [[(d["id"], d["path"], round(d["score"], 4)) for d in r] for r in df["retrieved"]]
        for kind, df in rows.items()
    }
    assert docs["ray"] == docs["local"]
    assert rows["local"]["retrieval_calls"].min() > 0 and rows["local"]["embedding_calls"].min() > 0
    assert remote["retrieval_calls_per_question"] == local["retrieval_calls_per_question"]
    # the pools did the work: every query was searched, every text embedded, by a pool actor
    served = {
        r.args[0]: r.args[1]
        for r in caplog.records
        if r.name == "pipeline.runtime.ray_runner" and r.msg.startswith("%s pool served")
    }
    assert set(served) == {"retrieval", "scorer"}, served
    assert set(served["retrieval"]) == {"search"} and set(served["scorer"]) == {"embed"}, served
    assert served["retrieval"]["search"][1] == rows["ray"]["retrieval_calls"].sum()
    assert served["scorer"]["embed"][1] == rows["ray"]["embedding_calls"].sum()


def test_the_simulated_gpu_bench_runs_the_ray_path_with_pools(local_ray):
    """`dynrag bench pipeline --simulate-gpu --runtime ray`'s run: several batches through one engine actor
    (two at once) and the retrieval and scorer pools, every question answered, the generator's busy time reported."""
    from jobs.bench.pipeline import DEFAULTS, RAY_DEFAULTS, bench_ray
    from pipeline.config import load_config

    cfg = load_config(None, [*DEFAULTS, *RAY_DEFAULTS, "answer.batch_questions=8", "ray.num_cpus=4"])
    got = bench_ray(cfg, "pairs", 40, 0.01)
    assert got["engine"] == "ray" and got["actors"] == 1
    assert got["questions_per_s"] > 0 and 0 < got["generator_busy"] <= 1
