"""A pre-empted worker node during a real `dynrag answer` on a local 3-node Ray cluster, and what it costs.

The cluster (ray.cluster_utils.Cluster, in this process): a head with no CPUs, two workers of 3 CPUs. The job:
`ray.actors=2` engine actors of 2 CPUs, `ray.retrieval_actors=2` of 1 CPU, so each worker holds one engine
and one retrieval actor; each engine actor holds 2 batches of 5 questions, so rows are written as the job goes. Run once undisturbed (the baseline), then again with one worker's processes sent
SIGTERM (as a pre-empted machine's are) once the first rows are written, and a replacement node added
`--replace-after` seconds later. Prints, per run: exit code, wall seconds, rows, distinct questions, error
rows; then the seconds the lost node cost. Exit 1 if the disturbed run did not answer every question once
without an error row.

    .venv/bin/python scripts/ray_preemption.py --limit 100 [--backend vllm|none] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKER = {"num_cpus": 3}


def dynrag(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobs.cli", *args]


def build_index(data: Path, work: Path) -> Path:
    index = work / "index"
    if not (index / "CURRENT").exists():
        subprocess.run(
            dynrag(
                "index", "build", str(data), "--format", "hotpotqa", "--index", str(index), "--set", "index.dense=false"
            ),
            cwd=ROOT,
            check=True,
        )
    return index


def sigterm_node(node) -> None:
    """SIGTERM to a node's raylet and every process below it (its workers: the actors)."""
    import psutil

    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for p in [*raylet.children(recursive=True), raylet]:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def rows(out: Path) -> tuple[int, int, int]:
    import polars as pl

    parts = list((out / "parts").glob("*.parquet"))
    if not parts:
        return 0, 0, 0
    df = pl.read_parquet(parts)
    return df.height, df["question_id"].n_unique(), int(df["error"].is_not_null().sum())


def run(cluster, args, index: Path, out: Path, preempt: bool) -> dict:
    cmd = dynrag(
        "--log-level",
        "WARNING",
        "answer",
        "--dataset",
        str(args.data),
        "--index",
        str(index),
        "--method",
        "sr-rag",
        "--out",
        str(out),
        "--limit",
        str(args.limit),
        "--no-progress",
        *[
            x
            for kv in [
                "runtime.mode=ray",
                f"runtime.ray_address={cluster.address}",
                "ray.actors=2",
                "ray.actor_num_cpus=2",
                "ray.retrieval_actors=2",
                "ray.retrieval_actor_num_cpus=1",
                "answer.batch_questions=5",
                "ray.actor_batches=2",  # each actor holds 10 questions: rows are written as the run goes
                f"generation.backend={args.backend}",
            ]
            for x in ("--set", kv)
        ],
    )
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume of an earlier one
    t0 = time.monotonic()
    log = open(out.parent / f"{out.name}.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    event: dict = {}
    while proc.poll() is None:
        time.sleep(0.5)
        if preempt and "sigterm_s" not in event and rows(out)[0]:
            victim = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[0]
            sigterm_node(victim)
            event["sigterm_s"] = round(time.monotonic() - t0, 1)
            time.sleep(1.0)
            cluster.remove_node(victim, allow_graceful=False)
        if (
            "sigterm_s" in event
            and "replaced_s" not in event
            and time.monotonic() - t0 > event["sigterm_s"] + args.replace_after
        ):
            cluster.add_node(**WORKER)
            event["replaced_s"] = round(time.monotonic() - t0, 1)
    n, distinct, errors = rows(out)
    return {
        "exit": proc.returncode,
        "wall_s": round(time.monotonic() - t0, 1),
        "rows": n,
        "questions": distinct,
        "error_rows": errors,
        **event,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=100, help="questions (default 100)")
    p.add_argument("--backend", default="vllm", help="generation.backend (default vllm; none: no model)")
    p.add_argument("--replace-after", type=float, default=20.0, help="seconds from SIGTERM to the replacement")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/hotpotqa/dev_400.jsonl")
    p.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    p.add_argument("--skip-baseline", action="store_true")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dynrag-preempt-"))
    work.mkdir(parents=True, exist_ok=True)
    index = build_index(args.data, work)
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp})
    try:
        for _ in range(2):
            cluster.add_node(**WORKER)
        cluster.wait_for_nodes()
        result = {"load_before": os.getloadavg()[0]}
        if not args.skip_baseline:
            result["baseline"] = run(cluster, args, index, work / "baseline", preempt=False)
        result["preempted"] = run(cluster, args, index, work / "preempted", preempt=True)
        result["load_after"] = os.getloadavg()[0]
    finally:
        cluster.shutdown()
    if "baseline" in result:
        result["seconds_lost"] = round(result["preempted"]["wall_s"] - result["baseline"]["wall_s"], 1)
    print(json.dumps(result, indent=1))
    got = result["preempted"]
    ok = got["exit"] == 0 and got["rows"] == got["questions"] == args.limit and not got["error_rows"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
