"""No wait without a limit (issue 78, item 1): every blocking call on the answer and build paths has a limit.

This reads (ast) every .py file of pipeline/ and indexing/ and lists each call that blocks with no limit:
`ray.get(...)` or `ray.wait(...)` without `timeout=`, a future's `.result()` or `.exception()`, a thread's
`.join()`, an event's, condition's or process's `.wait()`, a condition's `.wait_for(pred)`, `cf.wait(fs)` and
`as_completed(fs)` (concurrent.futures), and a queue's blocking `.get()` or `.put(item)`, each without a timeout
argument. Each one
found must be in ALLOWED (by file, enclosing function and kind, so that it survives edits elsewhere in the file)
with the reason it cannot hang the job; a new one fails this test, naming file:line. An entry of ALLOWED that no
longer matches any call fails it too, so that the list stays short and true.

What it does not see: a wait inside a library (ActorPool.map, Ray Data's iterators), `await` of a Ray ref, an
executor's `shutdown(wait=True)`, a lock's `acquire()`, a subprocess's `communicate()`.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ("pipeline", "indexing", "platform_shims")

# (file, enclosing function's qualified name, kind) -> why it cannot hang the job
ALLOWED: dict[tuple[str, str, str], str] = {
    # -- queues that never block: unbounded (no maxsize), so a put returns at once --------------------------
    ("pipeline/engine/continuous.py", "Feed.send", ".put()"): "a SimpleQueue: put never blocks",
    ("pipeline/engine/continuous.py", "ContinuousEngine.close", ".put()"): "an unbounded lane queue: never blocks",
    ("pipeline/engine/continuous.py", "ContinuousEngine._outcomes", ".put()"): "the run's unbounded inbox",
    ("pipeline/engine/continuous.py", "ContinuousEngine._dispatch", ".put()"): "an unbounded lane queue",
    ("pipeline/engine/continuous.py", "ContinuousEngine._stream.finish", ".put()"): "the run's unbounded inbox",
    ("pipeline/engine/continuous.py", "ContinuousEngine._serve_lane", ".put()"): "the run's unbounded inbox",
    ("pipeline/runtime/runners.py", "RayRuns._serve", ".put()"): "each run's unbounded report queue",
    # -- a lane worker's idle wait: its thread ends with the None that close() puts (joined with a limit) ------
    ("pipeline/engine/continuous.py", "ContinuousEngine._serve_lane", ".get()"): (
        "a lane worker's wait for work; close() sends it None and joins it within LANE_JOIN_TIMEOUT_S"
    ),
    # -- futures whose own waits are bounded, or done -----------------------------------------------------
    ("pipeline/engine/streaming.py", "outcome", ".exception()"): (
        "a prompt's future, read once every prompt of its call is done (collect's callback)"
    ),
    ("pipeline/engine/streaming.py", "outcome", ".result()"): "the same future, done",
    ("pipeline/runtime/ray_runner.py", "EngineActor.__call__", ".result()"): (
        "this call's own _answer threads, whose every wait is bounded (RunControl calls, turns, the batch's answers)"
    ),
    ("pipeline/evaluation/experiment.py", "concurrent_runs", ".result()"): (
        "an experiment's run (run_answer in a thread): its own waits are bounded (runners.py, replica.py)"
    ),
    # -- waits that are the point ---------------------------------------------------------------------------
    ("pipeline/runtime/ray_runner.py", "EngineActor._park", ".wait()"): (
        "a parked call holds its batch until its process exits (_on_ended: _exit_once_committed ends it within "
        "2 x COMMIT_WAIT_S, or the driver kills the actor); returning would hand Ray Data a result it must not get"
    ),
    ("pipeline/backends/orphan_guard.py", "OrphanGuard.close", ".wait()"): (
        "reaps the watchdog process just sent SIGKILL (kill() then wait(): it cannot outlive the signal)"
    ),
}


def _timeout(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "timeout":
            return None if isinstance(kw.value, ast.Constant) and kw.value.value is None else kw.value
    return None


def _kind(call: ast.Call) -> str | None:
    """The kind of blocking call with no limit that `call` is, or None."""
    f = call.func
    if any(kw.arg is None for kw in call.keywords):  # (**kwargs: not judged)
        return None
    npos, limited = len(call.args), _timeout(call) is not None
    if isinstance(f, ast.Name):  # from concurrent.futures import as_completed
        return "as_completed" if f.id == "as_completed" and npos < 2 and not limited else None
    if not isinstance(f, ast.Attribute):
        return None
    name, base = f.attr, f.value
    if isinstance(base, ast.Name) and base.id == "ray":
        return f"ray.{name}" if name in ("get", "wait") and not limited else None
    if name == "wait" and (
        (isinstance(base, ast.Name) and base.id in ("cf", "futures"))
        or (isinstance(base, ast.Attribute) and base.attr == "futures")
    ):
        return "cf.wait" if npos < 2 and not limited else None  # wait(fs, timeout=None, return_when=...)
    if name == "as_completed":
        return "as_completed" if npos < 2 and not limited else None
    if name in ("result", "exception", "join", "wait"):
        return f".{name}()" if npos == 0 and not limited else None  # "x".join(parts) has an argument
    if name == "wait_for":
        return ".wait_for()" if npos < 2 and not limited else None
    keywords = {kw.arg for kw in call.keywords}
    if name == "get" and keywords <= {"block", "timeout"}:  # dict.get(key) has an argument
        block = call.args[0] if npos else next((k.value for k in call.keywords if k.arg == "block"), None)
        blocking = block is None or (isinstance(block, ast.Constant) and block.value is True)
        return ".get()" if npos <= 1 and blocking and not limited else None
    if name == "put" and keywords <= {"block", "timeout"} and npos >= 1:  # Feed.put(qs, source=...) is no queue
        block = call.args[1] if npos >= 2 else next((k.value for k in call.keywords if k.arg == "block"), None)
        blocking = block is None or (isinstance(block, ast.Constant) and block.value is True)
        return ".put()" if npos <= 2 and blocking and not limited else None
    return None


def unbounded_calls() -> list[tuple[str, int, str, str]]:
    """(file, line, enclosing function, kind) of every blocking call without a limit under TREES."""
    found = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            module = ast.parse(path.read_text(encoding="utf-8"), rel)

            def visit(node: ast.AST, scope: list[str], rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    inner = scope
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        inner = [*scope, child.name]
                    if isinstance(child, ast.Call) and (kind := _kind(child)):
                        found.append((rel, child.lineno, ".".join(scope) or "<module>", kind))
                    visit(child, inner)

            visit(module, [])
    return sorted(found)


def test_every_blocking_call_has_a_limit_or_a_reason():
    new = [
        f"{rel}:{line}: {kind} in {fn} has no limit"
        for rel, line, fn, kind in unbounded_calls()
        if (rel, fn, kind) not in ALLOWED
    ]
    assert not new, (
        "blocking calls without a limit (give each a timeout derived from ray.replica_wait_s or ray.stall_s that "
        "ends the job with one line, or add it to ALLOWED with the reason it cannot hang):\n" + "\n".join(new)
    )


def test_the_allow_list_names_only_calls_that_exist():
    seen = {(rel, fn, kind) for rel, _, fn, kind in unbounded_calls()}
    stale = [f"{k}: {why}" for k, why in ALLOWED.items() if k not in seen]
    assert not stale, "ALLOWED entries that match no call any more (remove them):\n" + "\n".join(stale)


def test_the_scan_finds_each_kind_of_unbounded_wait():
    """The guard itself: each kind it looks for is found, and the limited forms are not."""
    src = """
