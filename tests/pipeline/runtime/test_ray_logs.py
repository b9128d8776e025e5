"""Ray mode's terminal: a worker's dynrag lines show on the driver's terminal, tagged with the worker; its
library output (a third-party logger, a bare print to stderr, as vLLM, torch and the JVM write) goes to the
run's log file, as in-process (jobs/quiet.py)."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from jobs.quiet import divert_logs
from pipeline.runtime.ray_logs import MARK, route_worker_logs
from platform_shims.raytools import shutdown_ray

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)

ray = pytest.importorskip("ray")


def test_a_worker_batch_is_sorted_into_own_records_and_library_lines(caplog):
    caplog.set_level(logging.INFO)
    route_worker_logs(
        {
            "pid": 42,
            "ip": "10.0.0.2",
            "actor_name": "MapWorker(MapBatches(EngineActor))",
            "lines": [
                f"{MARK}WARNING pipeline.runtime.ray_runner: engine actor 42: SIGTERM, draining (up to 30 s)",
                "WARNING 11-26 23:00:01 [cpu.py:120] VLLM_CPU_KVCACHE_SPACE not set",
                f"not {MARK}INFO pipeline.x: a library line quoting a marker",
            ],
        }
    )
    own = [r for r in caplog.records if r.name == "pipeline.runtime.ray_runner"]
    assert len(own) == 1 and own[0].levelno == logging.WARNING
    assert own[0].getMessage() == (
        "(MapWorker(MapBatches(EngineActor)) pid=42, 10.0.0.2) engine actor 42: SIGTERM, draining (up to 30 s)"
    )
    library = [r.getMessage() for r in caplog.records if r.name == "ray_workers"]
    assert len(library) == 2 and "VLLM_CPU_KVCACHE_SPACE" in library[0] and "quoting" in library[1]


@ray.remote(num_cpus=0)
class Chatty:
    def __init__(self):
        from pipeline.runtime.ray_logs import own_worker_logging

        own_worker_logging()

    def speak(self, token: str) -> None:
        logging.getLogger("pipeline.runtime.test").warning("own line %s", token)
        logging.getLogger("pipeline.runtime.test").debug("own debug line %s", token)  # below INFO: not written
        logging.getLogger("vllm").warning("vllm noise %s", token)
        print(f"library noise {token}", file=sys.stderr, flush=True)


def test_worker_output_through_a_real_ray_splits_between_terminal_and_log_file(tmp_path, capfd, caplog):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from pipeline.runtime.ray_logs import route_ray_worker_output
    from platform_shims.raytools import init_ray

    started = init_ray(None, 1, log_to_driver=True)
    route_ray_worker_output()
    try:
        names = [name for name, _ in dispatcher.handlers]
        assert "ray_print_logs" not in names and names.count("dynrag_worker_logs") == 1
        path = tmp_path / "dynrag.log"
        with divert_logs(path, "INFO", announce=False):
            actor = Chatty.remote()
            ray.get(actor.speak.remote("t1"))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "library noise t1" not in path.read_text():
                time.sleep(0.2)
            time.sleep(1.0)  # the rest of the batch
        terminal, logged = capfd.readouterr().err, path.read_text()
        assert "own line t1" in terminal and "Chatty pid=" in terminal
        assert "library noise t1" not in terminal and "vllm noise t1" not in terminal
        assert "library noise t1" in logged and "vllm noise t1" in logged and "own line t1" in logged
        assert "own debug line" not in terminal + logged

        # the autoscaler's lines: its events shown (cluster progress), its status dumps not
        caplog.set_level(logging.INFO)
        status = ["======== Autoscaler status: 2026-11-26 ========", "Node status", " 1.0/2.0 CPU"]
        route_worker_logs({"pid": "autoscaler", "ip": "10.0.0.1", "lines": status})
        route_worker_logs({"pid": "autoscaler", "ip": "10.0.0.1", "lines": [":event_summary:Adding 1 node(s)."]})
        shown = [r.getMessage() for r in caplog.records if r.name.startswith(("pipeline", "ray_workers"))]
        assert shown[-1] == "autoscaler: Adding 1 node(s)." and not any(
            line.strip() in m for m in shown for line in status
        )
    finally:
        if started:
            shutdown_ray()
