"""ERM4's reservoir belongs to a run (issue 32): the same command in fresh outputs gives the same rows, a
resumed run keeps its reservoir, a shared one is named in the run's configuration and serves one job at a
time; and the memory path as the authors' code has it (Components.py, RetrievalTrigger): memory knowledge
is every title at S >= tau of a query with Pop >= theta, it passes the Knowledge Filter, and what the filter
kept is what gets cached."""

import json
import re

import numpy as np
import pytest
import yaml
from erm4_fakes import PASSAGES, WordEmbedder, reply
from fakes import MemoryRetriever, RecordingGenerator

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Question
from pipeline.io.output import read_rows
from pipeline.io.output_lock import StateBusyError
from pipeline.methods.registry import MethodError, get_method
from pipeline.methods.reservoir import RUN_RESERVOIR, Knowledge, Reservoir
from pipeline.runtime.answer import run_answer

QUESTIONS = [
    "who directed the film that won best picture in 1998?",
    "what is the capital of Italy?",
    "Could you tell me: who directed the film that won best picture in 1998?",
]
# the fake rewriter gives every question the queries "Titanic film", "James Cameron director", "Academy Awards
# 1998"; the filter keeps knowledge naming Cameron. tau 0.3, theta 1: once "James Cameron" is cached (S = 0.82
# with the second query), that query is answered from memory
PARAMS = {"k": 2, "tau": 0.3, "theta": 1}
# what may differ between two runs of the same command: the run id and the clocks (also each document's at_s)
VOLATILE = re.compile(
    r"^(run_id|time_.*|latency_s|finished_at|retrieval_cache_hits)$"
)  # cache hits: which run searched first


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": q, "answers": ["James Cameron"]}) + "\n"
            for i, q in enumerate(QUESTIONS)
        )
    )
    return str(path)


def config(tmp_path, params=PARAMS):
    cfg = DynragConfig()
    cfg.paths.cache_dir = str(tmp_path / "cache")  # where the reservoir lived before: no run may use it now
    cfg.method.name = "erm4"
    cfg.method.params = dict(params)
    cfg.answer.engine = "lockstep"  # one question per batch, in order: each sees the pairs of those before it
    cfg.answer.batch_questions = 1
    cfg.answer.progress = False
    return cfg


def fake_backends(cfg, generator=None):
    gen = generator or RecordingGenerator(reply)
    return Backends(cfg, generator=gen, retriever=MemoryRetriever(PASSAGES), embedder=WordEmbedder())


def rows_of(out) -> list[dict]:
    table = read_rows(str(out))
    keep = [c for c in table.column_names if not VOLATILE.match(c)]
    rows = sorted(table.select(keep).to_pylist(), key=lambda r: r["question_id"])
    for r in rows:
        r["retrieved"] = [{k: v for k, v in d.items() if k != "at_s"} for d in r["retrieved"]]
    return rows


def memory_queries(rows) -> dict[str, list[int]]:
    return {r["question_id"]: json.loads(r["extra"])["memory_queries"] for r in rows}


def test_two_runs_of_the_same_command_in_fresh_outputs_give_identical_rows(dataset, tmp_path):
    cfg = config(tmp_path)
    backends = fake_backends(cfg)  # one process, one set of backends: as `dynrag answer` twice on one machine
    for name in ("a", "b"):
        run_answer(dataset, str(tmp_path / name), cfg=cfg, backends=backends)
    first, second = rows_of(tmp_path / "a"), rows_of(tmp_path / "b")
    assert first == second
    # each run's reservoir started empty and filled from its own questions: the first question found nothing
    assert memory_queries(first) == {"q0": [], "q1": [1], "q2": [1]}
    for name in ("a", "b"):
        assert Reservoir(tmp_path / name / RUN_RESERVOIR).get("James Cameron") == (
            "James Cameron directed Titanic.",
            "p2",
        )
    assert not (tmp_path / "cache" / "erm4").exists()


def test_a_resumed_run_keeps_its_reservoir(dataset, tmp_path, monkeypatch):
    cfg = config(tmp_path)
    out = tmp_path / "run"

    def stop_after_the_first_part(name, until=None):
        if name == "answer.part_written":
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr("pipeline.runtime.answer.fault_point", stop_after_the_first_part)
    with pytest.raises(KeyboardInterrupt):
        run_answer(dataset, str(out), cfg=cfg, backends=fake_backends(cfg))
    assert [r["question_id"] for r in rows_of(out)] == ["q0"]
    assert len(Reservoir(out / RUN_RESERVOIR)) == 1  # the first question's kept pair
    monkeypatch.undo()
    gen = RecordingGenerator(reply)
    summary = run_answer(dataset, str(out), cfg=cfg, backends=fake_backends(cfg, gen))
    assert summary["skipped_already_answered"] == 1
    resumed = rows_of(out)
    # the second part sees the first part's pair: its questions answer "James Cameron director" from memory
    assert memory_queries(resumed) == {"q0": [], "q1": [1], "q2": [1]}
    # and the rows are those of a run that was never stopped
    run_answer(dataset, str(tmp_path / "straight"), cfg=cfg, backends=fake_backends(cfg))
    assert resumed == rows_of(tmp_path / "straight")


