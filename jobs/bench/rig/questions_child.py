"""One measured run of `dynrag bench questions`, in a process of its own so that the driver's figures (its CPU
time, its peak RSS) are that run's: `python -m jobs.bench.rig.questions_child SPEC.json` writes its figures as
JSON to the spec's `result` file.

It calls `run_answer` on the spec's questions (as `dynrag answer` would: the index opened, with Ray the local
Ray started, inside the timed call), reads what the run left on disk with pyarrow (never dynrag's reader),
then calls `run_answer` again on the same output and times that resume (every question skipped).

With Ray, the CPU time of the Ray processes (descendants of this one: gcs, raylet, workers) is sampled every
0.5 s by pid, each pid's last value kept (a process killed at the end counts up to its last sample), and
classified by its process title: `ray::...EngineActor...` (engine actors), `ray::PoolActor...` (retrieval and
scorer pools), other `ray::` workers (idle workers, Ray Data's read tasks and coordinator, the run's control
actor) and Ray's own services (gcs_server, raylet, dashboard, ...). The sampler's own CPU time is taken out
of the driver's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.5
# local mode: this process's JVM (BM25) gets a heap committed whole at its start (-Xms = -Xmx, pretouched), so that
# the driver's RSS over N shows what the driver holds, not the JVM taking its default heap (a quarter of the RAM)
# a little at a time; engine actors' JVMs (Ray) are their own processes
JVM_HEAP_MB = 512
SEARCH_LIMIT = 50_000  # questions `measure_search` searches, at most
SEARCH_CALL = 128  # queries a call in `measure_search` (a pool call of the bench serves ~130: 2 engine actors' batches)
KINDS = ("engine", "pool", "ray_workers", "ray_services")


RAY_SERVICES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's per-node agents, titled as workers are


def kind_of(title: str) -> str:
    """The kind of a Ray process from its title (Ray's workers set it: `ray::MapWorker(MapBatches(EngineActor))`,
    `ray::PoolActor.search`, `ray::IDLE`)."""
    if not title.startswith("ray::") or title.startswith(RAY_SERVICES):
        return "ray_services"
    if "EngineActor" in title:
        return "engine"
    if "PoolActor" in title:
        return "pool"
    return "ray_workers"


def short_title(title: str) -> str:
    """A process's name for the JSON: a Ray worker's title, else its program (a Python program's script)."""
    words = [w.rsplit("/", 1)[-1] for w in title.split()] or [""]
    if words[0].startswith("python") and len(words) > 1:
        words = [w for w in words[1:] if not w.startswith("-")] or words
    return words[0][:60]


class RayCpu:
    """CPU seconds (user + system) of this process's descendants, sampled from a thread until `stop()`, and this
    process's peak private memory (RSS less its shared pages: through Ray, the object store's pages the driver
    has read count in its RSS, shared with Ray's processes)."""

    def __init__(self, interval: float = SAMPLE_S):
        self.interval = interval
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds at its last sample)
        self.titles: dict[str, set[str]] = {}  # kind -> the process titles seen (their first word)
        self.own_s = 0.0  # the sampling thread's own CPU time
        self.private_peak = 0  # bytes: this process's RSS less its shared pages, the highest sampled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-ray-cpu", daemon=True)

    def sample(self) -> None:
        import psutil

        me = psutil.Process().memory_info()
        self.private_peak = max(self.private_peak, me.rss - me.shared)
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                with p.oneshot():
                    title = " ".join(p.cmdline()) or p.name()
                    t = p.cpu_times()
            except psutil.Error:
                continue
            kind = kind_of(title)
            old = self.seen.get(p.pid)
            if old is not None and old[0] in ("engine", "pool"):
                kind = old[0]  # an actor's worker keeps its kind (its title may change as it exits)
            self.seen[p.pid] = (kind, t.user + t.system)
            self.titles.setdefault(kind, set()).add(short_title(title))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
        self.sample()
        self.own_s = time.thread_time()

    def start(self) -> RayCpu:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        out: dict[str, Any] = {f"{k}_cpu_s": 0.0 for k in KINDS} | {f"{k}_processes": 0 for k in KINDS}
        for kind, seconds in self.seen.values():
            out[f"{kind}_cpu_s"] += seconds
            out[f"{kind}_processes"] += 1
        each = sorted(round(seconds, 2) for kind, seconds in self.seen.values() if kind == "engine")
        titles = {k: sorted(v) for k, v in sorted(self.titles.items())}
        return out | {"engine_cpu_s_each": each, "ray_titles": titles, "driver_peak_private_bytes": self.private_peak}


def files_on_disk(out: str) -> dict[str, int]:
    """Parquet files and every other file under `out`, each counted and their bytes summed."""
    fig = {"parquet_files": 0, "parquet_bytes": 0, "other_files": 0, "other_bytes": 0}
    for folder, _, names in os.walk(out):
        for name in names:
            kind = "parquet" if name.endswith(".parquet") else "other"
            fig[f"{kind}_files"] += 1
            fig[f"{kind}_bytes"] += os.path.getsize(os.path.join(folder, name))
    return fig


