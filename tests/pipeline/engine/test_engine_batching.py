"""The engine batches every pending request of one kind into one backend call, and isolates errors."""

import pytest
from fakes import MemoryRetriever, RecordingGenerator

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Answer, Generate, Question, Retrieve
from pipeline.methods.registry import get_method

PASSAGES = [
    ("p1", "Paris", "Paris is the capital of France."),
    ("p2", "Berlin", "Berlin is the capital of Germany."),
    ("p3", "Rome", "Rome is the capital of Italy."),
]


def two_round(q: Question, params):
    """Generate a pseudo document, retrieve with it, then answer: two generate rounds."""
    if "explode" in q.question:
        raise ValueError("this question's program fails")
    draft = (yield Generate([f"write about: {q.question}"], stage="draft"))[0]
    hits = yield Retrieve([q.question, draft.text], k=2, step="retrieve")
    final = yield Generate([f"answer {q.question} with {hits[0][0].title}", "second prompt"], stage="answer")
    return Answer(final[0].text, final[0].text, used_docs=hits[0][:1])


def make(questions, **gen_kw):
    gen = RecordingGenerator(**gen_kw)
    ret = MemoryRetriever(PASSAGES)
    engine = Engine(Backends(DynragConfig(), generator=gen, retriever=ret))
    return engine, gen, ret


def test_two_round_method_makes_one_call_per_round():
    qs = [Question(str(i), f"capital of {c}?") for i, c in enumerate(["France", "Germany", "Italy"] * 3)]
    engine, gen, ret = make(qs)
    out = engine.run(qs, two_round, None)
    # round 1: 9 prompts in one call; round 2: 2 prompts x 9 questions in one call
    assert gen.calls == [9, 18]
    # one search over every distinct waiting query (2 per question: 3 questions and one draft text, each once)
    assert ret.calls == [4]
    assert sum(o.trace.retrieval_cache_hits for o in out) == 18 - 4
    assert all(o.error is None for o in out)
    t = out[0].trace
    assert (t.llm_calls, t.retrieval_calls, t.retrieve_rounds) == (3, 2, 1)
    assert t.completion_tokens == 6 and t.prompt_tokens > 0
    assert t.time["generation"] > 0 and t.time["retrieval"] > 0
    assert {d["step"] for d in t.retrieved} == {"retrieve"} and len(t.retrieved) == 4
    assert dict(engine.batch_calls) == {"generate": 2, "retrieve": 1}
    assert set(engine.batch_seconds) == {"generate", "retrieve"} and all(v >= 0 for v in engine.batch_seconds.values())


def test_errors_stay_in_their_rows():
    qs = [
        Question("a", "capital of France?"),
        Question("b", "please explode"),
        Question("c", "poison capital of Italy?"),
        Question("d", "bad", error="no question text"),
    ]
    engine, gen, _ = make(qs, fail_on="poison")
    out = engine.run(qs, two_round, None)
    assert out[0].error is None and out[0].answer.prediction == "fake answer"
    assert "ValueError" in out[1].error
    assert "poison" in out[2].error  # its batch failed, the retry alone isolated it
    assert out[3].error == "no question text"
    assert gen.calls[0] == 2  # the first batch held both remaining questions


def test_registered_baselines_run_on_the_engine():
    qs = [Question(str(i), f"capital of {c}?", answers=["x"]) for i, c in enumerate(["France", "Italy"])]
    engine, gen, ret = make(qs)
    spec = get_method("sr-rag")
    out = engine.run(qs, spec.program, spec.params({"k": 2}))
    assert gen.calls == [2] and ret.calls == [2]
    assert [d["title"] for d in out[0].trace.retrieved][:1] == ["Paris"]
    assert len(out[0].answer.used_docs) == 2
    spec = get_method("no-retrieval")
    out = engine.run(qs, spec.program, spec.params())
    assert out[0].trace.retrieval_calls == 0 and out[0].answer.retrieval_triggered is False


