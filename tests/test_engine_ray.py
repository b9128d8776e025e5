"""The same small run through Ray Data on a local Ray instance gives the in-process predictions."""

from __future__ import annotations

import polars as pl
import pytest

from engine_fixtures import HOTPOT, build_hotpot_index, tiny_model_path
from pipeline.runtime.answer import run_answer
from pipeline.config import DynragConfig

N = 8


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


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.slow)])
def test_ray_matches_in_process(backend, data_dir, tmp_path_factory, tmp_path):
    index = build_hotpot_index(data_dir, tmp_path_factory, 20)
    cfg = _cfg(tmp_path_factory, backend)
    dataset = str(data_dir / HOTPOT)
    local = run_answer(dataset, str(tmp_path / "local"), index=str(index), method="sr-rag", limit=N, cfg=cfg)
    cfg.runtime.mode = "ray"
    remote = run_answer(dataset, str(tmp_path / "ray"), index=str(index), method="sr-rag", limit=N, cfg=cfg)
    assert remote["runtime"] == "ray" and remote["rows"] == N
    assert _predictions(tmp_path / "ray") == _predictions(tmp_path / "local")
    assert remote["retrieval_calls_per_question"] == local["retrieval_calls_per_question"] == 1
