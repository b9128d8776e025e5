"""Configuration: defaults, YAML file, --set overrides, validation messages that name the field; read-only in
pipeline/ and indexing/ (a run's derived values set on its own copy, `with_values`)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, DynragConfig, load_config, parse_override, save_resolved, with_values

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_deterministic():
    cfg = load_config()
    assert isinstance(cfg, DynragConfig)
    assert cfg.generation.temperature == 0.0
    assert cfg.index.passage_words == 100


def test_file_then_overrides_take_priority(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("generation:\n  max_new_tokens: 64\n  temperature: 0.5\nretrieval:\n  k: 7\n")
    cfg = load_config(f, ["generation.temperature=0", "retrieval.retriever=dense"])
    assert cfg.generation.max_new_tokens == 64  # from the file
    assert cfg.generation.temperature == 0.0  # the override wins over the file
    assert cfg.retrieval.k == 7
    assert cfg.retrieval.retriever == "dense"


@pytest.mark.parametrize(
    "override, field",
    [
        ("generation.temperature=-1", "generation.temperature"),
        ("retrieval.k=0", "retrieval.k"),
        ("retrieval.retriever=google", "retrieval.retriever"),
        ("index.shard_size=many", "index.shard_size"),
        ("generation.temprature=0.1", "generation.temprature"),
        ("nosuchsection.x=1", "nosuchsection"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert field in str(err.value)


def test_unknown_field_is_called_unknown():
    with pytest.raises(ConfigError, match="generation.temprature: unknown field"):
        load_config(None, ["generation.temprature=0.1"])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("generation: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_override_syntax():
    assert parse_override("a.b=1") == (["a", "b"], 1)
    assert parse_override("a.b=true") == (["a", "b"], True)
    assert parse_override("a.b=Flat") == (["a", "b"], "Flat")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("novalue")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["generation.max_new_tokens=48", "index.faiss_factory=HNSW32"])
    path = save_resolved(cfg, tmp_path / "out")
    again = load_config(path)
    assert again == cfg
    assert yaml.safe_load(path.read_text())["index"]["faiss_factory"] == "HNSW32"


def test_cli_bad_config_value_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "models", "list", "--set", "retrieval.k=-3"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "retrieval.k" in lines[0], proc.stderr


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "models", "list", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "config file not found" in proc.stderr


def test_vllm_engine_kwargs_are_validated_and_passed_through():
    from pipeline.backends.vllm_gen import llm_kwargs

    with pytest.raises(
        ConfigError, match=r"^invalid configuration: generation.engine_kwargs.swap_space: unknown field"
    ):
        load_config(overrides=["generation.engine_kwargs.swap_space=4"])
    with pytest.raises(ConfigError, match="engine_kwargs.max_num_seqs"):
        load_config(overrides=["generation.engine_kwargs.max_num_seqs=0"])
    with pytest.raises(ConfigError, match="differ: set one of them"):
        load_config(overrides=["generation.max_model_len=4096", "generation.engine_kwargs.max_model_len=1024"])
    g = load_config(overrides=["generation.engine_kwargs.max_model_len=1024"]).generation
    assert g.max_model_len == 1024  # one setting, under either name
    assert llm_kwargs(g, "m", gpu=False)["enable_prefix_caching"] is True  # on unless turned off
    g = load_config(
        overrides=[
            "generation.engine_kwargs.enable_prefix_caching=false",
            "generation.engine_kwargs.gpu_memory_utilization=0.5",
        ]
    ).generation
    kw = llm_kwargs(g, "m", gpu=True)
    assert kw["enable_prefix_caching"] is False and kw["gpu_memory_utilization"] == 0.5 and "enforce_eager" not in kw
    assert "tensor_parallel_size" not in kw  # unset keys keep vLLM's defaults


def test_a_cpu_engine_caches_prefixes_in_blocks_of_32_unless_configured():
    from pipeline.backends.vllm_gen import llm_kwargs

    g = load_config().generation
    assert llm_kwargs(g, "m", gpu=False)["block_size"] == 32  # vLLM's CPU default, 128, shares little
    assert "block_size" not in llm_kwargs(g, "m", gpu=True)  # a GPU keeps vLLM's 16
    g = load_config(overrides=["generation.engine_kwargs.block_size=64"]).generation
    assert llm_kwargs(g, "m", gpu=False)["block_size"] == 64 == llm_kwargs(g, "m", gpu=True)["block_size"]


def test_a_kv_cache_size_from_the_environment_wins_and_says_so(monkeypatch, caplog):
    from pipeline.backends.vllm_gen import configure_cpu_env, cpu_env

    for key, value in cpu_env(2.0).items():  # restored after the test
        monkeypatch.setenv(key, value)
    configure_cpu_env(2.0)  # the same size: nothing to say
    assert "KVCACHE" not in caplog.text
    configure_cpu_env(8.0)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2" and "2 GiB from VLLM_CPU_KVCACHE_SPACE" in caplog.text


def test_with_values_makes_a_validated_copy_and_leaves_the_configuration_as_it_is():
    cfg = DynragConfig()
    new = with_values(cfg, {"generation.dtype": "float32", "method.name": "flare", "method.params": {"k": 2}})
    assert (new.generation.dtype, new.method.name, new.method.params) == ("float32", "flare", {"k": 2})
    assert cfg == DynragConfig() and new.retrieval == cfg.retrieval
    with pytest.raises(ConfigError, match="dataset.format"):
        with_values(cfg, {"dataset.format": "nope"})


CONFIG = re.compile(r"^(\w+_)?cfg$|^config$")  # the names a configuration goes by


def _written(node: ast.AST) -> list[ast.expr]:
    """What an assignment writes, tuples unpacked."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _in_a_configuration(target: ast.expr) -> bool:
    """`target` is a value a configuration holds: `cfg.section.key`, `self.cfg.x`, `run_cfg.method.params[k]`."""
    node = target
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if CONFIG.match(name):
            return True
    return False


def test_pipeline_and_indexing_never_change_a_configuration():
    """What a run derives (a resolved dtype, the index's analyzer, a replica's FAISS placement) is set once on a copy
    made before anything reads it (`with_values`), or travels beside the configuration: none is written into one
    that others may hold already."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}"
        for path in sorted(p for d in ("pipeline", "indexing", "platform_shims") for p in (ROOT / d).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        for t in _written(node)
        if _in_a_configuration(t)
    ]
    assert not found, "assignments into a configuration:\n" + "\n".join(found)