def rows_on_disk(out: str) -> dict[str, Any]:
    """Rows and error rows of `out/parts` as pyarrow counts them, and the newest row's `finished_at`."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    ds = pads.dataset(str(Path(out) / "parts"), format="parquet")
    last = pc.max(ds.to_table(columns=["finished_at"])["finished_at"]).as_py()
    return {
        "rows": ds.count_rows(),
        "error_rows": ds.count_rows(filter=pc.field("error").is_valid()),
        "last_finished_at": last,
        "distinct_ids": pc.count_distinct(ds.to_table(columns=["question_id"])["question_id"]).as_py(),
    }


@contextlib.contextmanager
def simulated_gpu(runtime: str, kv_tokens: int):
    """Generation on the latency model (jobs/bench/rig/simulated.py at time scale 1) instead of a model: in this
    process (local) its generator replaces `make_generator`'s; with Ray, `answer_with_ray` is given a
    `make_backends` (what `bench pipeline --runtime ray` passes) that puts it in each engine actor's backends."""
    from unittest import mock

    import pipeline.backends as backends_module
    import pipeline.runtime.ray_runner as ray_runner
    from jobs.bench.rig.simulated import SimulatedGpu

    sim = SimulatedGpu(kv_tokens=kv_tokens)
    patch: Any
    if runtime == "ray":
        patch = mock.patch.object(
            ray_runner, "answer_with_ray", functools.partial(ray_runner.answer_with_ray, make_backends=sim)
        )
    else:
        patch = mock.patch.object(backends_module, "make_generator", lambda cfg, one_call=False: sim.generator(cfg))
    with patch:
        yield


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(spec: dict) -> dict[str, Any]:
    from pipeline.config import DynragConfig
    from pipeline.runtime.answer import run_answer

    cfg = DynragConfig.model_validate(spec["config"])
    n, out, ray = spec["n"], spec["out"], spec["runtime"] == "ray"
    if not ray:
        from platform_shims.java import bound_jvm_memory, ensure_java

        ensure_java()
        bound_jvm_memory(JVM_HEAP_MB, c1_only=False)

    def answer() -> dict:
        return run_answer(spec["dataset"], out, index=spec["index"], cfg=cfg, dataset_format="qa", progress=False)

    sim = simulated_gpu(spec["runtime"], spec["kv_tokens"]) if spec["simulate_gpu"] else contextlib.nullcontext()
    with sim:
        sampler = RayCpu().start()  # (in-process: no Ray processes, the driver's private memory only)
        cpu0, t0 = _cpu_s(), time.perf_counter()
        summary = answer()
        returned_at, wall = time.time(), time.perf_counter() - t0
        cpu = _cpu_s() - cpu0
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        workers = sampler.stop()
        cpu -= sampler.own_s
        if not ray:  # its figures are the driver's own
            workers = {"driver_peak_private_bytes": workers["driver_peak_private_bytes"]}
        disk, rows = files_on_disk(out), rows_on_disk(out)
        t1 = time.perf_counter()
        resumed = answer()
        resume_s = time.perf_counter() - t1
    return {
        "n": n,
        "runtime": spec["runtime"],
        "wall_s": round(wall, 3),
        "questions_per_s": round(n / wall, 1),
        "driver_cpu_s": round(cpu, 3),
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in workers.items()},
        "driver_peak_rss_bytes": peak_kb * 1024,
        "last_answer_to_return_s": round(returned_at - rows.pop("last_finished_at"), 3),
        "resume_s": round(resume_s, 3),
        "resume_skipped": resumed["skipped_already_answered"],
        "resume_rows_after": rows_on_disk(out)["rows"],
        **disk,
        **rows,
        "summary_rows": summary["rows"],
        "summary_errors": summary["errors"],
        "summary_error_examples": summary["error_examples"],
    }


def measure_search(spec: dict) -> dict[str, Any]:
    """The same searches in this process alone (Backends.search of the first SEARCH_LIMIT questions, in calls of SEARCH_CALL
    queries, after one call to warm up), for the retrieval pool's CPU per query to be read against."""
    from pipeline.backends import Backends
    from pipeline.config import DynragConfig
    from platform_shims.java import bound_jvm_memory, ensure_java

    cfg = DynragConfig.model_validate(spec["config"])
    ensure_java()
    bound_jvm_memory(JVM_HEAP_MB, c1_only=False)
    with open(spec["dataset"], encoding="utf-8") as f:
        queries = [json.loads(line)["question"] for line in itertools.islice(f, SEARCH_LIMIT)]
    backends = Backends(cfg, spec["index"])
    try:
        k, retriever = cfg.retrieval.k, cfg.retrieval.retriever
        backends.search(queries[:SEARCH_CALL], k, retriever)
        cpu0 = _cpu_s()
        for i in range(0, len(queries), SEARCH_CALL):
            backends.search(queries[i : i + SEARCH_CALL], k, retriever)
        return {"n": len(queries), "search_cpu_s": round(_cpu_s() - cpu0, 3), "call": SEARCH_CALL}
    finally:
        backends.close()


if __name__ == "__main__":
    from jobs.cli import setup_logging

    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    setup_logging(spec.get("log_level", "WARNING"))
    result = measure_search(spec) if spec["runtime"] == "search" else measure(spec)
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
