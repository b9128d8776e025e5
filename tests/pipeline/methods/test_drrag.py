"""DR-RAG's selection rules (Eqs. 1, 3, 4; Algorithm 1) on hand-made cases, and the programs through the engine."""

import pytest
from fakes import RecordingGenerator

from indexing.search.hits import Hit
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Question
from pipeline.methods.drrag import cfs_walk, cis_keep, concat_query, qdc_select
from pipeline.methods.registry import get_method

# -- Eq. (1): QDC ------------------------------------------------------------------------------------


def test_qdc_adds_the_first_id_not_already_in_the_context_from_each_list():
    first = ["a", "b"]
    # list of a: starts with a itself (in Cnt) -> c; list of b: b, then c (added by a's list) -> d
    second = [["a", "c", "x"], ["b", "c", "d"]]
    assert qdc_select(first, second, k=4) == ["a", "b", "c", "d"]


def test_qdc_stops_at_k_and_skips_a_list_with_nothing_new():
    assert qdc_select(["a", "b"], [["a", "c"], ["b", "d"]], k=3) == ["a", "b", "c"]
    assert qdc_select(["a", "b"], [["a", "b"], ["b", "d"]], k=4) == ["a", "b", "d"]
    assert qdc_select(["a", "b", "c"], [["z"], ["y"], ["x"]], k=2) == ["a", "b"]


# -- Eq. (3): CIS --------------------------------------------------------------------------------------


def test_cis_drops_second_stage_docs_negative_with_every_first_stage_doc():
    first, selected = ["a", "b"], ["a", "b", "c", "d", "e"]
    positive = {("c", "b"): True, ("d", "a"): False, ("d", "b"): False, ("e", "a"): True}
    seen = []

    def pos(d, di):
        seen.append((d, di))
        return positive.get((d, di), False)

    assert cis_keep(first, selected, pos) == ["a", "b", "c", "e"]
    # the first-stage documents themselves are never classified (Eq. 3 removes only d'_{i,j})
    assert all(d not in first for d, _ in seen)
    # argument order: C(q, d'_{i,j}, d_i)
    assert ("c", "b") in seen and ("b", "c") not in seen


# -- Eq. (4) / Algorithm 1: CFS ----------------------------------------------------------------------------


def test_cfs_takes_the_first_positive_of_each_list_and_skips_docs_already_in_context():
    first = ["a", "b"]
    second = [["a", "x", "c", "y"], ["b", "c", "d", "z"]]
    pos = {(0, "x"): False, (0, "c"): True, (0, "y"): True, (1, "d"): True, (1, "z"): True}
    asked = []

    def verdict(i, d):
        asked.append((i, d))
        return pos.get((i, d), False)

    chosen, blocked = cfs_walk(first, second, k=6, verdict=verdict)
    assert blocked is None
    # list 0: x negative, c positive -> c (y never asked: early stop); list 1: c already in -> d
    assert chosen == ["a", "b", "c", "d"]
    assert asked == [(0, "x"), (0, "c"), (1, "d")]


def test_cfs_may_end_with_fewer_than_k_and_never_exceeds_k():
    chosen, _ = cfs_walk(["a", "b"], [["x", "y"], ["z"]], k=4, verdict=lambda i, d: False)
    assert chosen == ["a", "b"]
    chosen, _ = cfs_walk(["a", "b"], [["x"], ["y"]], k=3, verdict=lambda i, d: True)
    assert chosen == ["a", "b", "x"]


def test_cfs_reports_the_list_that_needs_a_verdict():
    known = {(0, "x"): False}
    chosen, blocked = cfs_walk(["a", "b"], [["x", "y"], ["z"]], k=4, verdict=lambda i, d: known.get((i, d)))
    assert blocked == 0 and chosen == ["a", "b"]
    known.update({(0, "y"): True})
    chosen, blocked = cfs_walk(["a", "b"], [["x", "y"], ["z"]], k=4, verdict=lambda i, d: known.get((i, d)))
    assert blocked == 1 and chosen == ["a", "b", "y"]


# -- the programs through the engine -------------------------------------------------------------------

DOCS = {i: Hit(i, f"T{i}", f"text {i}", 1.0) for i in "abcdexyz"}