def test_a_shared_reservoir_is_named_in_the_run_configuration(dataset, tmp_path):
    shared = str(tmp_path / "shared" / "reservoir.sqlite")
    cfg = config(tmp_path, {**PARAMS, "reservoir_path": shared})
    run_answer(dataset, str(tmp_path / "a"), cfg=cfg, backends=fake_backends(cfg))
    resolved = yaml.safe_load((tmp_path / "a" / "config.resolved.yaml").read_text())
    assert resolved["method"]["params"]["reservoir_path"] == shared
    run_json = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run_json["settings"]["params"]["reservoir_path"] == shared
    assert not (tmp_path / "a" / RUN_RESERVOIR).exists() and len(Reservoir(shared)) == 1
    assert not (tmp_path / "shared" / "reservoir.sqlite.lock").exists()  # released at the end
    # a second run on it starts from the first one's pairs (that is what sharing means)
    run_answer(dataset, str(tmp_path / "b"), cfg=cfg, backends=fake_backends(cfg))
    assert memory_queries(rows_of(tmp_path / "b"))["q0"] == [1]
    # the run's own reservoir is recorded as null: the same command in another folder has the same config hash
    own = config(tmp_path)
    run_answer(dataset, str(tmp_path / "c"), cfg=own, backends=fake_backends(own))
    resolved = yaml.safe_load((tmp_path / "c" / "config.resolved.yaml").read_text())
    assert "reservoir_path" not in resolved["method"]["params"]
    assert json.loads((tmp_path / "c" / "run.json").read_text())["settings"]["params"]["reservoir_path"] is None
    assert (tmp_path / "c" / RUN_RESERVOIR).is_file()


def test_two_jobs_on_one_shared_reservoir_the_second_is_refused(dataset, tmp_path):
    shared = str(tmp_path / "reservoir.sqlite")
    cfg = config(tmp_path, {**PARAMS, "reservoir_path": shared})
    refused: list[BaseException] = []

    def start_another_job(prompt):  # runs while the first job holds the reservoir
        if not refused:
            other = tmp_path / "second"
            with pytest.raises(StateBusyError) as err:
                run_answer(dataset, str(other), cfg=cfg, backends=fake_backends(cfg))
            refused.append(err.value)
            assert not other.exists()  # refused before writing anything
        return reply(prompt)

    run_answer(
        dataset, str(tmp_path / "first"), cfg=cfg, backends=fake_backends(cfg, RecordingGenerator(start_another_job))
    )
    assert len(refused) == 1
    msg = str(refused[0])
    assert msg.startswith(f"{shared} is in use by another job (pid ") and "\n" not in msg
    # a job naming another running job's own reservoir is refused the same way
    own = config(tmp_path)
    checked: list[str] = []

    def name_its_reservoir(prompt):
        if not checked:
            named = config(tmp_path, {**PARAMS, "reservoir_path": str(tmp_path / "own" / RUN_RESERVOIR)})
            with pytest.raises(StateBusyError):
                run_answer(dataset, str(tmp_path / "reader"), cfg=named, backends=fake_backends(named))
            checked.append("refused")
        return reply(prompt)

    run_answer(
        dataset, str(tmp_path / "own"), cfg=own, backends=fake_backends(own, RecordingGenerator(name_its_reservoir))
    )
    assert checked == ["refused"]
    # once the first job has ended, the reservoir is free
    run_answer(dataset, str(tmp_path / "second"), cfg=cfg, backends=fake_backends(cfg))


def test_the_run_reservoir_needs_a_local_output(dataset, tmp_path):
    params = get_method("erm4").params(PARAMS)
    with pytest.raises(MethodError, match="reservoir_path"):
        params.for_output("s3://bucket/run")
    assert get_method("erm4").params({**PARAMS, "reservoir": False}).for_output("s3://bucket/run").state_files() == []


# -- the memory path, a worked example ----------------------------------------------------------------------

