"""End to end on a real packaged model (smollm2-135m-instruct, prepared by `dynrag models prepare`): 15 HotpotQA
dev questions with no-retrieval and sr-rag through vLLM. A process of its own: closing this second vLLM engine
tears down vLLM's process-wide parallel state, which the session's tiny engine (tests/conftest.py) then lacks
("pipeline model parallel group is not initialized")."""

from __future__ import annotations

import pytest
from engine_fixtures import HOTPOT, build_hotpot_index, check_rows

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.runtime.answer import run_answer

pytestmark = pytest.mark.own_process  # its own vLLM engine (see above; scripts/run_tests.py)

N = 15


@pytest.fixture(scope="module")
def hotpot_index(data_dir, tmp_path_factory):
    return build_hotpot_index(data_dir, tmp_path_factory, N)


@pytest.mark.slow  # a second vLLM engine plus 30 real generations: about 2.5 min on 2 shared cores
def test_real_packaged_model(data_dir, hotpot_index, cache_dir, tmp_path):
    from pipeline.assets.models import is_prepared

    if not is_prepared("smollm2-135m-instruct", cache_dir):
        pytest.skip("smollm2-135m-instruct is not prepared (dynrag models prepare smollm2-135m-instruct)")
    from pipeline.backends.vllm_gen import VllmGenerator

    cfg = DynragConfig()
    cfg.generation.kv_cache_gib = 1
    cfg.answer.progress = False
    gen = VllmGenerator(cfg)
    try:
        backends = Backends(cfg, str(hotpot_index), generator=gen)
        results = {}
        for method, retrieves in (("no-retrieval", False), ("sr-rag", True)):
            out = tmp_path / method
            results[method] = run_answer(
                str(data_dir / HOTPOT),
                str(out),
                index=str(hotpot_index),
                method=method,
                limit=N,
                cfg=cfg,
                backends=backends,
            )
            check_rows(out, method, data_dir, retrieves)
    finally:
        gen.close()
    # a real model reads the retrieved paragraphs: it should not do worse with them than without
    assert results["sr-rag"]["f1"] >= results["no-retrieval"]["f1"]
    assert results["sr-rag"]["f1"] > 0