class ScriptedRetriever:
    """The question alone retrieves a, b, c...; Concat(q, d_i) retrieves d_i first, then a fixed list."""

    LISTS = {"a": ["a", "x", "c", "y"], "b": ["b", "c", "d", "z"]}

    def __init__(self):
        self.calls = []

    def search(self, queries, k, retriever):
        self.calls.append((len(queries), k, retriever))
        out = []
        for q in queries:
            hit = next((d for d in "ab" if q.endswith(f"T{d}: text {d}")), None)
            ids = self.LISTS[hit] if hit else ["a", "b", "c", "d", "e"]
            out.append([DOCS[i] for i in ids[:k]])
        return out


class TripleScorer:
    """P(positive) = 0.9 for triples listed in `positive` (by titles), else 0.1; records batch sizes."""

    def __init__(self, positive):
        self.positive = positive
        self.calls = []

    def score(self, items, classifier):
        self.calls.append(len(items))
        key = lambda it: tuple(s.split(":")[0] for s in it[1:])  # noqa: E731  ("Ta: text a" -> "Ta")
        return [0.9 if key(it) in self.positive else 0.1 for it in items]


def run(method, params, positive=()):
    gen = RecordingGenerator(reply=lambda p: "Answer: T-answer")
    ret, scorer = ScriptedRetriever(), TripleScorer(set(positive))
    engine = Engine(Backends(DynragConfig(), generator=gen, retriever=ret, scorer=scorer))
    spec = get_method(method)
    qs = [Question(str(i), f"question {i}") for i in range(5)]
    out = engine.run(qs, spec.program, spec.params(params))
    assert all(o.error is None for o in out), [o.error for o in out]
    return out, gen, ret, scorer


@pytest.mark.parametrize("method", ["bm25", "sm", "qdc", "cis", "cfs"])
def test_every_drrag_method_makes_exactly_one_llm_call_per_question(method):
    out, gen, ret, _ = run(method, {"k": 4}, positive={("Ta", "Tx")})
    assert gen.calls == [5]  # one batched generate over the 5 questions
    assert all(o.trace.llm_calls == 1 for o in out)
    assert all(o.answer.prediction == "T-answer" for o in out)


def test_qdc_cis_cfs_programs_select_as_the_equations_say():
    # list a = [a, x, c, y] adds x; list b = [b, c, d, z] adds c
    out, *_ = run("qdc", {"k": 4, "k1": 2})
    assert [h.id for h in out[0].answer.used_docs] == ["a", "b", "x", "c"]
    # CIS: c is positive with b (C(q, c, b)), x with nothing -> x dropped
    out, _, _, scorer = run("cis", {"k": 4, "k1": 2}, positive={("Tc", "Tb")})
    assert [h.id for h in out[0].answer.used_docs] == ["a", "b", "c"]
    assert scorer.calls == [5 * 2 * 2]  # 2 second-stage docs x 2 first-stage docs, all questions in one call
    # CFS: list a: x negative, c positive -> c; list b: c in context, d negative, z positive -> z
    out, _, _, scorer = run("cfs", {"k": 4, "k1": 2, "score_window": 1}, positive={("Ta", "Tc"), ("Tb", "Tz")})
    assert [h.id for h in out[0].answer.used_docs] == ["a", "b", "c", "z"]
    assert out[0].answer.extra["strategy"] == "cfs"
    assert out[0].trace.classifier_calls == out[0].answer.extra["classified"]
    # (d_i title, candidate title, P) in the order Algorithm 1 classifies: list a's x, c; list b skips c (in the
    # context) and asks d, z. Nothing else is classified.
    judged = out[0].answer.extra["judged"]
    assert [(a, b) for a, b, _, *_ in judged] == [("Ta", "Tx"), ("Ta", "Tc"), ("Tb", "Td"), ("Tb", "Tz")]
    assert [p >= 0.5 for _, _, p, *_ in judged] == [False, True, False, True]
    # and the two documents' ids, which the classifier AUC labels by (as recall counts paragraphs)
    assert [(e[3], e[4]) for e in judged] == [("a", "x"), ("a", "c"), ("b", "d"), ("b", "z")]
    out, *_ = run("cis", {"k": 4, "k1": 2}, positive={("Tc", "Tb")})
    # CIS asks C(q, d', d_i) for every added d' (x, c) and first-stage d_i (a, b)
    assert [(e[0], e[1], e[3], e[4]) for e in out[0].answer.extra["judged"]] == [
        ("Ta", "Tx", "a", "x"),
        ("Tb", "Tx", "b", "x"),
        ("Ta", "Tc", "a", "c"),
        ("Tb", "Tc", "b", "c"),
    ]


