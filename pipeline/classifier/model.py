"""The cross-encoder behind C(q, d1, d2) (DR-RAG Sec. 2.2.2) and the pair scorer C(q, d).

Input: `[CLS] q [SEP] d1 [SEP] d2 [SEP]` (a triple) or `[CLS] q [SEP] d [SEP]` (a pair), with the
special tokens of whatever encoder is used (RoBERTa's `<s> ... </s></s> ...` likewise). The question
keeps at most `max_query_tokens`; the documents share the rest of `max_length` fairly (a short document
keeps all of its tokens and leaves the remainder to the long one). Output: P(positive) from a 2-way head.

A saved classifier is a folder: `encoder/` (the fine-tuned encoder's safetensors, config and tokenizer),
`head.safetensors` (pooling is mean or [CLS], then a linear 2-way head) and `dynrag-classifier.json` (base
model, lengths, pooling, threshold, training summary, metrics). Load it with `Classifier.load`; the encoder
sits in a subfolder on purpose, so that a plain `AutoModelForSequenceClassification.from_pretrained(folder)`
fails instead of silently attaching a random head. Weights are only ever read from safetensors.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.classifier.meta import (
    FORMAT_VERSION,
    META,
    ClassifierError,
    ClassifierMeta,
    ThresholdClassifier,
    check_item,
    write_meta,
)

log = logging.getLogger(__name__)

HEAD = "head.safetensors"
ENCODER = "encoder"


# -- input encoding ------------------------------------------------------------------------------


def fair_share(lengths: Sequence[int], budget: int) -> list[int]:
    """Split `budget` tokens among texts: short ones keep everything, long ones share what is left equally."""
    keep = [0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    left = max(budget, 0)
    for rank, i in enumerate(order):
        share = left // (len(lengths) - rank)
        keep[i] = min(lengths[i], share)
        left -= keep[i]
    return keep


class InputEncoder:
    """Builds token ids for pairs and triples with the tokenizer's own special tokens."""

    def __init__(self, tokenizer, max_length: int, max_query_tokens: int):
        self.tok = tokenizer
        self.max_length = max_length
        self.max_query_tokens = max_query_tokens
        self._template()

    def _template(self) -> None:
        # Read the pair template (prefix, middle, suffix special tokens and token types) off a real
        # encoding, so BERT-, RoBERTa- and BigBird-style tokenizers all work without special-casing.
        a = self.tok("a", add_special_tokens=False)["input_ids"]
        b = self.tok("b", add_special_tokens=False)["input_ids"]
        enc = self.tok("a", "b", return_token_type_ids=True)
        ids, types = enc["input_ids"], enc.get("token_type_ids") or [0] * len(enc["input_ids"])
        ia = _find(ids, a, 0)
        ib = _find(ids, b, ia + len(a))
        self.prefix, self.middle, self.suffix = ids[:ia], ids[ia + len(a) : ib], ids[ib + len(b) :]
        self.t_prefix, self.t_middle, self.t_suffix = types[:ia], types[ia + len(a) : ib], types[ib + len(b) :]
        self.t_a, self.t_b = types[ia], types[ib]
        sep = self.tok.sep_token_id if self.tok.sep_token_id is not None else self.tok.eos_token_id
        self.doc_sep = [sep] if sep is not None else []  # between d1 and d2
        self.n_special = len(self.prefix) + len(self.middle) + len(self.suffix)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0

    def _ids(self, text: str) -> list[int]:
        # whole text first (truncated below by our own rule), so no "longer than the maximum" warning
        return self.tok(text, add_special_tokens=False, verbose=False)["input_ids"]

    def encode_one(self, item: Sequence[str]) -> tuple[list[int], list[int]]:
        q, *docs = check_item(item)
        extra = self.n_special + (len(self.doc_sep) if len(docs) == 2 else 0)
        q_room = min(self.max_query_tokens, max(self.max_length - extra, 0))
        q_ids = self._ids(q)[:q_room]
        d_ids = [self._ids(d) for d in docs]
        keep = fair_share([len(d) for d in d_ids], self.max_length - extra - len(q_ids))
        seg_b: list[int] = []
        for i, (d, k) in enumerate(zip(d_ids, keep)):
            if i:
                seg_b += self.doc_sep
            seg_b += d[:k]
        ids = self.prefix + q_ids + self.middle + seg_b + self.suffix
        types = self.t_prefix + [self.t_a] * len(q_ids) + self.t_middle + [self.t_b] * len(seg_b) + self.t_suffix
        return ids[: self.max_length], types[: self.max_length]

    def batch(self, items: Sequence[Sequence[str]]):
        """Padded tensors for a batch (dynamic padding to the longest input in the batch)."""
        import torch

        encoded = [self.encode_one(it) for it in items]
        width = max(len(ids) for ids, _ in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        token_types = torch.zeros((len(encoded), width), dtype=torch.long)
        mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, (ids, types) in enumerate(encoded):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            token_types[row, : len(types)] = torch.tensor(types)
            mask[row, : len(ids)] = 1
        out = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self.tok.model_input_names:
            out["token_type_ids"] = token_types
        return out


def _find(seq: list[int], sub: list[int], start: int) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise ClassifierError("cannot read the tokenizer's pair template")


# -- the classifier ---------------------------------------------------------------------------


def CrossEncoder(encoder, pooling: str = "mean"):
    """Encoder + pooling + dropout + linear 2-way head. Mean pooling suits sentence-transformers
    encoders such as all-MiniLM-L6-v2, whose training made the mean (not [CLS]) meaningful."""
    import torch

    class _CrossEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder
            self.pooling = pooling
            hidden = encoder.config.hidden_size
            self.dropout = torch.nn.Dropout(getattr(encoder.config, "hidden_dropout_prob", 0.1) or 0.1)
            self.head = torch.nn.Linear(hidden, 2)
            torch.nn.init.normal_(self.head.weight, std=0.02)
            torch.nn.init.zeros_(self.head.bias)

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                m = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
            return self.head(self.dropout(pooled))

    if pooling not in ("mean", "cls"):
        raise ClassifierError(f"pooling must be mean or cls, not {pooling!r}")
    return _CrossEncoder()


# -- the classifier (API) ----------------------------------------------------------------------------


def pick_device(name: str = "auto") -> str:
    from platform_shims.device import own_device

    return own_device(name)


class Classifier(ThresholdClassifier):
    """C(q, d1, d2) -> P(positive); also C(q, d) for pairs. `score` is batched and gradient-free."""

    def __init__(self, model, tokenizer, meta: ClassifierMeta, device: str = "cpu"):
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.meta = meta
        self.device = device
        self.encoder = InputEncoder(tokenizer, meta.max_length, meta.max_query_tokens)

    @classmethod
    def from_base(cls, base_folder: str, meta: ClassifierMeta, device: str = "auto") -> Classifier:
        """A fresh 2-way head on a pretrained encoder (the starting point of training)."""
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(base_folder)
        encoder = AutoModel.from_pretrained(base_folder, use_safetensors=_has_safetensors(base_folder))
        max_pos = getattr(encoder.config, "max_position_embeddings", None)
        if max_pos and meta.max_length > max_pos:
            log.warning("max_length %d exceeds the encoder's %d positions; using %d", meta.max_length, max_pos, max_pos)
            meta.max_length = max_pos
        return cls(CrossEncoder(encoder, meta.pooling), tok, meta, pick_device(device))

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "auto", cache_dir: str | None = None):
        """The classifier saved in `path`, of either kind (`cache_dir` resolves a feature model's embedder)."""
        from safetensors.torch import load_file
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path)
        meta_file = folder / META
        if not meta_file.is_file():
            raise ClassifierError(
                f"{folder} is not a trained classifier folder (no {META}); "
                "train one with `dynrag train-classifier --out DIR`"
            )
        raw = json.loads(meta_file.read_text(encoding="utf-8"))
        if raw.get("format_version") != FORMAT_VERSION:
            raise ClassifierError(f"{meta_file}: format_version {raw.get('format_version')} is not {FORMAT_VERSION}")
        known = set(ClassifierMeta.__dataclass_fields__)
        meta = ClassifierMeta(**{k: v for k, v in raw.items() if k in known})
        if meta.kind == "features":  # no torch model: a frozen embedder and a small MLP
            from pipeline.classifier.features import FeatureClassifier

            return FeatureClassifier.load(folder, meta, cache_dir)
        if meta.kind != "cross-encoder":
            raise ClassifierError(f"{meta_file}: unknown classifier kind {meta.kind!r} (cross-encoder or features)")
        enc_dir = folder / ENCODER if (folder / ENCODER).is_dir() else folder  # early folders kept it at the top
        if not (enc_dir / "model.safetensors").is_file() or not (folder / HEAD).is_file():
            raise ClassifierError(
                f"{folder} lacks {ENCODER}/model.safetensors or {HEAD} (weights are only read from safetensors)"
            )
        tok = AutoTokenizer.from_pretrained(enc_dir)
        model = CrossEncoder(AutoModel.from_pretrained(enc_dir, use_safetensors=True), meta.pooling)
        model.head.load_state_dict(load_file(str(folder / HEAD)))
        model.eval()
        return cls(model, tok, meta, pick_device(device))

    def save(self, folder: str | os.PathLike) -> Path:
        """Write encoder/ (safetensors, config, tokenizer), head.safetensors and the metadata JSON into `folder`."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.encoder.save_pretrained(folder / ENCODER, safe_serialization=True)
        self.tokenizer.save_pretrained(folder / ENCODER)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.model.head.state_dict().items()}, str(folder / HEAD)
        )
        write_meta(folder, self.meta)
        return folder

    def logits(self, items: Sequence[Sequence[str]]):
        batch = {k: v.to(self.device) for k, v in self.encoder.batch(items).items()}
        return self.model(**batch)

    def score(self, items: Sequence[Sequence[str]], batch_size: int = 64) -> np.ndarray:
        """P(positive) for each (q, d) or (q, d1, d2), in input order; batches by similar length."""
        import torch

        if not items:
            return np.zeros(0, dtype=np.float32)
        order = sorted(range(len(items)), key=lambda i: sum(len(s) for s in items[i]))
        out: np.ndarray = np.empty(len(items), dtype=np.float32)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    idx = order[start : start + batch_size]
                    probs = torch.softmax(self.logits([items[i] for i in idx]).float(), dim=-1)[:, 1]
                    out[idx] = probs.cpu().numpy()
        finally:
            self.model.train(was_training)
        return out


def _has_safetensors(folder: str | os.PathLike) -> bool:
    folder = Path(folder)
    return any(folder.glob("*.safetensors"))