CACHED = [  # (title, content): what earlier questions' filters kept
    ("Titanic (1997 film)", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("Titanic (1953 film)", "The 1953 Titanic was directed by Jean Negulesco."),
    ("Titanic film score", "James Horner wrote the score."),
    ("Rome", "Rome is the capital of Italy."),
    ("James Cameron", "James Cameron was born in Kapuskasing."),
]


class NliLog(RecordingGenerator):
    def __init__(self):
        super().__init__(reply)
        self.judged: list[str] = []  # the knowledge of every NLI prompt

    def generate(self, prompts, samplings, chats):
        self.judged += [str(p).split("[Knowledge]:")[-1] for p in prompts if "NLI problem" in str(p)]
        return super().generate(prompts, samplings, chats)


def test_memory_path_follows_the_authors_code(tmp_path):
    """Queries "Titanic film", "James Cameron director", "Academy Awards 1998" against the cached titles with
    bag-of-words cosine: the three Titanic titles are at S = 1.0 with the first query, "James Cameron" at
    S = 2.01 / sqrt(3.01 * 2.01) = 0.82 with the second, nothing near the third."""
    emb = WordEmbedder()
    store = str(tmp_path / "reservoir.sqlite")
    vecs = emb.embed([t for t, _ in CACHED])
    Reservoir(store).upsert([Knowledge(t, c, v, f"old{i}") for i, ((t, c), v) in enumerate(zip(CACHED, vecs))])
    q = Question("1", QUESTIONS[0], answers=["James Cameron"])

    def answer(tau, theta):
        cfg = DynragConfig()
        gen, ret = NliLog(), MemoryRetriever(PASSAGES)
        engine = Engine(Backends(cfg, generator=gen, retriever=ret, embedder=emb))
        spec = get_method("erm4")
        params = spec.params({"k": 2, "tau": tau, "theta": theta, "reservoir_path": store, "update_reservoir": False})
        (o,) = engine.run([q], spec.program, params)
        assert o.error is None, o.error
        return o.answer.extra, gen, ret

    # tau 0.9, theta 3: Pop = [3, 0, 0]; the first query takes all three Titanic pairs (no top-k), the other
    # two are retrieved
    ex, gen, ret = answer(0.9, 3)
    assert ex["popularity"] == [3, 0, 0] and ex["memory_queries"] == [0] and ex["memory_knowledge"] == 3
    assert ret.calls == [2]
    # every piece of knowledge, memory included, is judged by the filter: one NLI call each
    assert len(gen.judged) == ex["memory_knowledge"] + ex["external_knowledge"]
    assert sum("Jean Negulesco" in k or "James Horner" in k for k in gen.judged) == 2
    assert ex["irrelevant_knowledge"] == len(gen.judged) - sum("Cameron" in k for k in gen.judged)
    # theta 4 > Pop: no query is in the boundary, no memory knowledge is judged
    ex, gen, _ = answer(0.9, 4)
    assert ex["memory_queries"] == [] and not any("Negulesco" in k for k in gen.judged)
    # tau 0.8, theta 1: "James Cameron" (0.82) joins for the second query, "Rome" never qualifies
    ex, gen, ret = answer(0.8, 1)
    assert ex["popularity"] == [3, 1, 0] and ex["memory_queries"] == [0, 1] and ret.calls == [1]
    assert any("Kapuskasing" in k for k in gen.judged) and not any("capital of Italy" in k for k in gen.judged)


def test_the_reservoir_caches_what_the_filter_kept(tmp_path):
    """The authors' reservoir is the past questions' `filtered knowledge`: external knowledge the filter
    dropped is not cached, kept knowledge replaces the older pair of its title."""
    emb = WordEmbedder()
    store = str(tmp_path / "reservoir.sqlite")
    Reservoir(store).upsert(
        [Knowledge("James Cameron", "James Cameron was born in Kapuskasing.", emb.embed(["James Cameron"])[0])]
    )
    cfg = DynragConfig()
    engine = Engine(
        Backends(cfg, generator=RecordingGenerator(reply), retriever=MemoryRetriever(PASSAGES), embedder=emb)
    )
    spec = get_method("erm4")
    params = spec.params({"k": 2, "tau": 0.99, "theta": 1, "reservoir_path": store})
    (o,) = engine.run([Question("1", QUESTIONS[0])], spec.program, params)
    retrieved = {d["title"] for d in o.trace.retrieved}
    assert {"Titanic (1997 film)", "Academy Awards"} <= retrieved  # retrieved, judged neutral (no Cameron)
    after = Reservoir(store)
    assert after.get("Titanic (1997 film)") is None and after.get("Academy Awards") is None
    assert after.get("James Cameron") == ("James Cameron directed Titanic.", "p2") and len(after) == 1
    np.testing.assert_allclose(after.similarities(emb.embed(["James Cameron"]))[0], [1.0], rtol=1e-6)


def test_ray_actors_on_another_host_than_the_job_refuse_its_reservoir(tmp_path):
    """With Ray the driver holds the reservoir (state_lock); an engine actor checks it runs on that host."""
    from pipeline.errors import DynragError
    from pipeline.io.output_lock import check_same_host, state_lock

    path = str(tmp_path / "reservoir.sqlite")
    with state_lock(path):
        check_same_host(path)  # the driver's host: fine
    (tmp_path / "reservoir.sqlite.lock").write_text("pid 7 on host gpu-node-3, started 2026-01-01 00:00:00")
    with pytest.raises(DynragError, match="held by the job on another host .*gpu-node-3"):
        check_same_host(path)
