"""The shipped KubeRay preStop hook, run as Kubernetes runs it in a worker pod: its exact command
(`cluster/kuberay/raycluster.yaml`), by `/bin/sh -c`, inside the PID and mount namespaces of a Ray worker node
started the way a pod starts one (`ray start --address ... --block`, in a namespace of its own: one raylet
to see, as in a pod). The host also runs the head and another worker, all on one IP (where a `ray drain-node`
without `--node-id` connects as a driver to whichever raylet Ray finds first, the head here once). The hook
must drain the pod's node, and no other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from ray_jobs import fake_gpu_cluster

pytestmark = [pytest.mark.faults, pytest.mark.own_process, pytest.mark.timeout(300)]

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def worker_hook() -> str:
    spec = yaml.safe_load((ROOT / "cluster/kuberay/raycluster.yaml").read_text())["spec"]
    (group,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-workers"]
    command = group["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    return command[2]


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("nsenter"), reason="needs util-linux")
def test_the_shipped_prestop_drains_its_own_node_and_no_other(tmp_path):
    from indexing.compat import draining_nodes

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HOSTNAME": "dynrag-worker-0"}
    with fake_gpu_cluster(workers=1, num_cpus=1) as cluster:
        before = alive_nodes()
        pod = subprocess.Popen(  # the pod: its own PID namespace, one raylet in it
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", str(BIN / "ray"), "start", "--block",
             "--address", cluster.address, "--num-cpus", "1", "--disable-usage-stats"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (alive_nodes() - before):
                assert pod.poll() is None and time.monotonic() < deadline, pod.stderr.read().decode()[-2000:]
                time.sleep(0.5)
            (own,) = alive_nodes() - before
            init = psutil.Process(pod.pid).children()[0].pid  # the namespace's pid 1
            hook = subprocess.run(
                ["nsenter", "--target", str(init), "--pid", "--mount", "/bin/sh", "-c", worker_hook()],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert hook.returncode == 0, hook.stderr[-2000:]
            assert set(draining_nodes()) == {own}, (own, draining_nodes(), before)
        finally:
            pod.terminate()
            try:
                pod.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pod.kill()