import ray, queue, concurrent.futures as cf
def f(ref, q, fut, t, ev, cond, refs):
    ray.get(ref); ray.wait(refs); fut.result(); fut.exception(); t.join(); ev.wait(); cond.wait_for(p)
    cf.wait(refs); q.get(); q.get(True); q.put(1); q.put(1, True); as_completed(refs); cf.as_completed(refs)
    ray.get(ref, timeout=1); ray.wait(refs, timeout=1); fut.result(1); t.join(2); ev.wait(1); cond.wait_for(p, 1)
    cf.wait(refs, 5); cf.wait(refs, timeout=5); as_completed(refs, 3); q.get(timeout=1); q.get(False); q.put(1, False); q.put(1, timeout=2)
    ",".join(refs); d.get("k"); feed.put(refs, source=1); ray.get(ref, timeout=None)
"""
    kinds = [k for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Call) and (k := _kind(node))]
    assert sorted(kinds) == sorted(
        ["ray.get", "ray.wait", ".result()", ".exception()", ".join()", ".wait()", ".wait_for()", "cf.wait"]
        + [".get()", ".get()", ".put()", ".put()", "ray.get", "as_completed", "as_completed"]
    )


# ---- running past a limit ends the job with one line ----------------------------------------------------------


class _NeverAnswers:
    """A streaming generator whose prompts never finish (a hung vLLM call)."""

    def __new__(cls):
        from concurrent.futures import Future

        from jobs.bench.rig.simulated import SimGenerator

        class Hung(SimGenerator):
            def submit(self, prompt, sampling, chat) -> Future:
                return Future()  # never resolved

        return Hung()


@pytest.mark.timeout(90)  # without its limit the job waits for ever
def test_an_in_process_engine_that_never_answers_ends_the_job_with_one_line():
    """In-process (LocalRunner), a batch waits for its answers for as long as the engine makes progress: a hung
    engine (no answer, no call) ends the job after ray.stall_s with one line naming the wait, where and how long."""
    from pipeline.backends import Backends
    from pipeline.config import DynragConfig
    from pipeline.engine.drain import Drain
    from pipeline.engine.requests import Question
    from pipeline.methods.registry import get_method
    from pipeline.runtime.runners import Batches, LocalRunner
    from pipeline.runtime.waits import WaitExpired

    cfg = DynragConfig()
    cfg.method.name, cfg.answer.batch_questions, cfg.ray.stall_s = "no-retrieval", 3, 2.0
    spec = get_method("no-retrieval")
    row_args = dict(run_id="r1", method="no-retrieval", params_json="{}", chash="h", model="m")
    qs = [Question(f"q{i}", f"question {i}") for i in range(3)]
    job = Batches(
        "dataset", "memory://bounded-waits", None, qs, {"skipped": 0}, cfg, spec, spec.params({}, cfg), row_args,
        None, set(), None,
    )  # fmt: skip
    backends = Backends(cfg, None, generator=_NeverAnswers())
    with pytest.raises(WaitExpired) as ended:
        list(LocalRunner().answer(job, backends=backends, drain=Drain(30)))
    line = str(ended.value)
    assert re.fullmatch(
        r"pid \d+ on \S+: waited [\d.]+ s for the answers of a batch of 3 questions from this replica's engine with no "
        r"progress \(ray\.stall_s=2\); stopping",
        line,
    ), line


@pytest.mark.timeout(60)
def test_a_batch_waiting_for_its_turn_behind_a_stuck_batch_ends_with_one_line():
    """A Ray engine actor's batch waits for its turn (Turns) while the replica makes progress; behind a batch that
    makes none for ray.stall_s it ends with one line (the batch's report is then the job's fatal line)."""
    from pipeline.runtime.ray_runner import Turns
    from pipeline.runtime.waits import WaitExpired

    turns, release = Turns(lambda: 0, stall_s=1.0), threading.Event()
    inside = threading.Event()

    def stuck() -> None:
        with turns.alone():
            inside.set()
            release.wait(60)

    threading.Thread(target=stuck, daemon=True).start()
    assert inside.wait(30)
    try:
        with pytest.raises(WaitExpired, match=r"waited [\d.]+ s for a batch's turn to answer behind a batch answering "
                           r"alone with no progress \(ray\.stall_s=1\); stopping"):  # fmt: skip
            with turns.shared():
                pass
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_a_batch_behind_one_that_makes_progress_waits_past_the_limit_for_its_turn():
    """The turn's limit counts time without progress, not time: behind a long batch that makes progress, a batch
    waits longer than ray.stall_s and then answers."""
    from pipeline.runtime.ray_runner import Turns

    ticks = iter(range(10**9))
    turns, inside, looked = Turns(lambda: next(ticks), stall_s=0.5), threading.Event(), threading.Event()

    def long_batch() -> None:
        with turns.alone():
            inside.set()
            looked.wait(60)

    threading.Thread(target=long_batch, daemon=True).start()
    assert inside.wait(30)
    threading.Timer(3.0, looked.set).start()  # six limits later
    with turns.shared():  # no WaitExpired: the replica made progress all along
        pass
    assert looked.is_set()


def _in_queue_put(thread: threading.Thread) -> bool:
    """Whether `thread` is inside queue.Queue.put now (blocked handing an item over)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "put" and frame.f_code.co_filename.endswith("queue.py"):
            return True
        frame = frame.f_back
    return False


