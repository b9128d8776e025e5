"""Constrained decoding on the transformers backend: `SamplingSpec.json_schema` as a per-step logits mask from
xgrammar (the grammar engine vLLM's structured outputs use by default), compiled against the generator's
tokenizer. A token the grammar does not allow next gets -inf before the choice, and once the JSON is complete
only an end-of-sequence token is allowed, so a greedy output is the model's likeliest text that the schema
accepts (cut only by max_tokens).

The grammar (`json_grammar`, EBNF) is xgrammar's for the schema as vLLM compiles a `json` request by default
(`any_whitespace=True`, the default separators, the properties in the schema's order), with two changes:
- a run of whitespace between tokens of the JSON is at most `MAX_WHITESPACE` characters: a small or random-weight
  model otherwise can emit newlines until max_tokens;
- a string with a maxLength takes JSON's characters (xgrammar 0.2.8 writes such a string as any character but a
  quote, a backslash, CR or LF: no escapes, so no \" in it, and raw control characters, which json.loads
  refuses); its unbounded strings already do.
vLLM gets the same EBNF (pipeline/backends/vllm_gen.py), so one request is one grammar on both backends."""

from __future__ import annotations

import re
from typing import Any

MAX_WHITESPACE = 8


# xgrammar's characters of a string with maxLength, and JSON's: any but a control character, a quote or a
# backslash; or an escape (basic_escape, which xgrammar defines with its basic JSON rules)
_BOUNDED_CHARS = re.compile(r'^(\w+_characters ::= )\(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.M)
_JSON_CHARS = r'(([^\0-\x1f\"\\\r\n]) | ("\\" basic_escape))'
_ESCAPE = 'basic_escape ::= (([\\"\\\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))'


def json_grammar(schema: str) -> str:
    """The EBNF that decodes JSON `schema` accepts (see the module's docstring)."""
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE))
    ebnf = _BOUNDED_CHARS.sub(lambda m: m.group(1) + _JSON_CHARS, ebnf)
    return ebnf if "basic_escape ::=" in ebnf else ebnf + "\n" + _ESCAPE


class JsonGrammars:
    """Compiled JSON-schema grammars for one tokenizer, each compiled once."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        self._compiler = xgr.GrammarCompiler(info)
        self._compiled: dict[str, Any] = {}

    def compiled(self, schema: str):
        if schema not in self._compiled:
            self._compiled[schema] = self._compiler.compile_grammar(json_grammar(schema))
        return self._compiled[schema]

    def processor(self, schema: str, batch_size: int) -> GrammarMask:
        return GrammarMask(self.compiled(schema), batch_size)


class GrammarMask:
    """A transformers logits processor for one `generate` call: one grammar matcher per batch row, fed the token
    the row took at the previous step, masking the scores of every token its grammar does not allow next. A row
    whose grammar has ended (it took an end token) is left as it is: generate pads it from then on."""

    def __init__(self, compiled, batch_size: int):
        import xgrammar as xgr

        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch_size)]
        self.bitmask = xgr.allocate_token_bitmask(batch_size, compiled.tokenizer_info.vocab_size)
        self.start: int | None = None  # the prompt's width: the ids after it are the generated ones

    def __call__(self, input_ids, scores):
        import xgrammar as xgr

        if self.start is None:
            self.start = input_ids.shape[1]
        elif input_ids.shape[1] > self.start:
            for row, m in enumerate(self.matchers):
                if not m.is_terminated():
                    token = int(input_ids[row, -1])
                    if not m.accept_token(token):
                        raise RuntimeError(f"constrained decoding: token {token} is outside the grammar")
        for row, m in enumerate(self.matchers):
            if m.is_terminated():
                self.bitmask[row].fill_(-1)  # all allowed: the row is finished and only padded
            else:
                m.fill_next_token_bitmask(self.bitmask, row)
        masked = scores.to("cpu") if scores.device.type not in ("cpu", "cuda") else scores
        xgr.apply_token_bitmask_inplace(masked, self.bitmask.to(masked.device))
        return masked.to(scores.device)
