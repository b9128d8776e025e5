"""Token ids back to text: the text a sequence of generated ids decodes to and each token's span in it.

This is how a detokenizer reads ids, one at a time (vLLM builds its output text so, with
`tokenizers.decoders.DecodeStream` primed with the prompt's ids): the text token i adds is
decode(ids[:i+1]) minus decode(ids[:i]), with the prompt's last ids decoded before them so that a
leading-space marker (SentencePiece's "▁") decodes as the space it is inside a text. While the decoded
text ends in an unfinished UTF-8 character (U+FFFD), a token adds nothing yet; the tokens that finish a
character together share its span, and tokens still unfinished at the end span nothing. Special tokens
decode to nothing (an empty span).

Each token decoded alone, which vLLM's logprobs report as `decoded_token`, does not give this: a
byte-level piece of a multi-byte character decodes to U+FFFD and SentencePiece drops a token's leading
space, so those strings do not lay end to end along the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WINDOW = 8  # ids decoded before the next ones: more than any character's bytes or a space marker needs


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def detokenize(tokenizer: Any, ids: Sequence[int], context: Sequence[int] = ()) -> tuple[str, list[tuple[int, int]]]:
    """(text, spans): the text `ids` decode to after the `context` ids (the prompt's), and each id's
    (start, end) in it."""
    prefix = [int(t) for t in list(context)[-WINDOW:]]
    base = _decode(tokenizer, prefix)
    text, spans, pending = "", [], []
    for tid in ids:
        pending.append(int(tid))
        full = _decode(tokenizer, prefix + pending)
        if full.endswith("\ufffd") or not full.startswith(base):
            continue  # an unfinished character: the next id completes it
        piece = full[len(base) :]
        spans += [(len(text), len(text) + len(piece))] * len(pending)
        text += piece
        prefix, pending = (prefix + pending)[-WINDOW:], []
        base = _decode(tokenizer, prefix)
    spans += [(len(text), len(text))] * len(pending)
    return text, spans


def clip(spans: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Spans cut to a text of n characters (the output text ends before a stop string its last token holds)."""
    return [(min(s, n), min(e, n)) for s, e in spans]
