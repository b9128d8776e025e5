"""`dynrag submit`: run any dynrag command as a Ray job on a cluster, through the Ray Jobs API.

    dynrag submit --address http://HEAD:8265 --config cluster/dynrag.yaml -- \\
        index build s3://bucket/psgs_w100.tsv --index s3://bucket/indexes/wiki

The working directory (this checkout; `.gitignore`d files are left out by Ray) is uploaded as the
job's `working_dir`, so the job runs this code. The configuration (`--config`, `--set`) is resolved and
validated here and shipped with the job (env `DYNRAG_CONFIG_YAML`); it defaults to
`runtime.mode=ray` and `runtime.ray_address=auto` (the job's driver joins the cluster it runs on).
The job's entry point is `python -m jobs.submit COMMAND ARGS...`, which runs `dynrag COMMAND ARGS...`
with that configuration: a job takes exactly the arguments of the CLI subcommand. The command's logs
are streamed until the job ends; the exit status is 0 when the job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
import tempfile
import time

import yaml

log = logging.getLogger(__name__)

CONFIG_ENV = "DYNRAG_CONFIG_YAML"
JOB_DEFAULTS = ["runtime.mode=ray", "runtime.ray_address=auto"]
EXCLUDES = [".git", ".venv", "runs", "out", "*.parquet", "__pycache__"]


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = sub.add_parser(
        "submit",
        help="run a dynrag command as a Ray job on a cluster (Ray Jobs API), streaming its logs",
        description="Upload the working directory and the resolved configuration, run `dynrag COMMAND ARGS...` as a "
        "Ray job at --address, stream its logs and exit with its status (0: SUCCEEDED).",
        epilog="example: dynrag submit --address http://127.0.0.1:8265 --config cluster/dynrag.yaml -- "
        "answer --dataset s3://b/dev.jsonl --index s3://b/idx --out s3://b/runs/sr --method sr-rag",
    )
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265"),
        help="Ray dashboard address (default $RAY_ADDRESS or http://127.0.0.1:8265)",
    )
    g.add_argument("--working-dir", default=".", metavar="DIR", help="folder uploaded as the job's code (default .)")
    g.add_argument(
        "--runtime-env",
        metavar="FILE",
        help="YAML runtime environment merged into the job's (e.g. cluster/runtime_env.yaml: env vars, pip packages)",
    )
    g.add_argument("--python", default="python", help="interpreter on the cluster nodes (default python)")
    g.add_argument("--job-id", help="submission id (default dynrag-COMMAND-TIME)")
    g.add_argument("--no-wait", action="store_true", help="print the job id and return without following it")
    add_config_args(p)
    p.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ARGS",
        help="the dynrag command to run, after `--`, e.g. -- index build CORPUS --index URI",
    )
    p.set_defaults(func=run)


def job_spec(args: argparse.Namespace) -> dict:
    """The `submit_job` keyword arguments for parsed `dynrag submit` arguments (no network)."""
    from pipeline.config import ConfigError, load_config, resolved_yaml

    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError(
            "no command to submit: give it after `--`, e.g. dynrag submit -- index info --index s3://b/idx"
        )
    if "--config" in command:
        raise ConfigError("give --config before `--` (it is resolved here and shipped with the job)")
    cfg = load_config(args.config, [*JOB_DEFAULTS, *args.overrides])
    env: dict = {}
    if args.runtime_env:
        with open(args.runtime_env, encoding="utf-8") as f:
            env = yaml.safe_load(f) or {}
        if not isinstance(env, dict):
            raise ConfigError(f"{args.runtime_env}: a runtime environment is a mapping")
    working_dir = os.path.abspath(args.working_dir)
    if not os.path.isdir(working_dir):
        raise ConfigError(f"--working-dir {working_dir} is not a folder")
    env["working_dir"] = working_dir
    env["excludes"] = sorted({*env.get("excludes", []), *EXCLUDES})
    env["env_vars"] = {**env.get("env_vars", {}), CONFIG_ENV: resolved_yaml(cfg)}
    job_id = args.job_id or f"dynrag-{command[0]}-{time.strftime('%Y%m%d-%H%M%S')}"
    return {
        "entrypoint": shlex.join([args.python, "-m", "jobs.submit", *command]),
        "runtime_env": env,
        "submission_id": job_id,
        "metadata": {"dynrag_command": shlex.join(command)},
    }


def run(args: argparse.Namespace) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    spec = job_spec(args)
    client = JobSubmissionClient(args.address)
    job_id = client.submit_job(**spec)
    print(f"submitted {job_id} to {args.address}: dynrag {spec['metadata']['dynrag_command']}", file=sys.stderr)
    if args.no_wait:
        print(job_id)
        return 0
    status = follow(client, job_id)
    print(f"job {job_id} {status}", file=sys.stderr)
    return 0 if status == JobStatus.SUCCEEDED else 1


def follow(client, job_id: str, out=None) -> str:
    """Stream the job's logs to `out` (stdout) until it ends; return its final status."""
    out = out or sys.stdout

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    asyncio.run(tail())
    return wait(client, job_id)


def wait(client, job_id: str, timeout_s: float = 3600, poll_s: float = 1.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {status} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def job_main(argv: list[str]) -> int:
    """The job's entry point on the cluster: `dynrag ARGV` with the shipped configuration."""
    from jobs.cli import main

    text = os.environ.get(CONFIG_ENV)
    if not text:
        return main(argv)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="dynrag-job-", delete=False) as f:
        f.write(text)
    try:
        return main([*argv, "--config", f.name])
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:]))