def test_cfs_at_k3_never_classifies_the_list_it_does_not_walk():
    # k = 3, k1 = ceil(3/2) = 2: list a (x negative, c positive) fills the context, so list b is never
    # walked and never scored: 2 classifier calls per question (the earlier code asked 6: a's and b's windows)
    out, _, _, scorer = run("cfs", {"k": 3}, positive={("Ta", "Tc")})
    for o in out:
        assert [h.id for h in o.answer.used_docs] == ["a", "b", "c"]
        assert [(a, b) for a, b, _, *_ in o.answer.extra["judged"]] == [("Ta", "Tx"), ("Ta", "Tc")]
        assert o.trace.classifier_calls == 2
    assert scorer.calls == [5, 5]  # two rounds, each one batched call over the 5 questions
    # a wider window saves rounds but stays inside the walked list: a's x, c, y, never b's
    out, _, _, scorer = run("cfs", {"k": 3, "score_window": 3}, positive={("Ta", "Tc")})
    assert [(a, b) for a, b, _, *_ in out[0].answer.extra["judged"]] == [("Ta", "Tx"), ("Ta", "Tc"), ("Ta", "Ty")]
    assert scorer.calls == [15]


def test_cfs_retrieves_second_stage_with_concatenated_queries_in_one_batch():
    out, _, ret, _ = run("cfs", {"k": 4, "k1": 2, "depth": 4}, positive={("Ta", "Tx")})
    # first stage: 5 questions in one search; second stage: 2 concatenated queries x 5 questions in one search
    assert ret.calls == [(5, 2, "dense"), (10, 4, "dense")]
    assert concat_query("q?", DOCS["a"]) == "q? Ta: text a"


def test_k1_larger_than_k_is_refused():
    from pipeline.methods.registry import MethodError

    with pytest.raises(MethodError, match="k1=5 exceeds k=3"):
        get_method("qdc").params({"k": 3, "k1": 5})


def test_table5_rendering_and_the_papers_ordering_check():
    from jobs.cli import csv_choice
    from jobs.eval.drrag import ordering, table
    from pipeline.errors import DynragError

    def row(m, recall, docs):
        return {"dataset": "hotpotqa", "k": 4, "method": m, "recall": recall, "docs": docs, "em": None, "f1": None}

    rows = [
        row("bm25", 0.5, 4.0),
        row("sm", 0.6, 4.0),
        row("qdc", 0.7, 4.0),
        row("cis", 0.7, 3.5),
        row("cfs", 0.75, 3.6),
    ]
    text = table(rows, generate=False)
    assert "| 4 | Classifier Forward Selection | 75.00 | 3.60 |" in text
    assert ordering(rows) == [
        "hotpotqa k=4, by the means (the intervals below say which differences hold): BM25<SM<QDC<=CFS holds; CFS above SM with fewer documents: yes"
    ]
    rows[1]["recall"] = 0.8  # SM above QDC and CFS: neither claim holds
    assert ordering(rows) == [
        "hotpotqa k=4, by the means (the intervals below say which differences hold): BM25<SM<QDC<=CFS does not hold; CFS above SM with fewer documents: no"
    ]
    assert csv_choice("hotpotqa, musique", ["hotpotqa", "musique"]) == ["hotpotqa", "musique"]
    with pytest.raises(DynragError, match="pick from"):
        csv_choice("hotpot", ["hotpotqa"])


def test_rank_auc_worked_example():
    from pipeline.classifier.train import rank_auc

    # pos {0.9, 0.4}, neg {0.5, 0.4, 0.1}: pairs won 0.9>all (3) + 0.4>0.1 (1) + tie 0.4=0.4 (0.5) = 4.5 of 6
    assert rank_auc([0.9, 0.4, 0.5, 0.4, 0.1], [True, True, False, False, False]) == pytest.approx(0.75)
    assert rank_auc([0.3, 0.2], [True, True]) is None


