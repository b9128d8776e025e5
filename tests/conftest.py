"""Shared fixtures: the benchmark data kit (../shared/data, or $DYNRAG_DATA), else the small fixture kit
carved from it (tests/fixtures/kit), and the model cache."""

from __future__ import annotations

import importlib.util
import logging
import os
import resource
import sys
from pathlib import Path

import pytest

from pipeline.config import default_cache_dir, default_data_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the tests' local Ray instances run without token auth whatever ~/.ray holds (dynrag itself leaves auth to Ray)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# every JVM of the tests (this process's, its CLI children's, Ray workers') compiles with C1 only: the tests' Lucene
# work is short, and C2's compiles cost ~2 CPU-s per JVM (platform_shims/java.py)
os.environ.setdefault("DYNRAG_JVM_OPTIONS", "-XX:TieredStopAtLevel=1")
# vLLM's engine runs in the process that starts it (its EngineCore and worker processes each import torch and vLLM
# again: a tiny engine started in 34 s here, 7 s in-process); the streaming AsyncLLM keeps its engine core process,
# with the worker inside it. The tests whose point is vLLM's own processes (the engine core killed or orphaned, its
# fd 1) run vLLM's default: fault_tools.VLLM_PROCESSES.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# a few test files import helpers of another test file in their own folder by its module name (test_*.py names are
# unique across tests/, as pytest's default import mode requires); helpers shared across folders live at tests/'s top
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).resolve().parent.rglob("*/")) if any(d.glob("test_*.py"))]

FIXTURE_KIT = Path(__file__).resolve().parent / "fixtures" / "kit"


def _carve_kit():
    """tests/fixtures/carve_kit.py, loaded by path (a top-level name "fixtures" could be another package)."""
    spec = importlib.util.spec_from_file_location("carve_kit", FIXTURE_KIT.parent / "carve_kit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Records per file: the whole kit (its README's table) and the fixture kit (tests/fixtures/carve_kit.py).
KIT_RECORDS = {
    "hotpotqa/dev_400.jsonl": 400,
    "hotpotqa/train_100.json": 100,
    "hotpotqa/train_100_corpus.json": 994,
    "2wikimultihopqa/dev_124.jsonl": 124,
    "2wikimultihopqa/train_500.json": 500,
    "2wikimultihopqa/corpus_6119.json": 6119,
    "musique/dev_150.jsonl": 150,
    "musique/train_100.json": 100,
    "musique/train_100_corpus.json": 1890,
    "nq_open/dev_3610.jsonl": 3610,
    "triviaqa/sample_150.json": 150,
    "popqa/test_14267.jsonl": 14267,
    "webquestions/test_2032.jsonl": 2032,
    "squad/dev_qa_10570.jsonl": 10570,
    "strategyqa/sample_229.jsonl": 229,
    "strategyqa/paragraphs_998.jsonl": 998,
    "wikipedia/psgs_w100_sample_1000.jsonl": 1000,
}
FIXTURE_RECORDS = _carve_kit().CUTS


def resolve_data_dir() -> tuple[Path, bool]:
    """(folder, whole kit?): the kit where it is (../shared/data or $DYNRAG_DATA), else the fixture kit."""
    d = Path(default_data_dir())
    if not d.is_dir():
        return FIXTURE_KIT, False
    return d, d.resolve() != FIXTURE_KIT.resolve()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "kit: needs the whole benchmark kit (../shared/data or $DYNRAG_DATA); "
        "deselected where only tests/fixtures/kit is available",
    )


def pytest_report_header(config):
    d, whole = resolve_data_dir()
    if whole:
        return f"benchmark data: the whole kit at {d}"
    why = "DYNRAG_DATA names it" if Path(default_data_dir()).is_dir() else f"no kit at {default_data_dir()}"
    return (
        f"benchmark data: the fixture kit {d} (the first records of each kit file; {why}); "
        f"tests marked kit are deselected"
    )


# Seconds per test file (setup, call and teardown summed) and the CPU-seconds spent meanwhile by this process and
# the child processes it reaped (CLI runs, a Ray cluster's daemons and workers at its shutdown), appended to
# $DYNRAG_TEST_TIMES as "file<TAB>seconds<TAB>tests<TAB>cpu-seconds" lines when it is set: scripts/run_tests.py
# prints them as a table at the end of each run.
_FILE_SECONDS: dict[str, list[float]] = {}


def _file_row(nodeid: str) -> list[float]:
    """The [seconds, tests, cpu-seconds] of a test's file."""
    return _FILE_SECONDS.setdefault(nodeid.split("::", 1)[0], [0.0, 0, 0.0])


def _cpu_seconds() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu = _cpu_seconds()
    try:
        return (yield)
    finally:
        _file_row(item.nodeid)[2] += _cpu_seconds() - cpu


def pytest_runtest_logreport(report):
    row = _file_row(report.nodeid)
    row[0] += report.duration
    row[1] += report.when == "call"