@pytest.mark.timeout(60)
def test_the_stream_reader_ends_once_the_driver_stops_reading():
    """The driver stops reading the stream (a drain, a fatal report): its reader thread, blocked handing over the
    next item, ends once the supervisor stops, instead of waiting for ever (and touching Ray after shutdown)."""
    from pipeline.runtime.ray_runner import Supervisor

    sup = Supervisor.__new__(Supervisor)  # its watching() alone: no supervisor thread, no RunControl
    sup.line, sup.reader, sup._done = None, None, threading.Event()
    second, read = threading.Event(), []

    def stream():
        for i in range(1000):
            read.append(i)
            if i == 2:
                second.set()  # item 1 is handed over (in the queue): item 2 cannot be, until the driver reads
            yield i

    got = sup.watching(stream())
    assert next(got) == 0  # then the driver reads no more
    assert sup.reader is not None and second.wait(30)
    deadline = time.monotonic() + 30
    while not _in_queue_put(sup.reader):  # the reader waits to hand item 2 over
        assert time.monotonic() < deadline and sup.reader.is_alive()
        time.sleep(0.01)
    sup._done.set()  # what stop() does first
    sup.reader.join(30)
    assert not sup.reader.is_alive(), "the stream's reader is still blocked on the hand-off queue"
    assert len(read) <= 4  # nothing more read from the stream: the item taken, the one held, the one it was handing


