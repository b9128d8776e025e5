"""A real local Ray cluster (`ray start --head` on loopback), an index build and an answer job submitted
with `dynrag submit` through the Ray Jobs API, their outputs checked; then the cluster is stopped.

The commands are those of cluster/README.md ("Try it on one machine"), with this test's own ports and
temp dir and the tiny random model instead of SmolLM2 (test_cluster_configs.py checks the guide's flags).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from engine_fixtures import HOTPOT, hotpot_subset, tiny_model_path
from on_disk import assert_each_question_once

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# the flags of the guide's `ray start` (ports and temp dir are added per test)
RAY_START = [
    "--head",
    "--node-ip-address=127.0.0.1",
    "--dashboard-host=127.0.0.1",
    "--include-dashboard=true",
    "--num-cpus=2",
    "--disable-usage-stats",
]
# loopback only; no token auth; no worker killing by Ray's memory monitor, which counts the memory of the
# whole (shared) machine and killed these jobs' workers for other users' processes
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}
N_CORPUS, N_ANSWER = 8, 4


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getsid(int(d.name)) == sid and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(d.name))
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                pass
    return pids


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own session; stopping it ends exactly the processes it started."""
    gcs, dash, client, agent, agent_grpc, nm, om, metrics, renv = _free_ports(9)
    temp = tempfile.mkdtemp(prefix="dynrag-ray-", dir="/tmp")  # short: Ray's socket paths live below it
    env = {**os.environ, **RAY_ENV, "PATH": f"{BIN}:{os.environ['PATH']}"}  # jobs run the venv's python
    cmd = [
        str(BIN / "ray"),
        "start",
        *RAY_START,
        f"--port={gcs}",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={renv}",
        f"--temp-dir={temp}",
        "--block",
    ]
    log = open(Path(temp) / "ray-start.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ray start failed: {(Path(temp) / 'ray-start.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(1)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)  # ray start --block shuts its processes down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        deadline = time.monotonic() + 30
        while (left := _session_pids(proc.pid)) and time.monotonic() < deadline:
            time.sleep(1)
        for pid in left:  # anything of this session still alive
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)
        log.close()
        assert not _session_pids(proc.pid), [
            Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in _session_pids(proc.pid)
        ]
        shutil.rmtree(temp, ignore_errors=True)


def _submit(address: str, tmp_path: Path, *command: str, overrides: list[str]) -> subprocess.CompletedProcess:
    args = [
        str(BIN / "dynrag"),
        "submit",
        "--address",
        address,
        "--config",
        "cluster/dynrag-local.yaml",
        *(f"--set={o}" for o in overrides),
        "--",
        *command,
    ]
    env = {**os.environ, **RAY_ENV}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # a Ray cluster start and two jobs: a few minutes on 2 shared cores
def test_submit_index_and_answer_jobs(ray_head, data_dir, tmp_path, tmp_path_factory):
    from indexing import open_index
    from indexing.versions.manifest import read_manifest
    from pipeline.config import load_config
    from pipeline.io.output import read_rows

    corpus = hotpot_subset(data_dir, tmp_path / "corpus.jsonl", N_CORPUS)
    index, out = tmp_path / "index", tmp_path / "sr-rag"
    tiny = [
        f"generation.model={tiny_model_path(tmp_path_factory)}",
        "generation.max_new_tokens=8",
        "index.shard_size=40",
        "ray.batch_questions=2",
    ]

    t = time.perf_counter()
    built = _submit(
        ray_head, tmp_path, "index", "build", str(corpus), "--format", "hotpotqa", "--index", str(index), overrides=tiny
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "SUCCEEDED" in built.stderr and "published version 1" in built.stdout  # the job's log, streamed
    build_s = time.perf_counter() - t
    manifest = read_manifest(index)
    assert manifest["passages"] > 40 and len(manifest["shards"]) >= 2
    assert manifest["build"]["passages_embedded"] == manifest["passages"]

    t = time.perf_counter()
    answered = _submit(
        ray_head,
        tmp_path,
        "answer",
        "--dataset",
        str(data_dir / HOTPOT),
        "--index",
        str(index),
        "--out",
        str(out),
        "--method",
        "sr-rag",
        "--limit",
        str(N_ANSWER),
        "--no-progress",
        overrides=[*tiny, "ray.retrieval_actors=2", "ray.retrieval_actor_num_cpus=0.25"],
    )
    assert answered.returncode == 0, answered.stdout[-3000:] + answered.stderr[-3000:]
    assert "2 retrieval actors ready" in answered.stdout  # the driver's log, streamed
    answer_s = time.perf_counter() - t
    assert_each_question_once(out, N_ANSWER)  # as pyarrow counts parts/
    rows = read_rows(str(out)).to_pylist()
    assert len(rows) == N_ANSWER and {r["question_id"] for r in rows} == {r["question_id"] for r in rows[:N_ANSWER]}
    assert all(r["error"] is None and r["retrieval_calls"] == 1 and r["llm_calls"] == 1 for r in rows)
    resolved = (out / "config.resolved.yaml").read_text()
    assert "mode: ray" in resolved and "ray_address: auto" in resolved
    cfg = load_config(str(REPO / "cluster/dynrag-local.yaml"))
    with open_index(
        index, cfg.index_settings()
    ) as idx:  # the retrieval actors returned what the built index returns, in order
        hits = idx.search([r["question"] for r in rows], k=cfg.retrieval.k, retriever=cfg.retrieval.retriever)
    assert [[d["id"] for d in r["retrieved"]] for r in rows] == [[h.id for h in hs] for hs in hits]
    print(f"index job {build_s:.1f}s, answer job {answer_s:.1f}s")


@pytest.mark.slow
def test_failed_job_reports_failure(ray_head, tmp_path):
    """A job whose command fails ends FAILED and `dynrag submit` exits non-zero with the job's error."""
    res = _submit(ray_head, tmp_path, "index", "info", "--index", str(tmp_path / "no-index"), overrides=[])
    assert res.returncode == 1
    assert "FAILED" in res.stderr and "no index at" in res.stdout + res.stderr
