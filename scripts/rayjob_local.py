"""The shipped RayJob, submitted the way KubeRay submits it, to a local multi-node Ray cluster; a worker pre-empted.

The cluster (ray.cluster_utils.Cluster, in this process): a head with 0 CPUs and a dashboard (the Jobs API), two
workers of 3 CPUs. The job: `cluster/kuberay/rayjob-answer.yaml`'s entrypoint and runtime env, verbatim except
for the URIs (the dataset, the index, the output, the config file's path) and, appended as `--set`, the model
and the sizes a 2-core machine needs. It is submitted through Ray's Jobs API (JobSubmissionClient), so
`dynrag answer` runs as Ray runs an entrypoint (RAY_ADDRESS set by Ray's job supervisor), and must use the
cluster's workers. Run once undisturbed, then again with Ray's pre-emption drain notice
(`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds 60`) sent to a worker
holding an engine replica once rows exist; the worker is removed once its replicas have exited (or at the
deadline) and a replacement added.
Prints JSON per run: the job's status, wall seconds, the rows, distinct questions and error rows that
pyarrow.dataset counts in the output's parts/ folder (no dedup), where each
replica answered (node, pid), and the drain's events. Exit 1 unless the disturbed job SUCCEEDED with every
question once and no error row.

    .venv/bin/python scripts/rayjob_local.py --limit 40 [--deadline 60] [--work DIR] [--skip-baseline]
        [--store s3://bucket/prefix] [--backend none]

`--store`: the dataset, the index and the outputs on an object store (an S3-compatible one: its endpoint and
keys from the AWS_* variables, which the cluster's processes inherit). `--backend none`: no model (the job's
shape without vLLM's start).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from ray_preemption import build_index  # noqa: E402

WORKER = {"num_cpus": 3}
SIZES = [  # what a 2-core machine needs in place of cluster/dynrag.yaml's GPU sizes
    "generation.model=smollm2-135m-instruct",
    "generation.dtype=float32",
    "generation.max_model_len=2048",
    "ray.actors=2",
    "ray.actor_num_cpus=2",
    "ray.retrieval_actors=2",
    "ray.retrieval_actor_num_cpus=1",
    "ray.retrieval_actor_resources={}",
    "ray.scorer_actors=0",
    "ray.batch_questions=5",
    "answer.max_in_flight=16",  # two cores batch no more usefully; the batches held follow (ray.actor_batches unset)
    "index.threads=1",
    "index.jvm_heap_mb=512",
]


def shipped_job(dataset: str, index: str, out: str, limit: int, extra: list[str] = ()) -> tuple[str, dict]:
    """rayjob-answer.yaml's entrypoint with local URIs and the sizes appended, and its runtime env."""
    spec = yaml.safe_load((ROOT / "cluster/kuberay/rayjob-answer.yaml").read_text())["spec"]
    words = shlex.split(spec["entrypoint"])
    swap = {
        "s3://BUCKET/datasets/hotpotqa/dev.jsonl": dataset,
        "s3://BUCKET/indexes/wiki": index,
        "s3://BUCKET/runs/hotpotqa-sr-rag": out,
        "/home/ray/dynrag/cluster/dynrag.yaml": str(ROOT / "cluster/dynrag.yaml"),
    }
    words = [swap.get(w, w) for w in words] + ["--limit", str(limit)]
    for kv in [*SIZES, *extra]:
        words += ["--set", kv]
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    runtime_env["env_vars"]["DYNRAG_CACHE"] = os.environ.get("DYNRAG_CACHE", str(Path.home() / ".cache/dynrag"))
    return shlex.join(words), runtime_env


