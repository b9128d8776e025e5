"""A driver SIGKILLed while its vLLM engine starts or runs: the engine's processes (spawned children
that never check on their parent) are ended by the OrphanGuard, armed before they exist, so they do
not keep their memory (GPU memory on a cluster) for the rerun to trip over."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from fault_tools import ROOT, VLLM_PROCESSES, wait_gone

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

DRIVER = textwrap.dedent("""
    import sys, time
    from pipeline.config import DynragConfig
    from pipeline.backends.vllm_gen import VllmGenerator

    if __name__ == "__main__":
        cfg = DynragConfig()
        cfg.generation.model, cfg.generation.kv_cache_gib, cfg.generation.max_model_len = sys.argv[1], 1, 4096
        gen = VllmGenerator(cfg)
        print("engine ready", flush=True)
        time.sleep(600)
""")


def engine_started(driver: psutil.Process) -> bool:
    """vLLM's engine core process exists (spawned through multiprocessing)."""
    for p in driver.children(recursive=True):
        try:
            if "multiprocessing" in " ".join(p.cmdline()):
                return True
        except psutil.Error:
            pass
    return False


@pytest.mark.parametrize("when", ["during start-up", "after start-up"])
def test_vllm_engine_dies_with_a_sigkilled_driver(tmp_path, tmp_path_factory, when):
    pytest.importorskip("vllm")
    from engine_fixtures import tiny_model_path

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    log, children = open(tmp_path / "driver.log", "w"), []
    driver = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model_path(tmp_path_factory))],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **VLLM_PROCESSES},
    )
    try:
        proc = psutil.Process(driver.pid)
        deadline = time.monotonic() + 600
        while not (
            engine_started(proc)
            if when == "during start-up"
            else "engine ready" in (tmp_path / "driver.log").read_text()
        ):
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.2)
        if when == "during start-up":
            time.sleep(2)  # the engine core is loading the model (start-up takes 17 s or more here)
        children = proc.children(recursive=True)
        assert children
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        if when == "during start-up":
            assert "engine ready" not in (tmp_path / "driver.log").read_text()
        left = [p for p in children if not wait_gone(p.pid, 60)]
        assert not left, f"outlived their SIGKILLed driver: {[' '.join(p.cmdline())[:120] for p in left]}"
    finally:
        driver.kill()
        for p in children:  # nothing of this test is left, whatever happened
            with contextlib.suppress(psutil.Error):
                p.kill()
