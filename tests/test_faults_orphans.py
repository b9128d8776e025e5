"""A driver SIGKILLed while its vLLM engine runs: the engine core process (a spawned child that
never checks on its parent) is ended by the OrphanGuard, so it does not keep its memory (GPU memory
on a cluster) for the rerun to trip over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fault_tools import ROOT
from test_orphan_guard import gone, wait_gone

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

DRIVER = textwrap.dedent("""
    import sys, time
    from pipeline.config import DynragConfig
    from pipeline.backends.vllm_gen import VllmGenerator

    if __name__ == "__main__":
        cfg = DynragConfig()
        cfg.generation.model, cfg.generation.kv_cache_gib, cfg.generation.max_model_len = sys.argv[1], 1, 4096
        gen = VllmGenerator(cfg)
        print("engine pids:", *gen._guard.pids, flush=True)
        time.sleep(600)
""")


def test_vllm_engine_dies_with_a_sigkilled_driver(tmp_path, tmp_path_factory):
    pytest.importorskip("vllm")
    from engine_fixtures import tiny_model_path

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, str(script), str(tiny_model_path(tmp_path_factory))], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = next(x for x in driver.stdout if x.startswith("engine pids:"))  # vLLM logs to stdout too
        pids = [int(p) for p in line.split(":")[1].split()]
        assert pids, "no engine process was started"
        assert not any(gone(p) for p in pids)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert all(wait_gone(p, 30) for p in pids), "vLLM's engine outlived its SIGKILLed driver"
    finally:
        driver.kill()
