"""The shipped RayJob as Ray runs it: `cluster/kuberay/rayjob-answer.yaml`'s entrypoint and runtime env,
submitted through Ray's Jobs API to a local cluster (a head with 0 CPUs and a dashboard, two 3-CPU workers),
its dataset, index and output on a real S3 API served locally (moto's server), and a worker holding an engine
replica pre-empted with Ray's drain notice (`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`), removed
once its replica has gone (or at the deadline) and replaced. scripts/rayjob_local.py does the work (the same
run with vLLM gives docs/benchmarks.md's figures); here without a model (generation.backend=none)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

pytestmark = [pytest.mark.faults, pytest.mark.own_process, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def test_the_shipped_rayjob_on_s3_joins_the_cluster_and_survives_a_drained_worker(s3, data_dir, tmp_path):
    import rayjob_local

    _, bucket = s3
    n = min(30, sum(1 for line in (data_dir / "hotpotqa" / "dev_400.jsonl").open() if line.strip()))  # the kit: 15
    args = Namespace(
        limit=n,
        deadline=40,
        data=data_dir / "hotpotqa" / "dev_400.jsonl",
        work=tmp_path,
        skip_baseline=True,
        store=f"s3://{bucket}/job",
        backend="none",
        resume_after=n // 3,
    )
    rc = rayjob_local.run_all(args)
    result = json.loads((tmp_path / "result.json").read_text())["preempted"]
    logs = "".join(f"\n--- {p.name}:\n" + p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))
    assert rc == 0, f"{result}{logs}"
    assert "SUCCEEDED" in result["status"]
    # pyarrow.dataset over the bucket's parts/ (no dedup): each question once, no error row
    assert (result["rows"], result["questions"], result["error_rows"]) == (n, n, 0)
    assert not result["private_ray_started"]  # the entrypoint joined the job's cluster (RAY_ADDRESS)
    # the two replicas on both workers (the head has no CPU); the drained one's replacement, seen last, may start on
    # the worker added in its place (a third node) when that node has joined before Ray places it
    assert len(set(list(result["replicas"].values())[:2])) == 2
    # the drained replica went on its own, or the job ended first (a short job can: its replica then ends with the
    # job's references, as CI saw): either way before the deadline, at which the node would have been removed
    assert result["notice_s"] and result.get("replica_exited_s", result["wall_s"]) < result["notice_s"] + 40
    assert result["summary_rows"] == n  # the resumed run's summary counts every row (the driver's ledger)