_ROOT_LEVEL = logging.getLogger().level


@pytest.fixture(autouse=True)
def _root_logger_restored():
    """A test that runs the CLI in this process (`main(["--log-level", "ERROR", ...])`) leaves the root logger
    at its level with a stderr handler of its own: every later test's caplog then missed each warning. Both
    are put back after each test (and a module fixture's run of the CLI, before the test)."""
    root = logging.getLogger()

    def restore() -> None:
        root.setLevel(_ROOT_LEVEL)
        for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
            root.removeHandler(handler)

    restore()
    yield
    restore()


def pytest_runtest_teardown(item):
    """transformers logs through a handler of its own, bound to the sys.stderr of when it was first used: a test's
    capsys stream, closed after that test, turned each later transformers warning into "--- Logging error ---"
    with a traceback on stderr (which tests of the CLI's stderr then see). Once transformers is imported, its
    records go to the root logger instead, as the other libraries' do."""
    if "transformers.utils.logging" in sys.modules:
        library = sys.modules["transformers.utils.logging"]
        library.disable_default_handler()
        library.enable_propagation()


def pytest_sessionfinish(session):
    path = os.environ.get("DYNRAG_TEST_TIMES")
    if path and _FILE_SECONDS:
        with open(path, "a") as f:
            f.writelines(f"{name}\t{s:.1f}\t{n}\t{cpu:.1f}\n" for name, (s, n, cpu) in _FILE_SECONDS.items())


def pytest_collection_modifyitems(config, items):
    if resolve_data_dir()[1]:
        return
    keep = [i for i in items if i.get_closest_marker("kit") is None]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("kit") is not None])
        items[:] = keep


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark files: the whole kit where present, else the fixture kit with the same relative paths."""
    return resolve_data_dir()[0]


@pytest.fixture(scope="session")
def whole_kit() -> bool:
    """Whether data_dir is the whole benchmark kit (else the small fixture kit)."""
    return resolve_data_dir()[1]


@pytest.fixture(scope="session")
def kit_records(data_dir) -> dict[str, int]:
    """How many records each file of data_dir holds (the kit's README, or the fixture kit's cut)."""
    return KIT_RECORDS if resolve_data_dir()[1] else FIXTURE_RECORDS


@pytest.fixture(scope="session")
def nq_dev(data_dir, tmp_path_factory) -> Path:
    """NQ-open dev with its 3,610 questions: the kit's file, or the fixture's questions repeated up to 3,610
    lines (ids are made from line numbers, so every line is a distinct question to a job)."""
    from engine_fixtures import at_least

    return at_least(data_dir, "nq_open/dev_3610.jsonl", 3610, tmp_path_factory.mktemp("nq"))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The shared model/package cache (prepared models are reused across tests and runs)."""
    return Path(default_cache_dir())


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory):
    """The tiny random-weight model (tests/tiny_model.py) on vLLM: 8 new tokens, 1 GiB of KV cache, 3 sequences
    at once. Shared by the session: take `model_copy(deep=True)` before changing it."""
    from engine_fixtures import tiny_model_path

    from pipeline.config import DynragConfig

    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.kv_cache_gib = 1
    cfg.generation.max_new_tokens = 8
    cfg.generation.max_model_len = 4096  # the tiny tokenizer spends about one token per 2-3 characters
    cfg.generation.engine_kwargs.max_num_seqs = 3  # a batch of more prompts runs in waves (engine_kwargs applied)
    cfg.answer.progress = False
    return cfg


@pytest.fixture(scope="session")
def tiny_vllm(tiny_cfg):
    """One batched vLLM engine (`VllmGenerator`) on the tiny model for every test of the session that needs one:
    an engine start costs 20-60 s here."""
    from pipeline.backends.vllm_gen import VllmGenerator

    gen = VllmGenerator(tiny_cfg.model_copy(deep=True))
    yield gen
    gen.close()


@pytest.fixture(scope="session")
def s3_server():
    """One real S3 API on loopback for the session (tests/s3_server.py: moto's server, every request recorded):
    `.env` (AWS_ENDPOINT_URL and credentials) for clients, subprocesses and Ray workers, `.new_bucket()`,
    `.filesystem()`, `.count("GET", "/bucket/prefix")`."""
    if importlib.util.find_spec("moto") is None:  # found, not imported: the server runs moto in its own process
        pytest.skip("moto[server] is a test dependency (pyproject `test` extra)")
    pytest.importorskip("s3fs", reason="s3fs is a test dependency (pyproject `test` extra)")
    from s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """S3 on loopback (the session's `s3_server`): an s3fs filesystem and a fresh bucket; AWS_* point every
    client of this process (and the processes it starts) at it."""
    import s3fs

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    bucket = s3_server.new_bucket()  # moto keeps its state per process: a fresh bucket per test
    yield fs, bucket
    s3fs.S3FileSystem.clear_instance_cache()