def test_eval_drrag_takes_any_dev_file_with_supporting_labels(data_dir, tmp_path, capsys):
    import json as _json

    from jobs.cli import main

    lines = (data_dir / "musique" / "dev_150.jsonl").read_text().splitlines()[:2]  # the fixture kit holds 2
    assert len(lines) == 2
    dev = tmp_path / "my_dev.jsonl"
    dev.write_text("\n".join(lines) + "\n")
    common = [
        "--k",
        "3",
        "--methods",
        "bm25,qdc",
        "--set",
        "embedding.model=hash",
        "--set",
        "method.params.retriever=bm25",
    ]
    assert (
        main(
            [
                "eval-drrag",
                "--dataset",
                str(dev),
                "--dataset-format",
                "musique",
                "--out",
                str(tmp_path / "out"),
                *common,
            ]
        )
        == 0
    )
    rows = _json.loads((tmp_path / "out" / "table5.json").read_text())
    assert {(r["dataset"], r["method"], r["questions"]) for r in rows} == {("my_dev", "bm25", 2), ("my_dev", "qdc", 2)}
    assert all(0 < r["recall"] <= 1 and r["docs"] == 3 for r in rows)  # MuSiQue labels its supporting paragraphs
    intervals = (tmp_path / "out" / "table5.md").read_text().split("k=3, against BM25:")[1]
    assert "Δgold-doc recall [95% CI]" in intervals and "| qdc-k3 | 2 |" in intervals and "EM" not in intervals
    # the same questions without labels: a one-line error, not a table of blanks
    bare = tmp_path / "bare.jsonl"
    bare.write_text(
        "\n".join(_json.dumps({"id": f"b{i}", "question": "who?", "answers": ["x"]}) for i in range(2)) + "\n"
    )
    assert main(["eval-drrag", "--dataset", str(bare), "--out", str(tmp_path / "out2"), *common[:4]]) == 2
    assert "no supporting-paragraph labels" in capsys.readouterr().err


def test_classifier_auc_labels_judged_pairs_by_paragraph_id_as_recall_does():
    """MuSiQue gives several paragraphs one title: a pair is positive only when both documents are cut from gold
    paragraphs (ids up to the #i chunk suffix), as support_recall counts them; titles only where ids are unknown."""
    import json as _json

    from jobs.eval.drrag import judged_pairs
    from pipeline.text.metrics import is_gold_document

    golds = {"q1": (["Paris", "France"], ["pParis1", "pFrance"])}
    judged = [
        ["Paris", "France", 0.9, "pParis1#0", "pFrance"],  # both gold paragraphs (a passage of the first)
        ["Paris", "France", 0.8, "pParis2", "pFrance"],  # another "Paris" paragraph: not gold
        ["Paris", "France", 0.3],
    ]  # an entry without ids (older rows): by title
    rows = [
        {"question_id": "q1", "extra": _json.dumps({"judged": judged}), "gold_supporting_titles": ["Paris", "France"]},
        {
            "question_id": "q2",
            "extra": _json.dumps({"judged": [["A", "B", 0.5, "x", "y"]]}),
            "gold_supporting_titles": ["A", "B"],
        },  # not in golds: the row's titles
        {"question_id": "q3", "extra": None, "gold_supporting_titles": []},
    ]
    scores, labels = judged_pairs(rows, golds)
    assert scores == [0.9, 0.8, 0.3, 0.5] and labels == [True, False, True, True]
    assert is_gold_document("pParis1#3", "Paris", *golds["q1"]) and not is_gold_document(
        "pParis2", "Paris", *golds["q1"]
    )
    assert is_gold_document("zz", "Paris", ["Paris"], [""])  # a gold known by title alone


def test_eval_drrag_indexes_an_ircot_file_named_by_its_question_format(data_dir, tmp_path):
    """--dataset-format hotpotqa-ircot names the question format; the corpus reader has no such name and detects the
    file itself (IRCoT's `contexts` are HotpotQA paragraphs)."""
    import json as _json

    from jobs.cli import main

    lines = (data_dir / "hotpotqa" / "dev_400.jsonl").read_text().splitlines()[:2]
    dev = tmp_path / "ircot_dev.jsonl"
    dev.write_text("\n".join(lines) + "\n")
    assert (
        main(
            [
                "eval-drrag",
                "--dataset",
                str(dev),
                "--dataset-format",
                "hotpotqa-ircot",
                "--out",
                str(tmp_path / "out"),
                "--k",
                "3",
                "--methods",
                "bm25",
                "--set",
                "embedding.model=hash",
            ]
        )
        == 0
    )
    rows = _json.loads((tmp_path / "out" / "table5.json").read_text())
    assert [(r["dataset"], r["method"], r["questions"]) for r in rows] == [("ircot_dev", "bm25", 2)]
    assert 0 < rows[0]["recall"] <= 1
