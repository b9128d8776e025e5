"""A short real training run of the DR-RAG classifier on ../shared/data, its model folder, and CLI errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jobs.cli import main
from pipeline.config import load_config

# Enough to beat the majority on 2 shared cores: about 280 training examples, short inputs, 2 epochs (86 s here).
LEARNS = [  # the cross-encoder (the default is the feature model: tests/pipeline/classifier/test_classifier_features.py)
    "classifier.model=cross-encoder",
    "classifier.max_examples=400",
    "classifier.dev_fraction=0.3",
    "classifier.epochs=2",
    "classifier.max_length=64",
    "classifier.max_query_tokens=24",
    "classifier.batch_size=8",
    "classifier.learning_rate=1e-4",
    "classifier.log_every=10",
    "classifier.threads=2",
]
# The plumbing (folder, round trip, scorer, CIS/CFS) needs a trained model, not a good one: 80 examples, 1 epoch.
QUICK = [*LEARNS, "classifier.max_examples=80", "classifier.epochs=1"]


def train(data_dir, cache_dir, out, settings):
    from pipeline.assets.models import is_prepared
    from pipeline.classifier.train import train_classifier

    if not is_prepared("all-minilm-l6-v2", cache_dir):
        pytest.skip("all-minilm-l6-v2 is not prepared (dynrag models prepare all-minilm-l6-v2)")
    cfg = load_config(None, settings + [f"paths.data_dir={data_dir}", f"paths.cache_dir={cache_dir}"])
    return out, train_classifier(cfg, out)


@pytest.fixture(scope="module")
def trained(data_dir, cache_dir, tmp_path_factory):
    return train(data_dir, cache_dir, tmp_path_factory.mktemp("clf") / "model", QUICK)


@pytest.mark.slow  # trains on 400 examples for 2 epochs: 86 s (the plumbing tests below train on 80 for 1)
@pytest.mark.kit  # ~100 train questions for 400 examples; the fixture kit holds 5 (the others here run on them)
def test_beats_majority_on_held_out_questions(data_dir, cache_dir, tmp_path):
    out, result = train(data_dir, cache_dir, tmp_path / "model", LEARNS)
    dev = result["dev"]
    assert dev["n"] >= 100
    assert dev["majority_baseline_accuracy"] == 0.5  # sampled 1:1 (App. A.1)
    assert dev["accuracy"] > dev["majority_baseline_accuracy"] + 0.05, dev
    assert set(dev["by_kind"]) == {"gold+gold", "gold+distractor", "distractor+gold", "distractor+distractor"}
    train_q = result["data"]["train"]["questions"]
    assert train_q > 0 and result["data"]["dev"]["questions"] > 0


def test_model_folder_and_round_trip(trained, tmp_path):
    from pipeline.classifier.data import load_records, make_splits
    from pipeline.classifier.model import Classifier
    from pipeline.classifier.train import evaluate

    out, result = trained
    files = set(os.listdir(out))
    assert {"encoder", "head.safetensors", "dynrag-classifier.json", "metrics.json", "config.resolved.yaml"} <= files
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(out / "encoder"))
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files | set(os.listdir(out / "encoder")))
    assert "config.json" not in files  # a plain AutoModelForSequenceClassification load fails instead of a random head
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    meta = json.loads((out / "dynrag-classifier.json").read_text())
    assert meta["max_length"] == 64 and meta["metrics"]["accuracy"] == result["dev"]["accuracy"]
    tuning = result["dev"]["threshold_tuning"]  # tuned on half of dev: saved with the model
    assert meta["threshold"] == tuning["chosen"] == result["dev"]["tuned_threshold"]
    assert tuning["calibration_n"] + tuning["held_out_n"] == result["dev"]["n"]

    clf = Classifier.load(out, device="cpu")
    # the same dev split, rebuilt from the saved config, scores exactly as it did before saving
    cfg = load_config(out / "config.resolved.yaml")
    cc = cfg.classifier
    splits = make_splits(
        load_records(cfg.paths.data_dir, cc.datasets),
        seed=cc.seed,
        dev_fraction=cc.dev_fraction,
        mixed_fraction=cc.mixed_negative_fraction,
        max_per_dataset=cc.max_examples_per_dataset,
        max_examples=cc.max_examples,
    )
    again = evaluate(clf, splits.dev, cc.threshold, 64)
    assert again["accuracy"] == result["dev"]["accuracy"] and again["tp"] == result["dev"]["tp"]

    # up to 12 triples (the fixture kit's dev split holds fewer) and a pair: pairs work too
    items = [e.item for e in splits.dev[:12]] + [(splits.dev[0].question, splits.dev[0].doc1)]
    assert len(items) > 5  # more than one batch of 5
    scores = clf.score(items, batch_size=5)
    assert scores.shape == (len(items),) and ((scores >= 0) & (scores <= 1)).all()
    clf.save(tmp_path / "copy")  # identical scores after another save/load (same batching: padding changes floats)
    assert np.array_equal(Classifier.load(tmp_path / "copy", device="cpu").score(items, batch_size=5), scores)
    assert list(clf.predict(items)) == list(scores >= meta["threshold"])
    assert list(clf.predict(items, threshold=0.0)) == [True] * len(items)


def test_scoring_backend_and_cfs_use_the_trained_folder(trained):
    """The answer job reaches the folder through Score requests: classifier.path is "default"."""
    from fakes import MemoryRetriever, RecordingGenerator

    from pipeline.backends import Backends
    from pipeline.backends.scoring import CrossEncoderScorer, ScorerError
    from pipeline.classifier.model import Classifier
    from pipeline.engine.core import Engine
    from pipeline.engine.requests import Question
    from pipeline.methods.registry import get_method

    out, _ = trained
    items = [("Who wrote it?", "A: a book by B.", "B: B was born in C."), ("Who wrote it?", "A: a book by B.")]
    scorer = CrossEncoderScorer(load_config(None, [f"classifier.path={out}", "classifier.device=cpu"]))
    expected = Classifier.load(out, device="cpu").score(items)
    assert scorer.score(items) == pytest.approx([float(x) for x in expected], abs=1e-6)
    assert scorer.score(items, str(out)) == pytest.approx(scorer.score(items))  # a folder as the name
    with pytest.raises(ScorerError, match="no classifier 'other'"):
        scorer.score(items, "other")

    passages = [
        (f"p{i}", t, x)
        for i, (t, x) in enumerate(
            [
                ("Kew Gardens", "Kew Gardens is a botanic garden in Richmond, London."),
                ("Richmond, London", "Richmond is a town in south-west London on the River Thames."),
                ("River Thames", "The River Thames flows through southern England including London."),
                ("Bananas", "Bananas are a fruit."),
            ]
        )
    ]
    cfg = load_config(None, [f"classifier.path={out}", "classifier.device=cpu"])
    gen = RecordingGenerator(reply=lambda p: "Answer: Richmond")
    engine = Engine(Backends(cfg, generator=gen, retriever=MemoryRetriever(passages)))
    spec = get_method("cfs")
    res = engine.run(
        [Question("q", "In which town is Kew Gardens?")],
        spec.program,
        spec.params({"k": 3, "k1": 1, "retriever": "bm25", "threshold": 0.01}),
    )[0]
    assert res.error is None and res.trace.llm_calls == 1 and res.trace.classifier_calls >= 1
    assert len(res.answer.used_docs) == 2  # threshold 0.01: the first candidate of the list is positive


def test_cis_and_cfs_default_to_the_threshold_saved_with_the_classifier(trained, tmp_path):
    from pipeline.methods.registry import get_method

    out, _ = trained
    saved = json.loads((out / "dynrag-classifier.json").read_text())["threshold"]
    cfg = load_config(None, [f"classifier.path={out}"])
    for name in ("cis", "cfs"):
        spec = get_method(name)
        assert spec.params({}, cfg).threshold == saved
        assert spec.params({"threshold": 0.33}, cfg).threshold == 0.33  # a given threshold wins
        assert spec.params({"classifier": str(tmp_path)}, cfg).threshold == 0.5  # not a dynrag classifier folder
        assert spec.params({}).threshold is None and spec.params({}).decision_threshold == 0.5  # no config: 0.5


def test_refuses_to_overwrite(trained, data_dir):
    from pipeline.classifier.model import ClassifierError
    from pipeline.classifier.train import train_classifier

    out, _ = trained
    with pytest.raises(ClassifierError, match="exists and is not empty"):
        train_classifier(load_config(None, [f"paths.data_dir={data_dir}"]), out)


def test_load_rejects_non_model_folders(tmp_path):
    from pipeline.classifier.model import Classifier, ClassifierError

    with pytest.raises(ClassifierError, match="not a trained classifier folder"):
        Classifier.load(tmp_path)
    (tmp_path / "dynrag-classifier.json").write_text('{"format_version": 1, "base_model": "x"}')  # a cross-encoder
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ClassifierError, match="only read from safetensors"):
        Classifier.load(tmp_path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--datasets", "hotpotqa,nq"], "unknown training dataset 'nq'"),
        (["--data-dir", "/nonexistent/data"], "data folder not found: /nonexistent/data"),
        (["--set", "classifier.epochs=0"], "classifier.epochs"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path, capsys):
    code = main(["train-classifier", "--out", str(tmp_path / "m"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dynrag: error:") and message in err[0], err
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
@pytest.mark.kit
def test_full_run_all_three_train_files(data_dir, cache_dir, tmp_path):
    """The job's defaults on all three train files (App. A.1's ~2300 per dataset cap), one epoch.

    Measured here: see the report in metrics.json; on 2 busy shared cores this takes most of an hour."""
    from pipeline.classifier.train import train_classifier

    cfg = load_config(None, [f"paths.data_dir={data_dir}", f"paths.cache_dir={cache_dir}", "classifier.epochs=1"])
    result = train_classifier(cfg, tmp_path / "model")
    dev = result["dev"]
    assert dev["n"] > 500 and dev["accuracy"] > 0.6, dev
    assert (tmp_path / "model" / "metrics.json").is_file()


def test_best_threshold_maximises_accuracy_and_prefers_the_one_nearest_half_on_ties():
    from pipeline.classifier.train import best_threshold, tune_threshold

    scores = np.array([0.1, 0.3, 0.62, 0.66, 0.72, 0.8, 0.9])
    labels = np.array([0, 0, 0, 0, 1, 1, 1], dtype=bool)
    # candidates are the distinct scores (predict score >= t): t=0.72 gets 7/7 right, 0.66 and 0.8 get 6/7
    # (the old 0.05 grid gave 0.7, the only grid value in (0.66, 0.72])
    assert best_threshold(scores, labels) == 0.72
    # 0.95 gets 3/3, 0.3 gets 2/3, 0.2 gets 1/3 (the grid tied everything in (0.3, 0.95] and took 0.5)
    assert best_threshold(np.array([0.2, 0.3, 0.95]), np.array([0, 0, 1], dtype=bool)) == 0.95
    # ties: t=0.8 and t=0.4 both get 3/4 (0.6 and 0.2 get 2/4); 0.4 is nearer 0.5
    assert best_threshold(np.array([0.2, 0.4, 0.6, 0.8]), np.array([0, 1, 0, 1], dtype=bool)) == 0.4
    t = tune_threshold(np.tile(scores, 20), np.tile(labels, 20), default=0.5, seed=0)
    assert t["chosen"] == 0.72 and t["calibration_n"] == t["held_out_n"] == 70
    assert t["held_out_accuracy_at_chosen"] == 1.0 and 0.5 < t["held_out_accuracy_at_default"] < 0.9  # 0.62, 0.66 wrong


def test_binary_metrics_worked_example():
    from pipeline.classifier.train import binary_metrics

    # labels 1 1 0 0 0, preds 1 0 1 0 0: tp 1, fn 1, fp 1, tn 2; precision = recall = f1 = 1/2, accuracy 3/5
    m = binary_metrics(np.array([1, 1, 0, 0, 0]), np.array([1, 0, 1, 0, 0]))
    assert m == {
        "n": 5,
        "accuracy": 0.6,
        "precision": 0.5,
        "recall": 0.5,
        "f1": 0.5,
        "tp": 1,
        "fp": 1,
        "fn": 1,
        "tn": 2,
    }
    # nothing predicted positive, nothing positive: the undefined ratios are 0
    assert binary_metrics(np.zeros(3), np.zeros(3))["precision"] == 0.0 == binary_metrics([], [])["f1"]
