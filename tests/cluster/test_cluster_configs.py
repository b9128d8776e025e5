"""cluster/: the launcher config, the KubeRay manifests, the runtime env and the dynrag configs hold what
the guide (cluster/README.md) and the code rely on, and every command of the guide parses."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"


def _yaml(rel: str):
    return yaml.safe_load((CLUSTER / rel).read_text(encoding="utf-8"))


def _extras() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _guide_commands() -> list[str]:
    """The commands of the guide's bash blocks, one per line."""
    text = (CLUSTER / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return lines


def test_launcher_config_is_valid_for_ray_and_maps_the_groups():
    import ray
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = _yaml("ray-cluster.yaml")
    validate_config(prepare_config(cfg))  # Ray's own schema (no unknown keys, integer resources, ...)
    types = cfg["available_node_types"]
    assert set(types) == {"head", "cpu-workers", "gpu-workers"} and cfg["head_node_type"] == "head"
    assert "GPU" not in types["cpu-workers"]["resources"] and types["gpu-workers"]["resources"]["GPU"] >= 1
    for group in ("cpu-workers", "gpu-workers"):
        assert 0 <= types[group]["min_workers"] <= types[group]["max_workers"] <= cfg["max_workers"]
    assert types["head"]["resources"]["CPU"] >= 1  # index builds finalize shards on the driver's node
    # the image's Ray is the Ray of the environment; the checkout is installed with existing extras
    assert f"ray:{ray.__version__}-" in cfg["docker"]["image"]
    assert cfg["file_mounts"] == {"/home/ray/dynrag": "."}
    install = " ".join(cfg["setup_commands"])
    extras = re.search(r"/home/ray/dynrag\[([a-z,]+)\]", install).group(1).split(",")
    assert set(extras) <= set(_extras()) and {"gpu", "cloud"} <= set(extras)
    assert any("--head" in c and "--dashboard-host=0.0.0.0" in c for c in cfg["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP:6379" in c for c in cfg["worker_start_ray_commands"])


def test_runtime_env_matches_the_rayjobs():
    env = _yaml("runtime_env.yaml")
    assert set(env) == {"env_vars"}  # packages come with the image / setup commands, not per job
    assert {"DYNRAG_CACHE", "HF_HOME", "VLLM_WORKER_MULTIPROC_METHOD"} <= set(env["env_vars"])
    assert all(isinstance(v, str) for v in env["env_vars"].values())  # Ray accepts string values only
    for job in ("rayjob-index.yaml", "rayjob-answer.yaml"):
        assert yaml.safe_load(_yaml(f"kuberay/{job}")["spec"]["runtimeEnvYAML"]) == env


def test_kuberay_cluster_and_jobs():
    import ray

    from jobs.cli import build_parser

    rc = _yaml("kuberay/raycluster.yaml")
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")
    spec = rc["spec"]
    assert spec["rayVersion"] == ray.__version__ and spec["enableInTreeAutoscaling"] is True
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu-workers", "gpu-workers"}
    for g in groups.values():
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    gpu = groups["gpu-workers"]
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == int(gpu["rayStartParams"]["num-gpus"]) >= 1
    assert "nvidia.com/gpu" not in groups["cpu-workers"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    images = {
        c["image"] for g in [spec["headGroupSpec"], *groups.values()] for c in g["template"]["spec"]["containers"]
    }
    assert len(images) == 1
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert f"rayproject/ray:{ray.__version__}-" in dockerfile and "/home/ray/dynrag[gpu,cloud]" in dockerfile

    parser = build_parser()
    for name, command in (("rayjob-index.yaml", "index"), ("rayjob-answer.yaml", "answer")):
        job = _yaml(f"kuberay/{name}")
        assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
        assert job["spec"]["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}
        assert {c["image"] for c in job["spec"]["submitterPodTemplate"]["spec"]["containers"]} == images
        argv = shlex.split(job["spec"]["entrypoint"])
        assert argv[0] == "dynrag" and argv[1] == command
        args = parser.parse_args(argv[1:])  # the real CLI accepts the entry point
        assert args.config == "/home/ray/dynrag/cluster/dynrag.yaml"  # where the Dockerfile puts the checkout
        assert "COPY --chown=ray:users . /home/ray/dynrag" in dockerfile


def _flat(d: dict, prefix: str = "") -> set[str]:
    """Dotted keys of the config sections (a `*resources` mapping is one value)."""
    return set().union(
        *[
            _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and not k.endswith("resources") else {prefix + k}
            for k, v in d.items()
        ]
    )


def test_dynrag_configs_map_resources_to_the_cluster():
    cluster, local = load_config(CLUSTER / "dynrag.yaml"), load_config(CLUSTER / "dynrag-local.yaml")
    assert _flat(_yaml("dynrag.yaml")) == _flat(_yaml("dynrag-local.yaml"))  # only the values differ
    gpus = _yaml("ray-cluster.yaml")["available_node_types"]["gpu-workers"]
    k8s_gpu = {g["groupName"]: g for g in _yaml("kuberay/raycluster.yaml")["spec"]["workerGroupSpecs"]}["gpu-workers"]
    # one generation replica per GPU of the largest GPU group
    assert cluster.ray.actors == gpus["max_workers"] * gpus["resources"]["GPU"]
    assert k8s_gpu["maxReplicas"] * int(k8s_gpu["rayStartParams"]["num-gpus"]) == cluster.ray.actors
    assert cluster.ray.actor_num_gpus == cluster.ray.embed_actor_num_gpus == 1
    assert cluster.ray.actor_num_cpus <= gpus["resources"]["CPU"]
    assert cluster.generation.backend == "vllm" and cluster.runtime.mode == local.runtime.mode == "ray"
    # retrieval actors fit the CPU group, which offers the custom resource they ask for
    cpus = _yaml("ray-cluster.yaml")["available_node_types"]["cpu-workers"]
    k8s_cpu = {g["groupName"]: g for g in _yaml("kuberay/raycluster.yaml")["spec"]["workerGroupSpecs"]}["cpu-workers"]
    k8s_offer = json.loads(json.loads(k8s_cpu["rayStartParams"]["resources"]))  # KubeRay's quoted JSON
    for actors, wants in (
        (cluster.ray.retrieval_actors, cluster.ray.retrieval_actor_resources),
        (cluster.ray.scorer_actors, cluster.ray.scorer_actor_resources),
    ):
        for name, per_actor in wants.items():
            assert actors * per_actor <= cpus["max_workers"] * cpus["resources"][name]
            assert k8s_offer[name] == cpus["resources"][name]
    assert "GPU" not in cpus["resources"] and cluster.ray.scorer_actor_resources
    assert cluster.ray.retrieval_actors >= 1 and cluster.ray.retrieval_actor_num_cpus <= cpus["resources"]["CPU"]
    # the one-machine file keeps the GPU requests and relies on the fallback
    assert local.ray.actor_num_gpus == 1 and local.ray.gpu_fallback


def test_guide_commands_parse_and_match_the_tests():
    from test_cluster_ray import RAY_ENV, RAY_START

    from jobs.cli import build_parser

    parser = build_parser()
    commands = _guide_commands()
    submits = [c for c in commands if c.startswith("dynrag submit")]
    assert len(submits) >= 4
    for line in [c for c in commands if c.startswith("dynrag ")]:
        args = parser.parse_args(shlex.split(line)[1:])
        for path in (getattr(args, "config", None), getattr(args, "runtime_env", None)):
            assert path is None or (REPO / path).is_file(), path
        if args.command == "submit":
            inner = [a for a in args.job if a != "--"]
            parser.parse_args([*inner, "--config", "x.yaml"])  # what jobs.submit runs on the cluster
    # the one-machine section: the same `ray start` flags and `dynrag submit` form as tests/cluster/test_cluster_ray.py
    ray_start = next(c for c in commands if c.startswith("ray start"))
    assert set(RAY_START) <= set(ray_start.split())
    export = next(c for c in commands if c.startswith("export RAY_"))
    # the tests pin token auth off; the guide leaves it to Ray (on with a token file, off without)
    assert {f"{k}={v}" for k, v in RAY_ENV.items() if k != "RAY_AUTH_MODE"} == set(export.split()[1:])
    local = [c for c in submits if "--config cluster/dynrag-local.yaml -- " in c]
    assert {c.split(" -- ")[1].split()[0] for c in local} == {"index", "answer"}
    for c in commands:
        for f in re.findall(r"(?:-f|up|dashboard|down) (cluster/\S+)", c):
            assert (REPO / f).is_file(), f


def test_submit_job_spec_ships_the_resolved_config(tmp_path):
    """`dynrag submit`'s job: entry point `python -m jobs.submit ARGS`, the working dir, the runtime env
    merged, and the validated configuration with the job defaults (no cluster needed)."""
    from jobs.cli import build_parser
    from jobs.submit import CONFIG_ENV, job_spec
    from pipeline.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(
        [
            "submit",
            "--working-dir",
            str(REPO),
            "--runtime-env",
            "cluster/runtime_env.yaml",
            "--config",
            "cluster/dynrag.yaml",
            "--set",
            "ray.actors=3",
            "--job-id",
            "j1",
            "--",
            "answer",
            "--dataset",
            "s3://b/q.jsonl",
            "--out",
            "s3://b/o",
        ]
    )
    spec = job_spec(args)
    assert spec["entrypoint"] == "python -m jobs.submit answer --dataset s3://b/q.jsonl --out s3://b/o"
    assert spec["submission_id"] == "j1" and spec["runtime_env"]["working_dir"] == str(REPO)
    env = spec["runtime_env"]["env_vars"]
    assert env["HF_HOME"] == _yaml("runtime_env.yaml")["env_vars"]["HF_HOME"]
    shipped = yaml.safe_load(env[CONFIG_ENV])
    assert shipped["ray"]["actors"] == 3 and shipped["runtime"] == {
        **shipped["runtime"],
        "mode": "ray",
        "ray_address": "auto",
    }
    assert shipped["generation"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(ConfigError, match="ray.actors"):
        job_spec(parser.parse_args(["submit", "--set", "ray.actors=0", "--", "index", "info", "--index", "x"]))
    with pytest.raises(ConfigError, match="no command"):
        job_spec(parser.parse_args(["submit"]))
    with pytest.raises(ConfigError, match="before `--`"):
        job_spec(parser.parse_args(["submit", "--", "index", "info", "--index", "x", "--config", "a.yaml"]))


def test_a_job_joins_the_cluster_it_runs_in_else_starts_its_own_ray(monkeypatch):
    """The address: runtime.ray_address (ray.address for builds) when set; else the cluster the process runs in
    (a Ray job's entrypoint has RAY_ADDRESS from Ray's job supervisor); else a local instance ("local": a
    plain ray.init() would join any `ray start` cluster of the machine, and refuse num_cpus there)."""
    import ray

    from platform_shims.raytools import init_ray, ray_address

    assert ray_address("ray://head:10001", {"RAY_ADDRESS": "10.0.0.1:6379"}) == "ray://head:10001"
    assert ray_address(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert ray_address(None, {}) == "local"
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    init_ray(None, 2)
    assert calls[-1]["address"] == "local" and calls[-1]["num_cpus"] == 2
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    init_ray(None, 2)  # as `dynrag answer` runs inside a Ray job: the job's cluster, not a private Ray
    assert calls[-1]["address"] == "127.0.0.1:6379" and calls[-1]["num_cpus"] is None
    init_ray("ray://head:10001", 2)
    assert calls[-1]["address"] == "ray://head:10001" and calls[-1]["num_cpus"] is None


def _pods(rc: dict) -> dict[str, dict]:
    spec = rc["spec"]
    return {"head": spec["headGroupSpec"]["template"]["spec"]} | {
        g["groupName"]: g["template"]["spec"] for g in spec["workerGroupSpecs"]
    }


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_kuberay_token_auth_on_every_container():
    """Ray's token authentication (RAY_AUTH_MODE=token, the token from a Kubernetes secret, never a literal) on
    the head, every worker and each RayJob's submitter: the dashboard and the Jobs API, which listen on 0.0.0.0
    in the pod network, answer no request without the token."""
    rc = _yaml("kuberay/raycluster.yaml")
    containers = [c for pod in _pods(rc).values() for c in pod["containers"]]
    for job in ("rayjob-index.yaml", "rayjob-answer.yaml"):
        containers += _yaml(f"kuberay/{job}")["spec"]["submitterPodTemplate"]["spec"]["containers"]
    secrets = set()
    for c in containers:
        env = _env(c)
        assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert "value" not in env["RAY_AUTH_TOKEN"] and ref.get("optional") is not True
        secrets.add((ref["name"], ref["key"]))
    assert len(secrets) == 1  # one token for the cluster and its submitters
    name, key = secrets.pop()
    assert f"kubectl create secret generic {name} --from-literal={key}=" in (CLUSTER / "README.md").read_text()
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # hence the token


def test_kuberay_grace_covers_the_drain_window():
    """Pre-emption on Kubernetes: each pod's terminationGracePeriodSeconds is above dynrag's drain window
    (answer.drain_s of the cluster config + the runner's grace for the last parts); a worker's preStop drains
    its Ray node with that window as deadline and waits no longer; `ray job stop` (RAY_JOB_STOP_WAIT_TIME_S on
    the head, where the job supervisors run) waits at least the window and less than the head's grace."""
    from pipeline.runtime.ray_runner import DRAIN_GRACE_S

    window = load_config(str(CLUSTER / "dynrag.yaml")).answer.drain_s + DRAIN_GRACE_S
    pods = _pods(_yaml("kuberay/raycluster.yaml"))
    for name, pod in pods.items():
        assert pod["terminationGracePeriodSeconds"] > window, name
    for name, pod in pods.items():
        if name == "head":
            continue
        hook = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
        assert 'ray drain-node --node-id "$node"' in hook and "DRAIN_NODE_REASON_PREEMPTION" in hook, name
        deadline = int(re.search(r"--deadline-remaining-seconds (\d+)", hook).group(1))
        waits = int(re.search(r"\$i -lt (\d+)", hook).group(1))
        assert window <= deadline < pod["terminationGracePeriodSeconds"] and waits <= deadline, name
    stop_wait = int(_env(pods["head"]["containers"][0])["RAY_JOB_STOP_WAIT_TIME_S"]["value"])
    assert window <= stop_wait < pods["head"]["terminationGracePeriodSeconds"]