def summary_rows(out: str) -> int:
    """The rows its summary.json counts (the driver's ledger of parts, this run's and those it resumed past)."""
    from pipeline.io.output import read_json

    return int((read_json(out, "summary.json") or {}).get("rows", 0))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored_rows(out: str) -> tuple[int, int, int]:
    """(rows, distinct questions, error rows) in `out`/parts/ (a folder or a URI) as pyarrow.dataset reads the
    folder: every row stored, no dynrag reader, no dedup."""
    import fsspec
    import pyarrow.dataset as pads
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, path = fsspec.core.url_to_fs(out)
    fs.invalidate_cache()  # s3fs caches listings: the job's actors and driver wrote these
    if not fs.exists(f"{path}/parts"):
        return 0, 0, 0
    folder = pads.dataset(f"{path}/parts", format="parquet", filesystem=PyFileSystem(FSSpecHandler(fs)))
    table = folder.to_table(columns=["question_id", "error"]).to_pydict()
    ids = table["question_id"]
    return len(ids), len(set(ids)), sum(e is not None for e in table["error"])


def replica_actors(dashboard: str) -> list[dict]:
    from ray.util.state import list_actors

    named = [("class_name", "=", "MapWorker(MapBatches(EngineActor))")]
    return [{"node": a.node_id, "pid": a.pid, "state": a.state} for a in list_actors(dashboard, filters=named)]


def drain_node(address: str, node_id: str, deadline_s: int) -> None:
    """`ray drain-node`, the command: Ray's pre-emption notice for `node_id` with its deadline."""
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "drain-node",
            "--address",
            address,
            "--node-id",
            node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "spot instance pre-empted",
            "--deadline-remaining-seconds",
            str(deadline_s),
        ],
        check=True,
        timeout=60,
    )


