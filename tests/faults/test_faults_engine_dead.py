"""vLLM's engine core killed mid-run (as a GPU fault or the OOM killer ends it): its EngineDeadError reaches
the engine as dynrag's EngineDead and ends the run, instead of becoming an error row for every question
that follows (through Ray, the engine actor then exits and is restarted: test_faults_ray_nodes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from fault_tools import ROOT, VLLM_PROCESSES

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

DRIVER = textwrap.dedent("""
    import os, signal, sys
    import psutil
    from pipeline.backends import Backends
    from pipeline.config import DynragConfig
    from pipeline.engine.continuous import make_engine
    from pipeline.engine.requests import Answer, Generate, Question, SamplingSpec
    from pipeline.errors import EngineDead

    def program(q, params):
        return Answer((yield Generate([q.question], SamplingSpec(max_tokens=16)))[0].text)

    if __name__ == "__main__":
        cfg = DynragConfig()
        cfg.generation.model, cfg.generation.kv_cache_gib, cfg.generation.max_model_len = sys.argv[1], 1, 1024
        cfg.generation.streaming = True
        engine = make_engine(cfg, Backends(cfg))
        questions = [Question(f"q{i}", f"question number {i} is about") for i in range(400)]
        answered = errors = 0
        try:
            for outcome in engine.stream(iter(questions), program, None):
                answered += 1
                errors += outcome.error is not None
                if answered == 5:  # the engine core: vLLM's spawned child, VLLM::EngineCore
                    for p in psutil.Process().children(recursive=True):
                        if "EngineCore" in " ".join(p.cmdline()):  # its process title
                            os.kill(p.pid, signal.SIGKILL)
            print(f"finished answered={answered} errors={errors}", flush=True)
        except EngineDead as err:
            print(f"engine dead answered={answered} errors={errors}: {err}", flush=True)
        os._exit(0)
""")


def test_a_killed_vllm_engine_core_ends_the_run_with_engine_dead(tmp_path, tmp_path_factory):
    pytest.importorskip("vllm")
    from engine_fixtures import tiny_model_path

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model_path(tmp_path_factory))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "PYTHONPATH": str(ROOT), **VLLM_PROCESSES},
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert last.startswith("engine dead") and "errors=0" in last, last
    assert "answered=400" not in last
