"""The driver's ledger with Ray (issue 47, item 5): a resumed `runtime.mode=ray` run on s3:// (the session's
moto server) counts every row in its summary. The engine actors write the parts from their own processes,
so the driver's s3fs listing of parts/, cached when the run started, never shows them: the summary must
count the parts listed at start and those the actors report (`batch_report(..., part)`), not a listing."""

from __future__ import annotations

import pytest
from engine_fixtures import HOTPOT
from on_disk import assert_each_question_once

from pipeline.config import DynragConfig
from pipeline.runtime.answer import run_answer
from platform_shims.raytools import shutdown_ray

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)


@pytest.fixture
def ray_local(s3):
    """A local Ray started after `s3` set AWS_*: its workers reach the S3 server."""
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    shutdown_ray()


def test_resumed_ray_run_on_s3_counts_every_row(s3, ray_local, data_dir):
    fs, bucket = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:8]
    fs.pipe(f"{bucket}/q.jsonl", ("\n".join(lines) + "\n").encode())
    cfg = DynragConfig()
    cfg.runtime.mode = "ray"
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.batch_questions = 2
    cfg.ray.batch_questions = 2
    dataset, out = f"s3://{bucket}/q.jsonl", f"s3://{bucket}/run"
    assert run_answer(dataset, out, method="no-retrieval", limit=4, cfg=cfg)["rows"] == 4
    second = run_answer(dataset, out, method="no-retrieval", limit=8, cfg=cfg)
    assert (second["skipped_already_answered"], second["new_rows"]) == (4, 4)
    assert second["rows"] == 8
    assert_each_question_once(out, 8)  # as pyarrow counts parts/


def test_a_ray_run_pins_the_index_version_for_every_replica(data_dir, tmp_path_factory, tmp_path, monkeypatch):
    """The driver reads the index's CURRENT once and hands `<index>@vN` to the replicas (and the pools), so a
    version published mid-run is not mixed in; the run's rows and summary are the runner's as usual."""
    from engine_fixtures import build_hotpot_index

    from pipeline.runtime import ray_runner

    index = build_hotpot_index(data_dir, tmp_path_factory, n=5, encoder="hash")  # which encoder is not the point
    seen: list = []

    def runner(dataset, out, cfg, index_dir, row_args, **kw):
        seen.append(index_dir)
        yield from ()

    monkeypatch.setattr(ray_runner, "answer_with_ray", runner)
    cfg = DynragConfig()
    cfg.runtime.mode, cfg.generation.backend, cfg.answer.progress = "ray", "none", False
    cfg.embedding.model = "hash"
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:2]
    (tmp_path / "q.jsonl").write_text("\n".join(lines) + "\n")
    run_answer(str(tmp_path / "q.jsonl"), str(tmp_path / "out"), index=str(index), method="sr-rag", cfg=cfg)
    assert seen == [f"{index}@v000001"]