def stage_on_store(args, base: str) -> str:
    """The dataset's first `limit` lines copied under `base` on the object store, and the index built there
    (`dynrag index build ... --index s3://...`, as a user builds one)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(base)
    with open(args.data) as src, fs.open(f"{root}/questions.jsonl", "w") as dst:
        dst.writelines(line for _, line in zip(range(args.limit), src))
    index = f"{base}/index"
    build = ["index", "build", str(args.data), "--format", "hotpotqa", "--index", index, "--set", "index.dense=false"]
    subprocess.run([sys.executable, "-m", "jobs.cli", *build], cwd=ROOT, check=True)
    args.data = f"{base}/questions.jsonl"
    return index


def run(cluster, client, args, index, out: str, preempt: bool, limit: int | None = None) -> dict:
    from ray.job_submission import JobStatus

    extra = [f"generation.backend={args.backend}"] if args.backend else []
    entrypoint, runtime_env = shipped_job(str(args.data), str(index), str(out), limit or args.limit, extra)
    t0 = time.monotonic()
    for attempt in range(30):  # the head's job agent may not be up yet ("No available agent to submit job")
        try:
            job = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
            break
        except RuntimeError as err:
            if "No available agent" not in str(err) or attempt == 29:
                raise
            time.sleep(2.0)
    event: dict = {}
    replicas: dict[int, str] = {}
    while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(1.0)
        try:
            for a in replica_actors(args.dashboard):
                if a["state"] == "ALIVE":
                    replicas[a["pid"]] = a["node"]
        except Exception:
            pass
        if preempt and "notice_s" not in event and stored_rows(str(out))[0]:
            workers = {n.node_id: n for n in cluster.worker_nodes}
            held = [n for n in replicas.values() if n in workers]
            if held:
                victim = workers[held[0]]
                drain_node(cluster.address, victim.node_id, args.deadline)
                event.update(notice_s=round(time.monotonic() - t0, 1), node=victim.node_id[:8])
        if "notice_s" in event and "removed_s" not in event:
            pids = {p for p, n in replicas.items() if n[:8] == event["node"]}
            gone = all(not Path(f"/proc/{p}").exists() for p in pids)
            if gone and "replica_exited_s" not in event:
                event["replica_exited_s"] = round(time.monotonic() - t0, 1)  # it drained and went on its own
            if "replica_exited_s" in event or time.monotonic() - t0 >= event["notice_s"] + args.deadline:
                victim = next(n for n in cluster.worker_nodes if n.node_id[:8] == event["node"])
                cluster.remove_node(victim, allow_graceful=False)
                event["removed_s"] = round(time.monotonic() - t0, 1)
                cluster.add_node(**WORKER)
                event["replaced_s"] = round(time.monotonic() - t0, 1)
    logs = client.get_job_logs(job)
    Path(args.work, f"{Path(str(out)).name}.log").write_text(logs)
    n, distinct, errors = stored_rows(str(out))
    return {
        "status": str(status),
        "wall_s": round(time.monotonic() - t0, 1),
        "rows": n,
        "questions": distinct,
        "error_rows": errors,
        "replicas": {str(p): node[:8] for p, node in replicas.items()},
        "private_ray_started": "Started a local Ray instance" in logs,
        **event,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=40, help="questions (default 40)")
    p.add_argument("--deadline", type=int, default=60, help="seconds of the drain notice (default 60)")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/hotpotqa/dev_400.jsonl")
    p.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--store", help="an object-store URI for the dataset, the index and the outputs")
    p.add_argument("--backend", help="generation.backend (default: the config's, vllm)")
    p.add_argument("--resume-after", type=int, help="answer this many first; the pre-empted run resumes past them")
    return run_all(p.parse_args())


def run_all(args) -> int:
    """Both runs (or only the pre-empted one) as `main` parses them; prints the JSON, returns the exit code."""
    args.work = args.work or Path(tempfile.mkdtemp(prefix="dynrag-rayjob-"))
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    base: Path | str = work
    if args.store:
        base = args.store.rstrip("/")
        index: Path | str = stage_on_store(args, base)
    else:
        index = build_index(args.data, work)
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `dynrag` for the entrypoint
    from ray.cluster_utils import Cluster
    from ray.job_submission import JobSubmissionClient

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port = free_port()
    # the head's dashboard agent (which the Jobs API submits through) on a free port too: a leftover agent of an
    # earlier local cluster on Ray's default port leaves the job API with "No available agent"
    head = {
        "num_cpus": 0,
        "temp_dir": temp,
        "include_dashboard": True,
        "dashboard_port": port,
        "dashboard_agent_listen_port": free_port(),
    }
    cluster = Cluster(initialize_head=True, head_node_args=head)
    # what `ray start --head --temp-dir` leaves on a real head: its address in its temp dir, where Ray's job
    # supervisor looks ("auto") for the cluster to give the entrypoint (Cluster writes it under /tmp/ray only:
    # with another Ray on the machine, the supervisor then picked either)
    Path(temp, "ray_current_cluster").write_text(cluster.address)
    try:
        for _ in range(2):
            cluster.add_node(**WORKER)
        cluster.wait_for_nodes()
        args.dashboard = f"http://127.0.0.1:{port}"
        client = JobSubmissionClient(args.dashboard)
        result: dict = {"load_before": os.getloadavg()[0]}
        if args.resume_after:  # the first questions answered first, into the output the pre-empted run resumes
            first = run(cluster, client, args, index, f"{base}/preempted", preempt=False, limit=args.resume_after)
            result["first"] = first
        elif not args.skip_baseline:
            result["baseline"] = run(cluster, client, args, index, f"{base}/baseline", preempt=False)
        result["preempted"] = run(cluster, client, args, index, f"{base}/preempted", preempt=True)
        result["preempted"]["summary_rows"] = summary_rows(f"{base}/preempted")
        result["load_after"] = os.getloadavg()[0]
    finally:
        cluster.shutdown()  # also on SIGTERM: Ray's Cluster handles it, so the script is stopped with SIGINT
    if "baseline" in result and "wall_s" in result["baseline"]:
        result["seconds_lost"] = round(result["preempted"]["wall_s"] - result["baseline"]["wall_s"], 1)
    print(json.dumps(result, indent=1))
    Path(work, "result.json").write_text(json.dumps(result, indent=1))
    got = result["preempted"]
    ok = "SUCCEEDED" in got["status"] and got["rows"] == got["questions"] == args.limit and not got["error_rows"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
