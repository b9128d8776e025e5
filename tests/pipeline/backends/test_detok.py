"""Reading generated ids back into text spans the way a detokenizer does (pipeline/backends/detok.py), on
tokenizers whose single-token strings do not lay end to end along the text: byte-level pieces of multi-byte
characters (the tiny model's), and SentencePiece-style leading-space markers; and the transformers backend,
which reads its output that way and ends its ids, as vLLM does, with the one that completes a stop string."""

from __future__ import annotations

from collections import Counter

import pytest
from engine_fixtures import tiny_model_path

from pipeline.backends.detok import clip, detokenize


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path(tmp_path_factory))


def tiles(text: str, spans) -> bool:
    """The spans run from 0 to len(text) in order, each starting where the previous distinct one ended."""
    distinct = list(dict.fromkeys(spans))
    return (
        distinct[0][0] == 0
        and distinct[-1][1] == len(text)
        and all(a[1] == b[0] for a, b in zip(distinct, distinct[1:]))
    )


def test_byte_pieces_of_a_multibyte_character_share_its_span(tiny_tok):
    prompt_ids = tiny_tok("Answer:")["input_ids"]
    ids = tiny_tok(" café 東京 Zoë.", add_special_tokens=False)["input_ids"]
    pieces = [tiny_tok.decode([i]) for i in ids]
    assert "\ufffd" in pieces and "".join(pieces) != " café 東京 Zoë."  # what per-token strings would give
    text, spans = detokenize(tiny_tok, ids, prompt_ids)
    assert text == " café 東京 Zoë." and len(spans) == len(ids) and tiles(text, spans)
    # every UTF-8 byte of a character is its own token here (the tiny vocabulary never saw them): each spans it
    multibyte = Counter(text[s:e] for s, e in spans if not text[s:e].isascii())
    assert multibyte == {"é": 2, "東": 3, "京": 3, "ë": 2}
    assert all(e - s == 1 for s, e in spans[3:5])  # "é" is one character, whatever its bytes
    # an unfinished character at the end adds nothing yet (vLLM's text lacks it too)
    cut_text, cut_spans = detokenize(tiny_tok, ids[:4], prompt_ids)  # " c", "a", "f", first byte of "é"
    assert cut_text == " caf" and cut_spans[-1] == (4, 4)


def test_leading_space_markers_decode_as_spaces_after_the_prompt():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    raw.train_from_iterator(["Answer: Paris is the capital of France."] * 4, trainers.BpeTrainer(vocab_size=120))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    prompt_ids = tok("Answer:")["input_ids"]
    ids = tok("Answer: Paris is the capital")["input_ids"][len(prompt_ids) :]
    assert tok.convert_ids_to_tokens(ids) == ["▁Paris", "▁is", "▁the", "▁capital"]
    assert [tok.decode([i]) for i in ids] == ["Paris", "is", "the", "capital"]  # each alone loses its space
    text, spans = detokenize(tok, ids, prompt_ids)
    assert text == " Paris is the capital"
    assert [text[s:e] for s, e in spans] == [" Paris", " is", " the", " capital"]
    assert detokenize(tok, ids)[0] == "Paris is the capital"  # without the prompt, the first space goes


def test_clip_cuts_spans_at_the_text_end():
    assert clip([(0, 3), (3, 5), (5, 9)], 4) == [(0, 3), (3, 4), (4, 4)]


def test_transformers_backend_ends_its_ids_with_the_token_that_completes_the_stop(tmp_path_factory, tiny_tok):
    from pipeline.backends.hf_gen import HfGenerator
    from pipeline.config import DynragConfig
    from pipeline.engine.requests import SamplingSpec

    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = "transformers"
    gen = HfGenerator(cfg)
    prompt = "Question: who wrote the novel?\nAnswer:"
    (free,) = gen.generate([prompt], [SamplingSpec(max_tokens=16, temperature=0.0, token_spans=True)], [False])
    assert free.prompt_token_ids == tiny_tok(prompt)["input_ids"] and len(free.token_ids) == 16
    assert free.token_spans is not None and tiles(free.text, free.token_spans)
    assert free.text == detokenize(tiny_tok, free.token_ids, free.prompt_token_ids)[0]
    # a stop string from the middle of the greedy output, ending inside its token k: ids 0..k are kept
    k = next(k for k in range(3, 16) if free.token_spans[k][1] - free.token_spans[k][0] >= 2)
    s, e = free.token_spans[k]
    stop = free.text[s : e - 1]
    spec = SamplingSpec(max_tokens=16, temperature=0.0, stop=(stop,), token_spans=True)
    (cut,) = gen.generate([prompt], [spec], [False])
    first = free.text.index(stop)
    assert cut.text == free.text[:first] and cut.finish_reason == "stop"
    assert cut.stop_reason == stop and free.stop_reason == ""  # the stop string that ended it, as vLLM's
    kept = next(j for j, (_, end) in enumerate(free.token_spans) if end >= first + len(stop)) + 1
    assert cut.token_ids == free.token_ids[:kept] and cut.completion_tokens == kept < 16
    assert cut.token_spans == clip(free.token_spans[:kept], len(cut.text))
