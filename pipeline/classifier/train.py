"""Train the DR-RAG classifier C on Eq. 2's examples (paper App. A.1), evaluate it on held-out questions and
tune its threshold.

Two kinds (`classifier.model`): `features` (the default), a small MLP over frozen embeddings and lexical
features (pipeline.classifier.features, minutes on a CPU); `cross-encoder`, the paper's fine-tuned encoder,
in plain torch: AdamW, linear warm-up then linear decay, gradient clipping, cross-entropy on a 2-way head;
CPU here, the first GPU when there is one (`classifier.device`). Either model folder is written to a
temporary sibling and renamed into place at the end, so an interrupted run leaves no half-written model.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.classifier.data import KINDS, Example, load_records, make_splits
from pipeline.classifier.features import FeatureClassifier, train_features
from pipeline.classifier.model import Classifier, ClassifierError, ClassifierMeta
from pipeline.config import DynragConfig, save_resolved, with_values

log = logging.getLogger(__name__)


# -- metrics ----------------------------------------------------------------------------------


def binary_metrics(labels: np.ndarray, preds: np.ndarray) -> dict:
    """Accuracy and precision / recall / F1 of the positive class (0 where undefined or without examples)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    labels, preds = np.asarray(labels, dtype=bool), np.asarray(preds, dtype=bool)
    if not len(labels):
        return {"n": 0, "accuracy": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "fp": 0, "fn": 0, "tn": 0}
    tn, fp, fn, tp = (int(c) for c in confusion_matrix(labels, preds, labels=[False, True]).ravel())
    p, r, f1, _ = precision_recall_fscore_support(labels, preds, average="binary", zero_division=0)
    return {
        "n": len(labels),
        "accuracy": float(accuracy_score(labels, preds)),
        "precision": float(p),
        "recall": float(r),
        "f1": float(f1),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def evaluate(
    clf: Classifier | FeatureClassifier,
    examples: list[Example],
    threshold: float,
    batch_size: int,
    scores: np.ndarray | None = None,
) -> dict:
    """Overall metrics, the majority-class baseline, and accuracy per example kind and per dataset."""
    if scores is None:
        scores = clf.score([e.item for e in examples], batch_size=batch_size)
    labels = np.array([e.label for e in examples], dtype=bool)
    preds = scores >= threshold
    out = binary_metrics(labels, preds)
    out["threshold"] = threshold
    out["majority_baseline_accuracy"] = float(max(labels.mean(), 1 - labels.mean())) if len(labels) else 0.0
    out["by_kind"] = {}
    for kind in KINDS:
        sel = np.array([e.kind == kind for e in examples])
        if sel.any():  # positives: accuracy is recall; negatives: accuracy is the true-negative rate
            out["by_kind"][kind] = {
                "n": int(sel.sum()),
                "accuracy": binary_metrics(labels[sel], preds[sel])["accuracy"],
            }
    out["by_dataset"] = {}
    for name in sorted({e.dataset for e in examples}):
        sel = np.array([e.dataset == name for e in examples])
        m = binary_metrics(labels[sel], preds[sel])
        out["by_dataset"][name] = {k: m[k] for k in ("n", "accuracy", "precision", "recall", "f1")}
    return out


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The distinct score t with the highest accuracy of `score >= t`; among ties, the one nearest 0.5 (the
    higher one when two are equally near)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    thr = np.unique(scores)[::-1]  # descending
    pos, neg = np.sort(scores[labels]), np.sort(scores[~labels])
    # right at t: positives scoring >= t, negatives scoring < t
    correct = (len(pos) - np.searchsorted(pos, thr, side="left")) + np.searchsorted(neg, thr, side="left")
    best = np.flatnonzero(correct == correct.max())
    return float(thr[best[np.argmin(np.abs(thr[best] - 0.5))]])


def tune_threshold(scores: np.ndarray, labels: np.ndarray, default: float, seed: int) -> dict:
    """Pick the threshold on a random half of the dev examples (calibration) and report accuracy at the
    default and at the chosen threshold on the other half, which the choice never saw. The paper says
    only "a predefined threshold"; a classifier trained here was found best near 0.7, not 0.5."""
    scores, labels = np.asarray(scores), np.asarray(labels, dtype=bool)
    order = np.random.default_rng(seed).permutation(len(scores))
    cal, held = order[: len(order) // 2], order[len(order) // 2 :]
    chosen = best_threshold(scores[cal], labels[cal])
    acc = lambda t: binary_metrics(labels[held], scores[held] >= t)["accuracy"]  # noqa: E731
    return {
        "chosen": chosen,
        "default": default,
        "calibration_n": len(cal),
        "held_out_n": len(held),
        "held_out_accuracy_at_default": acc(default),
        "held_out_accuracy_at_chosen": acc(chosen),
    }


def rank_auc(scores, labels) -> float | None:
    """Area under the ROC curve (ties count one half); None without both classes."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores)) if len(set(labels)) == 2 else None


# -- training ---------------------------------------------------------------------------------


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _lr_lambda(total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def fit(clf: Classifier, train: list[Example], cc, *, seed: int) -> dict:
    """Train in place; return a small log (steps, seconds, examples/s, last loss)."""
    import torch

    model = clf.model
    model.train()
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    enc = [(n, p) for n, p in model.named_parameters() if not n.startswith("head.")]
    groups = [
        {"params": [p for n, p in enc if not n.endswith(no_decay)], "weight_decay": cc.weight_decay},
        {"params": [p for n, p in enc if n.endswith(no_decay)], "weight_decay": 0.0},
        # the fresh head learns faster than the pretrained encoder it sits on
        {"params": list(model.head.parameters()), "weight_decay": 0.0, "lr": cc.learning_rate * cc.head_lr_multiplier},
    ]
    opt = torch.optim.AdamW(groups, lr=cc.learning_rate)
    steps_per_epoch = math.ceil(len(train) / cc.batch_size)
    total = max(1, math.ceil(steps_per_epoch * cc.epochs))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, int(total * cc.warmup_fraction)))
    rng = random.Random(seed)
    start = time.perf_counter()
    window_t, window_n, window_loss, seen, step, loss_ema = start, 0, [], 0, 0, None
    log.info(
        "training on %d examples: %d steps of %d (%.2f epochs), lr %g, device %s",
        len(train),
        total,
        cc.batch_size,
        cc.epochs,
        cc.learning_rate,
        clf.device,
    )
    while step < total:
        order = list(range(len(train)))
        rng.shuffle(order)
        for s in range(0, len(order), cc.batch_size):
            if step >= total:
                break
            batch = [train[i] for i in order[s : s + cc.batch_size]]
            labels = torch.tensor([e.label for e in batch], device=clf.device)
            loss = torch.nn.functional.cross_entropy(clf.logits([e.item for e in batch]), labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seen += len(batch)
            window_n += len(batch)
            value = loss.item()
            window_loss.append(value)
            loss_ema = value if loss_ema is None else 0.9 * loss_ema + 0.1 * value
            if step % cc.log_every == 0 or step == total:
                now = time.perf_counter()
                log.info(
                    "step %d/%d epoch %.2f loss %.4f (mean of last %d) lr %.2e %.1f examples/s",
                    step,
                    total,
                    seen / len(train),
                    sum(window_loss) / len(window_loss),
                    len(window_loss),
                    sched.get_last_lr()[0],
                    window_n / max(now - window_t, 1e-9),
                )
                window_t, window_n, window_loss = now, 0, []
    seconds = time.perf_counter() - start
    model.eval()
    return {
        "steps": total,
        "examples_seen": seen,
        "seconds": round(seconds, 1),
        "examples_per_second": round(seen / max(seconds, 1e-9), 2),
        "final_loss_ema": loss_ema,
    }


def train_classifier(cfg: DynragConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Build the examples, train the `classifier.model` kind (features: embed and fit the MLP; cross-encoder:
    fine-tune), evaluate on the held-out questions, tune the threshold, write the model folder.

    The folder gets the model (features: mlp.safetensors; cross-encoder: encoder/ and head.safetensors; both
    with dynrag-classifier.json), metrics.json and config.resolved.yaml. Returns the metrics, the training log,
    the data summary, and total wall and CPU seconds.
    """
    import torch

    from pipeline.assets.models import resolve_model

    cc = cfg.classifier
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ClassifierError(f"output folder {out} exists and is not empty (pass --overwrite to replace it)")
    if cc.threads:
        torch.set_num_threads(cc.threads)
    _seed_everything(cc.seed)

    t0, cpu0 = time.perf_counter(), time.process_time()
    records = load_records(cfg.paths.data_dir, cc.datasets)
    splits = make_splits(
        records,
        seed=cc.seed,
        dev_fraction=cc.dev_fraction,
        mixed_fraction=cc.mixed_negative_fraction,
        max_per_dataset=cc.max_examples_per_dataset,
        max_examples=cc.max_examples,
        task=cc.task,
    )
    if not splits.train or not splits.dev:
        raise ClassifierError(
            f"too few examples to train and evaluate (train {len(splits.train)}, dev {len(splits.dev)});"
            " raise --max-examples or add datasets"
        )
    log.info("examples: train %s", json.dumps(splits.summary["train"]))
    log.info("examples: dev %s", json.dumps(splits.summary["dev"]))

    base = resolve_model(cc.base_model, cfg.paths.cache_dir)
    clf: Classifier | FeatureClassifier
    if cc.model == "features":
        clf, train_log = train_features(cfg, splits, base)
    else:
        meta = ClassifierMeta(
            base_model=cc.base_model,
            max_length=cc.max_length,
            max_query_tokens=cc.max_query_tokens,
            threshold=cc.threshold,
            pooling=cc.pooling,
        )
        clf = Classifier.from_base(base, meta, device=cc.device)
        train_log = fit(clf, splits.train, cc, seed=cc.seed)
    t_eval = time.perf_counter()
    scores = clf.score([e.item for e in splits.dev], batch_size=cc.eval_batch_size)
    metrics = evaluate(clf, splits.dev, cc.threshold, cc.eval_batch_size, scores=scores)
    metrics["auc"] = rank_auc(scores, [e.label for e in splits.dev])
    if cc.tune_threshold:
        tuning = tune_threshold(scores, np.array([e.label for e in splits.dev]), cc.threshold, cc.seed)
        clf.meta.threshold = metrics["tuned_threshold"] = tuning["chosen"]
        metrics["threshold_tuning"] = tuning
        log.info(
            "threshold: %.2f chosen on %d dev examples; on the other %d, accuracy %.4f at it vs %.4f at %.2f",
            tuning["chosen"],
            tuning["calibration_n"],
            tuning["held_out_n"],
            tuning["held_out_accuracy_at_chosen"],
            tuning["held_out_accuracy_at_default"],
            cc.threshold,
        )
    metrics["eval_seconds"] = round(time.perf_counter() - t_eval, 1)
    metrics["eval_examples_per_second"] = round(len(splits.dev) / max(metrics["eval_seconds"], 1e-9), 1)
    log.info(
        "dev: accuracy %.4f AUC %s precision %.4f recall %.4f f1 %.4f (majority baseline %.4f, n=%d)",
        metrics["accuracy"],
        metrics["auc"],
        metrics["precision"],
        metrics["recall"],
        metrics["f1"],
        metrics["majority_baseline_accuracy"],
        metrics["n"],
    )
    result = {
        "dev": metrics,
        "training": train_log,
        "data": splits.summary,
        "total_seconds": round(time.perf_counter() - t0, 1),
        "total_cpu_seconds": round(time.process_time() - cpu0, 1),
    }  # this process's CPU, all its threads
    # merged: a kind's own entries (the feature model's embedder_folder) stay
    clf.meta.training = {
        **clf.meta.training,
        "data": splits.summary,
        **train_log,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    clf.meta.metrics = metrics

    write_atomically(out, overwrite, lambda tmp: _write_outputs(tmp, clf, result, cfg, out))
    log.info("classifier written to %s", out)
    return result


def _write_outputs(
    folder: Path, clf: Classifier | FeatureClassifier, result: dict, cfg: DynragConfig, final: Path
) -> None:
    clf.save(folder)
    (folder / "metrics.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    save_resolved(with_values(cfg, {"classifier.path": str(final.resolve())}), folder)


def write_atomically(out: Path, overwrite: bool, write) -> None:
    """Write into a temporary sibling folder, then rename it to `out` (replacing it only if allowed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is shared like any other output
    try:
        write(tmp)
        if out.exists():
            if not overwrite and any(out.iterdir()):
                raise ClassifierError(f"output folder {out} appeared while training; not replacing it")
            old = out.with_name(f".{out.name}.old-{int(time.time())}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
