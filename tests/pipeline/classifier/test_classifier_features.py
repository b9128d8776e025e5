"""The feature classifier (the default of `dynrag train-classifier`): it learns a separable toy set end to end
through train_classifier (an untrained one does not), saves with its kind and threshold, and loads back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config


def toy_kit(folder, n=40):
    """HotpotQA's official format: two bridge paragraphs per question (the first names the second's title)
    and six unrelated distractors."""
    rows = []
    for i in range(n):
        a, b = f"Alpha{i}", f"Beta{i}"
        context = [
            [a, [f"{a} was founded by {b} in the old town."]],
            [b, [f"{b} was born in Place{i} and wrote songs."]],
        ]
        context += [[f"Gamma{i}x{j}", [f"Gamma{i}x{j} is a river near Delta{i}x{j} with many fish."]] for j in range(6)]
        rows.append(
            {
                "_id": f"t{i}",
                "question": f"Where was the founder of {a} born?",
                "answer": f"Place{i}",
                "context": context,
                "supporting_facts": [[a, 0], [b, 0]],
            }
        )
    (folder / "hotpotqa").mkdir(parents=True)
    (folder / "hotpotqa" / "train_100.json").write_text(json.dumps(rows))
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    from tiny_encoder import build_tiny_encoder

    from pipeline.assets.models import is_prepared
    from pipeline.classifier.train import train_classifier

    if not is_prepared("all-minilm-l6-v2", cache_dir):
        pytest.skip("all-minilm-l6-v2 (its tokenizer) is not prepared")
    root = tmp_path_factory.mktemp("features")
    enc = build_tiny_encoder(root / "tiny", str(cache_dir))
    cfg = load_config(
        None,
        [
            f"paths.data_dir={toy_kit(root / 'kit')}",
            f"paths.cache_dir={root / 'cache'}",
            f"classifier.base_model={enc}",
            "classifier.datasets=[hotpotqa]",
            "classifier.dev_fraction=0.3",
        ],
    )
    assert cfg.classifier.model == "features"  # the default
    return root / "model", train_classifier(cfg, root / "model"), cfg


def test_learns_the_separable_toy_set_where_an_untrained_model_does_not(trained):
    from pipeline.classifier.data import load_records, make_splits
    from pipeline.classifier.features import MLP, FeatureClassifier
    from pipeline.classifier.model import Classifier
    from pipeline.classifier.train import evaluate

    out, result, cfg = trained
    dev = result["dev"]
    assert dev["n"] >= 40 and dev["majority_baseline_accuracy"] == 0.5
    assert dev["accuracy"] >= 0.95 and dev["auc"] >= 0.95, dev

    clf = Classifier.load(out)
    splits = make_splits(load_records(cfg.paths.data_dir, ["hotpotqa"]), dev_fraction=0.3)
    # the same embedder and features with an untrained network (all weights zero): P = 0.5 for everything
    zero = MLP(
        clf.mlp.mean,
        clf.mlp.scale,
        [np.zeros_like(w) for w in clf.mlp.weights],
        [np.zeros_like(b) for b in clf.mlp.biases],
    )
    untrained = evaluate(FeatureClassifier(clf.embedder, zero, clf.meta), splits.dev, 0.5, 64)
    assert untrained["accuracy"] == 0.5
    assert evaluate(clf, splits.dev, dev["threshold"], 64)["accuracy"] == dev["accuracy"]


def test_folder_kind_threshold_and_round_trip(trained, tmp_path):
    from pipeline.classifier.features import FeatureClassifier
    from pipeline.classifier.model import Classifier, ClassifierError

    out, result, _ = trained
    meta = json.loads((out / "dynrag-classifier.json").read_text())
    assert meta["kind"] == "features" and meta["threshold"] == result["dev"]["tuned_threshold"]
    assert (out / "mlp.safetensors").is_file() and not any(p.suffix in (".pkl", ".bin") for p in out.iterdir())
    clf = Classifier.load(out)
    assert isinstance(clf, FeatureClassifier) and clf.threshold == meta["threshold"]
    items = [
        (
            "Where was the founder of Alpha3 born?",
            "Alpha3: Alpha3 was founded by Beta3 in the old town.",
            "Beta3: Beta3 was born in Place3 and wrote songs.",
        ),
        (
            "Where was the founder of Alpha3 born?",
            "Alpha3: Alpha3 was founded by Beta3 in the old town.",
            "Gamma3x1: Gamma3x1 is a river near Delta3x1 with many fish.",
        ),
        ("Where was the founder of Alpha3 born?", "Alpha3: Alpha3 was founded by Beta3 in the old town."),
    ]
    scores = clf.score(items)
    assert scores.shape == (3,) and scores[0] > clf.threshold > scores[1]
    clf.save(tmp_path / "copy")
    assert np.array_equal(Classifier.load(tmp_path / "copy").score(items), scores)
    with pytest.raises(ClassifierError, match="an item is"):
        clf.score([("only a question",)])
    (tmp_path / "copy" / "mlp.safetensors").unlink()
    with pytest.raises(ClassifierError, match="lacks mlp.safetensors"):
        Classifier.load(tmp_path / "copy")


def test_embeddings_are_stored_so_a_rerun_embeds_nothing_again(trained):
    from pipeline.classifier.features import Embedder

    out, _, cfg = trained
    store = next(Path(cfg.paths.cache_dir).glob("classifier-embeddings/*"))
    again = Embedder(cfg.classifier.base_model, store=store)
    before = len(again.cache)
    assert before > 0
    files = sorted(store.glob("[0-9]*.npz"))
    assert files

    def no_encoding(*args, **kwargs):
        raise AssertionError("a stored text was embedded again")

    again.model.encode = no_encoding  # the store must answer: an ignored store would encode (and write a file)
    again.embed(["Where was the founder of Alpha3 born?"])  # a training question: already stored
    assert len(again.cache) == before and sorted(store.glob("[0-9]*.npz")) == files


def test_loads_by_model_key_from_the_run_cache_dir(trained, tmp_path):
    """The folder records the embedder folder it was trained with (train_classifier merges the kind's training
    entries); where that folder is gone, the model key resolves under the cache_dir the loader is given, which
    the scoring backend takes from the run's paths.cache_dir."""
    import shutil

    from pipeline.assets.models import MARKER
    from pipeline.backends.scoring import CrossEncoderScorer
    from pipeline.classifier.model import Classifier, ClassifierError

    out, _, cfg = trained
    meta = json.loads((out / "dynrag-classifier.json").read_text())
    assert meta["training"]["embedder_folder"] == str(Path(cfg.classifier.base_model).resolve())
    assert meta["training"]["data"]["train"]["examples"] > 0 and "created" in meta["training"]
    assert "steps" not in meta["training"] and "final_loss_ema" not in meta["training"]
    items = [
        (
            "Where was the founder of Alpha3 born?",
            "Alpha3: Alpha3 was founded by Beta3 in the old town.",
            "Beta3: Beta3 was born in Place3 and wrote songs.",
        ),
        ("Where was the founder of Alpha3 born?", "Alpha3: Alpha3 was founded by Beta3 in the old town."),
    ]
    expected = Classifier.load(out).score(items)

    # a non-default cache holding the (tiny) embedder as the prepared known model all-minilm-l6-v2
    cache = tmp_path / "other-cache"
    shutil.copytree(cfg.classifier.base_model, cache / "models" / "all-minilm-l6-v2")
    (cache / "models" / "all-minilm-l6-v2" / MARKER).write_text("{}")
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    meta["base_model"] = "all-minilm-l6-v2"
    meta["training"]["embedder_folder"] = str(tmp_path / "gone")
    (moved / "dynrag-classifier.json").write_text(json.dumps(meta))

    clf = Classifier.load(moved, cache_dir=str(cache))
    assert len(clf.embedder.embed(["x"])["x"]) == 32  # the tiny embedder, not the default cache's 384-d one
    assert np.allclose(clf.score(items), expected, atol=1e-6)
    scorer = CrossEncoderScorer(load_config(None, [f"paths.cache_dir={cache}", f"classifier.path={moved}"]))
    assert scorer.score(items) == pytest.approx([float(x) for x in expected], abs=1e-6)
    with pytest.raises(ClassifierError, match="an item is"):  # the shared item check (pipeline.classifier.meta)
        scorer.score([("only a question",)])


def test_cli_prints_total_wall_and_cpu_time(trained, tmp_path, capsys):
    from jobs.cli import main

    out, _, cfg = trained
    code = main(
        [
            "train-classifier",
            "--out",
            str(tmp_path / "m"),
            "--data-dir",
            cfg.paths.data_dir,
            "--datasets",
            "hotpotqa",
            "--set",
            f"classifier.base_model={cfg.classifier.base_model}",
            "--set",
            f"paths.cache_dir={cfg.paths.cache_dir}",
            "--set",
            "classifier.dev_fraction=0.3",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert (
        code == 0 and lines[-1].startswith("total: ") and " min wall, " in lines[-1] and lines[-1].endswith(" s of CPU")
    )
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert metrics["total_seconds"] >= 0 and metrics["total_cpu_seconds"] > 0