@pytest.mark.timeout(60)
def test_a_runs_reports_end_with_one_line_when_the_ray_jobs_thread_ended_without_a_word():
    import queue

    from pipeline.config import DynragConfig
    from pipeline.errors import DynragError
    from pipeline.runtime.runners import RayRuns

    runs = RayRuns(1, DynragConfig())
    runs._handed, runs._gone = [0], [False]  # as answer() registers the run
    runs._thread = threading.Thread(target=lambda: None)
    runs._thread.start()
    runs._thread.join()
    with pytest.raises(DynragError, match="the experiment's Ray job ended without a word for this run"):
        list(runs._reports(0, queue.Queue()))


@pytest.mark.timeout(120)  # without its limit the call waits for ever
def test_an_engine_actor_whose_run_control_does_not_answer_ends_the_job_with_one_line(monkeypatch):
    """An engine actor (built without Ray over an in-process RunControl, as tests/test_batch_failure.py does)
    whose call to RunControl.begin never answers (the driver gone or wedged): the call waits ray.stall_s, then the
    batch's report is the job's fatal line (answer_runs_with_ray raises it) naming the call, where and how long."""
    from types import SimpleNamespace

    import ray

    from jobs.bench.rig.simulated import Cost, SimGenerator
    from pipeline.backends import Backends
    from pipeline.config import DynragConfig
    from pipeline.engine.requests import Question
    from pipeline.runtime.ray_control import RunControl
    from pipeline.runtime.ray_runner import EngineActor

    class NoAnswer:
        """The ref of a call that never answers."""

    def get(value, timeout=None):  # ray.get over in-process values; a NoAnswer blocks as Ray's would
        if isinstance(value, NoAnswer):
            if timeout is None:
                threading.Event().wait()
            raise ray.exceptions.GetTimeoutError("Get timed out")
        return value

    monkeypatch.setattr(ray, "get", get)
    control = RunControl()

    class Handle:  # RunControl's handle: every call answered in-process but begin
        def __getattr__(self, name: str):
            call = (lambda *args: NoAnswer()) if name == "begin" else getattr(control, name)
            return SimpleNamespace(remote=call)

    cfg = DynragConfig()
    cfg.method.name, cfg.ray.stall_s = "no-retrieval", 7.0
    row_args = dict(run_id="r1", method="no-retrieval", params_json="{}", chash="h", model="m")
    run = {"out": "memory://bounded-actor", "method": "no-retrieval", "row_args": row_args, "header": None}

    def backends(cfg, index_dir=None, **kw):
        return Backends(cfg, index_dir, generator=SimGenerator(Cost(0.02)), **kw)

    engine = EngineActor(cfg.model_dump(mode="json"), None, [run], None, Handle(), make_backends=backends)
    try:
        report = engine._answer(0, [Question("q1", "question one")], 0)
    finally:
        engine._ended.set()
        engine.replica.close()
    assert re.fullmatch(
        r"engine replica \w*: pid \d+ on \S+: waited 7 s for RunControl\.begin \(the driver's run control\) with no "
        r"answer \(ray\.stall_s=7\); stopping",
        report.get("fatal", ""),
    ), report
