"""Every `--json` command writes exactly one JSON document to stdout (`json.loads` of the whole of it), whatever
libraries and child processes write meanwhile: that goes to stderr (jobs/jsonout.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fault_tools import VLLM_PROCESSES

from jobs.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SLOW_ELSEWHERE = {  # --json commands whose run needs minutes and an install: their own slow tests parse stdout
    "bench flashrag": "tests/jobs/test_bench_plumbing.py::test_bench_flashrag_end_to_end",
    "bench scale": "tests/jobs/test_bench_scale.py::test_bench_scale_dpr_synthetic",
    "bench questions": "tests/jobs/test_bench_questions.py::test_bench_questions_local",  # its stdout parsed as one JSON
}
# --json commands no test here can run: `conform` needs a checkout of the authors' code (GitHub, which CI cannot
# reach) and installs its requirements; its document's parts are tested on scripted sides in tests/jobs/test_conform.py
NEEDS_AUTHORS_CODE = {"conform"}


def json_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """The command paths ("index search", ...) whose parser has --json."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from json_commands(child, (*path, name))
        elif "--json" in action.option_strings:
            yield " ".join(path)


def dynrag(*args: str, data_dir: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    # warnings: more noise to divert; vLLM's own processes: its EngineCore child writes its log to fd 1
    env = {**os.environ, "DYNRAG_DATA": str(data_dir), "PYTHONWARNINGS": "default", **VLLM_PROCESSES}
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_document(r: subprocess.CompletedProcess):
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)  # the whole of stdout: one document, nothing before or after it


def test_child_processes_and_fd_1_writers_reach_stderr_not_stdout():
    """The CLI's own process (main() from sys.argv): a print, a raw write to fd 1, a log handler bound to the old
    sys.stdout (as vLLM's), a child process writing to its fd 1 (as vLLM's EngineCore) and output at exit."""
    script = textwrap.dedent(
        """
        import atexit, logging, os, subprocess, sys
        import jobs.methods
        bound = logging.StreamHandler(sys.stdout)
        real_run = jobs.methods.run
        def noisy(args):
            print("print noise")
            os.write(1, b"fd1 noise\\n")
            bound.emit(logging.makeLogRecord({"msg": "handler noise"}))
            subprocess.run([sys.executable, "-c", "import os; os.write(1, b'child noise\\\\n')"], check=True)
            atexit.register(os.write, 1, b"exit noise\\n")
            return real_run(args)
        jobs.methods.run = noisy
        from jobs.cli import main
        sys.argv = ["dynrag", "methods", "sr-rag", "--json"]
        sys.exit(main())
        """
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["name"] for m in json.loads(r.stdout)] == ["sr-rag"]
    for noise in ("print", "fd1", "handler", "child", "exit"):
        assert f"{noise} noise" in r.stderr and f"{noise} noise" not in r.stdout


def test_in_process_main_restores_stdout(capsys):
    """Called as a function (argv given), main() gives fd 1 and sys.stdout back after the document."""
    from jobs.cli import main

    before = sys.stdout
    assert main(["methods", "dragin", "--json"]) == 0
    assert sys.stdout is before
    print("after")
    out = capsys.readouterr().out
    doc, rest = out.rsplit("\n", 2)[0], out.rsplit("\n", 2)[1]
    assert json.loads(doc)[0]["name"] == "dragin" and rest == "after"


@pytest.fixture(scope="module")
def kit_runs(data_dir, tmp_path_factory):
    """A BM25 index over the fixture kit's Wikipedia sample and two finished runs (eval_fixtures)."""
    from eval_fixtures import fake_run

    from indexing import build_index
    from indexing.settings import IndexSettings

    tmp = tmp_path_factory.mktemp("json")
    index = tmp / "index"
    settings = IndexSettings(embedding={"model": "hash"}, index={"dense": False})
    build_index([str(data_dir / "wikipedia" / "psgs_w100_sample_1000.jsonl")], str(index), settings)
    runs = [
        fake_run(tmp / name, dataset="hotpotqa", method=name, params={}, f1s=f1s, times=[1.0] * 4)
        for name, f1s in (("sr-rag", [1, 0, 1, 1]), ("no-retrieval", [0, 0, 1, 0]))
    ]
    return index, runs


def default_set(index: Path, runs: list[Path]) -> dict[str, list[list[str]]]:
    a, b = map(str, runs)
    return {
        "methods": [["methods", "--json"], ["methods", "dragin", "--json"]],
        "index search": [["index", "search", "--index", str(index), "-k", "2", "--json", "Paris", "a river"]],
        "index info": [["index", "info", "--index", str(index), "--json"]],
        "evaluate": [["evaluate", a, b, "--json"], ["evaluate", a, "--baseline", b, "--resamples", "200", "--json"]],
        "bench pipeline": [["bench", "pipeline", "--simulate-gpu", "--questions", "4", "--time-scale", "0", "--json"]],
        "bench experiment": [
            ["bench", "experiment", "--simulate-gpu", "--methods", "sr-rag,flare", "--questions", "3"]
            + ["--time-scale", "0", "--json"]
        ],
    }


def slow_set(index: Path, runs: list[Path]) -> dict[str, list[list[str]]]:
    few = ["--limit", "2", "--set", "generation.model=smollm2-135m-instruct", "--set", "generation.max_new_tokens=8"]
    return {
        "evaluate --judge": [["evaluate", str(runs[0]), "--judge", "smollm2-135m-instruct", "--json"]],
        "bench answer": [["bench", "answer", "--index", str(index), *few, "--json"]],
        "bench dragin": [["bench", "dragin", "--index", str(index), *few, "--json"]],
    }


def test_every_json_command_is_run_by_a_test(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    covered = {*default_set(tmp_path, runs), *slow_set(tmp_path, runs), *SLOW_ELSEWHERE, *NEEDS_AUTHORS_CODE}
    found = set(json_commands(build_parser()))
    assert found and found <= covered, f"--json commands without a test here: {sorted(found - covered)}"


def test_each_json_command_prints_one_document(kit_runs, data_dir):
    index, runs = kit_runs
    docs = {
        name: [one_document(dynrag(*argv, data_dir=data_dir)) for argv in argvs]
        for name, argvs in default_set(index, runs).items()
    }
    assert len(docs["methods"][0]) >= 29 and docs["methods"][1][0]["params"][0]["name"] == "k"
    [hits] = docs["index search"]
    assert [(h["query"], h["retriever"]) for h in hits] == [("Paris", "bm25"), ("a river", "bm25")]
    corpus = data_dir / "wikipedia" / "psgs_w100_sample_1000.jsonl"
    assert docs["index info"][0]["passages"] == len(corpus.read_text(encoding="utf-8").splitlines())
    assert {r["method"] for r in docs["evaluate"][0]} == {"sr-rag", "no-retrieval"}
    assert "delta_f1_ci95" in docs["evaluate"][1][0]
    assert {r["method"] for r in docs["bench pipeline"][0]} >= {"sr-rag", "dragin"}
    assert docs["bench experiment"][0]["same_as_alone"] and set(docs["bench experiment"][0]["modes"]) == {
        "concurrent",
        "sequential",
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["evaluate --judge", "bench answer", "bench dragin"])
def test_json_commands_with_a_model_print_one_document(kit_runs, data_dir, name):
    """vLLM's engine (its EngineCore child writes its log to fd 1) and a model: minutes on 2 cores."""
    index, runs = kit_runs
    for argv in slow_set(index, runs)[name]:
        doc = one_document(dynrag(*argv, data_dir=data_dir, timeout=1200))
        assert doc
