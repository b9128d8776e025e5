"""Whole `answer_with_ray` jobs on a `ray.cluster_utils.Cluster` (latency-model backends, jobs/bench/rig/simulated.py):
what the Ray tests of cluster shapes and lost nodes share."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from on_disk import assert_each_question_once  # noqa: F401  (the Ray tests' exactly-once check, on disk)

from pipeline.config import load_config
from platform_shims.raytools import shutdown_ray


@contextmanager
def fake_gpu_cluster(workers: int, **node) -> Iterator:
    """A Ray cluster of a head with no CPUs or GPUs (as Ray advises for large clusters) and `workers` nodes of
    `node` (add_node's num_cpus, num_gpus) each; this process is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="dynrag-gpu-", dir="/tmp")  # short: Ray's socket paths live below it
    Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray").mkdir(exist_ok=True)
    # no dashboard: nothing here uses the Jobs or state API (scripts/rayjob_local.py starts its own), and it cost
    # ~4.5 CPU-s a cluster on 2 cores
    head = {"num_cpus": 0, "num_gpus": 0, "temp_dir": temp, "include_dashboard": False}
    c = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(workers):
        c.add_node(**node)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    try:
        yield c
    finally:
        _let_streams_end(10.0)  # a reader blocked on a failed job's stream for 10 s stays blocked: 30 s waited in vain
        shutdown_ray()
        c.shutdown()


def _let_streams_end(timeout_s: float) -> None:
    """Wait for a job's stream threads (the supervisor's reader, Ray Data's executor) to end before Ray shuts
    down under them: a job that failed may leave them ending for a few seconds."""
    import threading

    deadline = time.monotonic() + timeout_s
    for t in threading.enumerate():
        if t.name == "dynrag-stream" or t.name.startswith("StreamingExecutor"):
            t.join(max(0.0, deadline - time.monotonic()))


def run_job(
    cluster,
    tmp_path,
    n: int,
    overrides: list[str],
    on_report=None,
    scale: float = 0.02,
    make_backends=None,
    dataset: Path | None = None,
    out: str | None = None,
) -> list[dict]:
    """`answer_with_ray` of n questions on `cluster` (SimBackends(scale) unless `make_backends`; the questions
        of `dataset`, else n generated ones) into `out` (default tmp_path/out), committed as run_answer's driver
    commits; each batch's report (also given to `on_report`)."""
    import json

    from jobs.bench.rig.simulated import SimBackends
    from pipeline.io.commit import committing
    from pipeline.io.output_lock import output_lock
    from pipeline.runtime.ray_runner import answer_with_ray

    cfg = load_config(
        overrides=[
            "runtime.mode=ray",
            f"runtime.ray_address={cluster.address}",
            "method.name=sr-rag",
            "dataset.format=generic",
            "answer.batch_questions=10",
            *overrides,
        ]
    )
    out = out or str(tmp_path / "out")
    if dataset is None:
        dataset = tmp_path / "questions.jsonl"
        dataset.write_text(
            "".join(json.dumps({"id": f"q{i}", "question": f"Who wrote book {i}?"}) + "\n" for i in range(n))
        )
    row_args = dict(run_id="t", method="sr-rag", params_json="{}", chash="t", model="simulated")
    reports = []
    with output_lock(out), committing(out, row_args["run_id"]) as committer:  # the driver's commit, as run_answer's
        committer.open()
        runner = answer_with_ray(
            str(dataset),
            out,
            cfg,
            "simulated",
            row_args,
            header=None,
            done=set(),
            limit=n,
            make_backends=make_backends or SimBackends(scale),
        )
        for report in committer.each(runner):
            reports.append(report)
            if on_report is not None:
                on_report(report)
    return reports


def live_groups() -> list[dict]:
    from ray.util import placement_group_table

    return [g for g in placement_group_table().values() if g["state"] != "REMOVED"]


def dying_backends(scale: float, markers: Path, deaths: int):
    """SimBackends whose generator's engine dies (EngineDead, as vLLM's dead engine core answers) at the 3rd
    prompt of a process, `deaths` times across the job's processes (counted by marker files under `markers`).
    Defined here, not at module level, so that Ray pickles it by value into its workers."""
    from concurrent.futures import Future
    from dataclasses import dataclass

    from jobs.bench.rig.simulated import SimBackends
    from pipeline.errors import EngineDead

    @dataclass(frozen=True)
    class DyingBackends(SimBackends):
        def __call__(self, cfg, index_dir=None, **kw):
            backends = super().__call__(cfg, index_dir, **kw)
            generator, submitted = backends._generator, []

            def submit(prompt, sampling, chat) -> Future:
                submitted.append(prompt)
                if len(submitted) == 3 and len(list(markers.glob("death-*"))) < deaths:
                    (markers / f"death-{os.getpid()}").write_text("")
                    fut: Future = Future()
                    fut.set_exception(EngineDead("the engine core died"))
                    return fut
                return type(generator).submit(generator, prompt, sampling, chat)

            generator.submit = submit
            return backends

    markers.mkdir(parents=True, exist_ok=True)
    return DyingBackends(scale)
