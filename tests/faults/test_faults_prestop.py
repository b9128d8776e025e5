"""The shipped KubeRay preStop hook, run as Kubernetes runs it in a worker pod: its exact command
(`cluster/kuberay/raycluster.yaml`), by `/bin/sh -c`, inside the PID and mount namespaces of a Ray worker node
started the way a pod starts one (`ray start --address ... --block`, in a namespace of its own: one raylet
to see, as in a pod). The host also runs the head and another worker, all on one IP (where a `ray drain-node`
without `--node-id` connects as a driver to whichever raylet Ray finds first, the head here once). The hook
must drain the pod's node, and no other, and wait while the pod's Ray worker is busy; run where it sees several
raylets (a shared host) it cannot tell which node is its own, and drains none."""

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
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def worker_hook() -> str:
    spec = yaml.safe_load((ROOT / "cluster/kuberay/raycluster.yaml").read_text())["spec"]
    (group,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-workers"]
    command = group["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    return command[2]


def holder_on(node: str):
    """An actor on `node` (as an engine replica holds the pod's node busy)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    class Holder:
        def pid(self) -> int:
            return os.getpid()

    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    ray.get(holder.pid.remote(), timeout=120)
    return holder


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("nsenter"), reason="needs util-linux")
def test_the_shipped_prestop_drains_its_own_node_and_no_other(tmp_path):
    from platform_shims.compat import draining_nodes

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HOSTNAME": "dynrag-worker-0"}
    with fake_gpu_cluster(workers=1, num_cpus=1) as cluster:
        # as KubeRay gives its pods: their cluster's address (the `ray` CLI otherwise takes the newest Ray started
        # on the machine, another test process's at times: the drain then failed and nothing drained)
        env["RAY_ADDRESS"] = cluster.address
        before = alive_nodes()
        on_host = subprocess.Popen(["/bin/sh", "-c", worker_hook()], env=env)  # several raylets to see
        time.sleep(8)
        on_host.kill()
        assert draining_nodes() == {} and alive_nodes() == before  # it cannot tell its node: it drains none
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
            busy = holder_on(own)  # the pod holds an actor (a replica): its drain waits for it
            init = psutil.Process(pod.pid).children()[0].pid  # the namespace's pid 1
            hook = subprocess.Popen(
                ["nsenter", "--target", str(init), "--pid", "--mount", "/bin/sh", "-c", worker_hook()],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            while own not in draining_nodes():
                assert hook.poll() is None and time.monotonic() < deadline, hook.communicate()
                time.sleep(0.2)
            assert set(draining_nodes()) == {own} and alive_nodes() >= before  # its own node, and no other
            time.sleep(3)
            assert hook.poll() is None  # the hook waits while the pod's Ray worker is busy
            ray.kill(busy)
            assert hook.wait(timeout=60) == 0, hook.communicate()
        finally:  # the pod's end: SIGKILL to unshare (--kill-child) ends its namespace's pid 1, and with it the
            # namespace (SIGTERM left `ray start --block` running on its drained node until a 60 s wait ran out)
            pod.kill()
            pod.wait(timeout=60)
