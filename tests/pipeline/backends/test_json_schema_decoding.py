"""SamplingSpec.json_schema on the transformers backend (pipeline/backends/constrained.py): a random-weight model,
whose free text is never JSON, answers JSON that the schema accepts; ERM4's authors' formats as the schemas, and
the grammar they compile to."""

from __future__ import annotations

import json

import jsonschema
import pytest
from engine_fixtures import tiny_model_path

from pipeline.backends.constrained import MAX_WHITESPACE, json_grammar
from pipeline.engine.requests import SamplingSpec
from pipeline.methods.erm4_authors import JSON_FORMATS, STRING_CHARS, json_schema

PROMPTS = ["Question: who wrote the novel? Answer:", "Rome is the capital of", "Shirley Temple served as"]


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    from pipeline.backends.hf_gen import HfGenerator
    from pipeline.config import DynragConfig

    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = "transformers"
    cfg.generation.batch_size = 2  # a batch of 2 and one of 1: each row has its own grammar state
    return HfGenerator(cfg)


def test_the_free_outputs_of_the_tiny_model_are_not_json(gen):
    outs = gen.generate(PROMPTS, [SamplingSpec(max_tokens=32, temperature=0.0)] * 3, [True] * 3)
    for o in outs:
        with pytest.raises(ValueError):
            json.loads(o.text)


# the formats' shapes with short strings: a random-weight model fills every string and whitespace run to its
# bound, about a character a token (the formats' own bounds are test_the_grammar_takes_json_s_strings_...'s)
def short(most: int) -> dict:
    return {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": 8},
        "minItems": 1,
        "maxItems": most,
    }


REWRITE = {
    "type": "object",
    "properties": {"Rewritten Question": short(2), "Query": short(2)},
    "required": ["Rewritten Question", "Query"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("schema", [REWRITE, JSON_FORMATS["filter"], short(1)], ids=["rewrite", "filter", "answer"])
def test_a_json_schema_constrains_each_output_to_json_the_schema_accepts(gen, schema):
    spec = SamplingSpec(max_tokens=512, temperature=0.0, json_schema=json.dumps(schema))
    for o in gen.generate(PROMPTS, [spec] * 3, [True] * 3):
        assert o.finish_reason == "stop", o.text  # the grammar ended it, not max_tokens
        jsonschema.validate(json.loads(o.text), schema)  # json.loads as their code reads it: strict


def test_the_grammar_takes_json_s_strings_within_the_bounds():
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    g = Grammar.from_ebnf(json_grammar(json_schema("rewrite")))
    ok = {"Rewritten Question": ['Who is "he"?', "caf\u00e9"], "Query": ["x" * STRING_CHARS]}
    assert accepts(g, json.dumps(ok)) and accepts(g, json.dumps(ok, ensure_ascii=False, indent=2))
    assert accepts(g, '{"Rewritten Question": ["a"],\n  "Query": ["b"]}')
    for bad in (
        {"Rewritten Question": ["a\tb"], "Query": ["b"]},  # a raw control character (json.loads refuses it)
        {"Rewritten Question": ["a"], "Query": ["x" * (STRING_CHARS + 1)]},
        {"Rewritten Question": ["a"] * 4, "Query": ["b"]},
        {"Rewritten Question": ["a"], "Query": []},
        {"Rewritten Question": [""], "Query": ["b"]},
        {"Query": ["b"], "Rewritten Question": ["a"]},  # the format's order
    ):
        assert not accepts(g, json.dumps(bad, ensure_ascii=False).replace("\\t", "\t")), bad
    assert not accepts(g, '{"Rewritten Question": ["a"],' + " " * (MAX_WHITESPACE + 1) + '"Query": ["b"]}')


def test_a_sampled_output_is_constrained_too(gen):
    spec = SamplingSpec(max_tokens=1024, temperature=1.0, json_schema=json_schema("filter"))
    (o,) = gen.generate(PROMPTS[:1], [spec], [True])
    assert json.loads(o.text)["NLI result"] in ("entailment", "contradiction", "neural")


@pytest.mark.parametrize("schema", [JSON_FORMATS["filter"], short(1)], ids=["filter", "answer"])
def test_vllm_decodes_under_the_same_grammar(tiny_vllm, schema):
    spec = SamplingSpec(max_tokens=512, temperature=0.0, json_schema=json.dumps(schema))
    for o in tiny_vllm.generate(PROMPTS, [spec] * 3, [True] * 3):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)