class FakeScorerEmbedder:
    def __init__(self):
        self.score_calls, self.embed_calls = [], []

    def score(self, items, classifier="default"):
        self.score_calls.append((classifier, len(items)))
        return [float(len(" ".join(it))) for it in items]

    def embed(self, texts, model=None):
        import numpy as np

        self.embed_calls.append(len(texts))
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def score_and_embed(q: Question, params):
    from pipeline.engine.requests import Embed, Score

    vecs = yield Embed([q.question, "pseudo " + q.question])
    scores = yield Score([(q.question, "d1"), (q.question, "d1", "d2")], classifier="c")
    return Answer(f"{vecs.shape[0]}:{scores[1] - scores[0]:.0f}")


def test_score_and_embed_requests_are_batched():
    fake = FakeScorerEmbedder()
    engine = Engine(Backends(DynragConfig(), generator=RecordingGenerator(), scorer=fake, embedder=fake))
    qs = [Question(str(i), "q" * (i + 1)) for i in range(5)]
    out = engine.run(qs, score_and_embed, None)
    assert fake.embed_calls == [10] and fake.score_calls == [("c", 10)]
    assert [o.answer.prediction for o in out] == ["2:3"] * 5
    assert out[0].trace.classifier_calls == 2 and out[0].trace.embedding_calls == 2


def test_sentence_embedder_on_packaged_minilm(cache_dir):
    from pipeline.assets.models import is_prepared

    if not is_prepared("all-minilm-l6-v2", cache_dir):
        pytest.skip("all-minilm-l6-v2 not prepared")
    from pipeline.backends.embedding import SentenceEmbedder

    vecs = SentenceEmbedder(DynragConfig()).embed(
        ["Paris is in France.", "The capital of France is Paris.", "Bananas."]
    )
    assert vecs.shape == (3, 384)
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2])


def test_sentence_embedder_takes_the_index_test_encoder():
    """`embedding.model=hash` (an index built with the test encoder) serves the methods' embeddings too: the
    same vectors as the index's HashEncoder, not a model lookup that fails."""
    import numpy as np

    from indexing.shards.embed import HashEncoder
    from pipeline.backends.embedding import SentenceEmbedder

    cfg = DynragConfig()
    cfg.embedding.model = "hash"
    texts = ["Paris is in France.", "The capital of France is Paris.", "Bananas."]
    vecs = SentenceEmbedder(cfg).embed(texts)
    assert vecs.shape == (3, 384) and np.array_equal(vecs, HashEncoder().encode(texts))
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2])  # shared words are near


class Store:
    """A named backend: records its batches; `lookup` returns each item's length, `boom` fails on 'x'."""

    instances: list["Store"] = []

    def __init__(self, cfg, backends):
        self.batches: list[int] = []
        Store.instances.append(self)

    def lookup(self, items):
        self.batches.append(len(items))
        if "x" in items:
            raise ValueError("cannot look up 'x'")
        return [len(it) for it in items]


def with_calls(q: Question, params):
    from pipeline.engine.requests import Call

    first = yield Call("test-store", "lookup", [q.question, q.question * 2], stage="retrieval")
    second = yield Call("test-store", "lookup", [q.question])
    return Answer(f"{first[0]}+{first[1]}+{second[0]}")


def test_call_requests_reach_a_registered_backend_batched_and_isolated():
    from pipeline.backends import register_backend

    register_backend("test-store")(Store)
    Store.instances.clear()
    engine = Engine(Backends(DynragConfig(), generator=RecordingGenerator()))
    qs = [Question(str(i), "a" * (i + 1)) for i in range(4)] + [Question("bad", "x")]
    out = engine.run(qs, with_calls, None)
    assert len(Store.instances) == 1  # built once, on first use
    # one batch of 10 items fails because of 'x' -> retried per question; then one batch of 4
    assert Store.instances[0].batches == [10, 2, 2, 2, 2, 2, 4]
    assert [o.answer.prediction for o in out[:4]] == ["1+2+1", "2+4+2", "3+6+3", "4+8+4"]
    assert out[4].answer is None and "cannot look up" in out[4].error
    assert out[0].trace.backend_calls == {"test-store.lookup": 3}
    assert out[0].trace.time["retrieval"] > 0


