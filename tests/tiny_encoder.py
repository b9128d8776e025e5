"""A tiny random-weight sentence-transformers encoder (1 layer, 32 dimensions) with the real
all-MiniLM-L6-v2 tokenizer: embeds fast enough to index corpora of hundreds of MB in a test."""

from __future__ import annotations

from pathlib import Path


def build_tiny_encoder(folder: str | Path, cache_dir: str) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from pipeline.assets.models import resolve_model

    folder = Path(folder)
    if (folder / "modules.json").is_file():
        return folder
    tok = AutoTokenizer.from_pretrained(resolve_model("all-minilm-l6-v2", cache_dir))
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        )
    )
    base = folder.parent / f"{folder.name}-bert"
    bert.save_pretrained(base)
    tok.save_pretrained(base)
    word = models.Transformer(str(base), max_seq_length=32)
    SentenceTransformer(modules=[word, models.Pooling(bert.config.hidden_size, "mean")]).save(str(folder))
    return folder