def test_call_to_an_unknown_backend_or_operation_is_that_question_error():
    from pipeline.engine.requests import Call

    def prog(q, params):
        yield Call("no-such-backend" if q.id == "a" else "test-store", "lookup" if q.id == "a" else "_private", ["i"])
        return Answer("never")

    from pipeline.backends import register_backend

    register_backend("test-store")(Store)
    out = Engine(Backends(DynragConfig())).run([Question("a", "q"), Question("b", "q")], prog, None)
    assert "no backend 'no-such-backend'" in out[0].error
    assert "no operation '_private'" in out[1].error


class TickingGenerator(RecordingGenerator):
    """Each generate call takes one tick of a fake clock."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def generate(self, prompts, samplings, chats):
        self.now += 1.0
        return super().generate(prompts, samplings, chats)


def rounds(q: Question, params):
    """As many generate rounds as the question's text says."""
    for _ in range(int(q.question)):
        out = (yield Generate([q.question]))[0]
    return Answer(out.text)


def test_latency_is_each_questions_own_wall_time():
    gen = TickingGenerator()
    engine = Engine(Backends(DynragConfig(), generator=gen), clock=gen.clock)
    out = engine.run([Question("one", "1"), Question("four", "4")], rounds, None)
    assert gen.calls == [2, 1, 1, 1]
    # the one-round question finished after the first call, the other after the fourth; their cost
    # shares (time_total_s) are not their latencies: they split the first call between them
    assert [o.trace.latency_s for o in out] == [1.0, 4.0]
    assert [o.trace.time["generation"] for o in out] == [0.5, 3.5]


def test_retrieved_documents_are_timed_on_the_engine_clock():
    """`at_s`: when, in its question, a document was retrieved: after the first generate call's tick."""
    gen = TickingGenerator()
    engine = Engine(Backends(DynragConfig(), generator=gen, retriever=MemoryRetriever(PASSAGES)), clock=gen.clock)
    out = engine.run([Question("q", "capital of France?")], two_round, None)
    assert out[0].error is None and out[0].trace.retrieved
    assert {d["at_s"] for d in out[0].trace.retrieved} == {1.0}
    assert out[0].trace.latency_s == 2.0


def test_retrieval_only_runs_count_no_llm_calls():
    """generation.backend=none: the programs still yield their prompts, but no model runs: 0 LLM calls."""
    from pipeline.backends import NoGenerator

    qs = [Question(str(i), f"capital of {c}?") for i, c in enumerate(["France", "Italy"])]
    engine = Engine(Backends(DynragConfig(), generator=NoGenerator(), retriever=MemoryRetriever(PASSAGES)))
    out = engine.run(qs, two_round, None)
    assert all(o.error is None for o in out)
    assert [(o.trace.llm_calls, o.trace.retrieval_calls) for o in out] == [(0, 2), (0, 2)]


def test_stream_batches_are_the_lockstep_waves_or_chunks_of_the_stream():
    gen = TickingGenerator()
    engine = Engine(Backends(DynragConfig(), generator=gen), batch_questions=2)
    qs = [Question(str(i), str(1 + i % 2)) for i in range(5)]
    waves = list(engine.stream_batches(qs, rounds, None, 2))
    assert [[o.question.id for o in w] for w in waves] == [["0", "1"], ["2", "3"], ["4"]]
    assert gen.calls == [2, 1, 2, 1, 1]  # each wave ran on its own
    chunks = list(engine.stream_batches(qs, rounds, None, 3))  # not the waves: the stream cut in threes
    assert [len(c) for c in chunks] == [3, 2] and sorted(o.question.id for c in chunks for o in c) == list("01234")
