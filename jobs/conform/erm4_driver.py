"""ERM4's side of `dynrag conform`: the authors' own classes (Ancientshi/ERM4 `Components.py`, `utils.py`,
`config.py`, imported from the checkout, never copied) answering dynrag's questions one at a time, as the
per-question loop of their `main.py` does, with every LLM call, retrieval and filter judgment traced.

Runs with the python of the reference venv (jobs/conform/env.py): `python -P erm4_driver.py CONFIG.json`.
CONFIG: `source` (the checkout), `argv` (their config.py's options: the prompt files, page_num, ...),
`filter` (run the Knowledge Filter: configuration iv; false: iii), `questions` ([{id, question}]),
`llm_url` (the harness's OpenAI-compatible base URL, `.../v1`), `retrieval_url` (the harness's retriever),
`out` (a JSONL file: a `setup` line, then one line per question).

What the harness changes, and only at the edges:
- Transport: `utils.GPT_QA` and `async_GPT_QA` post to api.openai.com; here to `llm_url` (their requests and
  aiohttp calls, redirected by URL). `utils.py` leaves its aiohttp import commented out, so `async_GPT_QA`
  (the Knowledge Filter's) would raise NameError on `ClientSession`, which `KnowledgeFilter.async_run` takes
  as "contradiction" for every instance: the filter would drop all knowledge. The harness gives `utils` the
  aiohttp `ClientSession` that the code was written against.
- Retrieval: `Components.searchbing` (Bing's web search) returns dynrag's passages for each query, top
  `page_num`, in Bing's JSON shape (`name` the title, `snippet` the passage text, `url` the passage id).
- The loop: main.py reads pre-fetched Bing knowledge from its demo files; here `KnowledgeRetriever.retrieve`
  fetches it for the rewriter's queries (summary=True, as snippets), as the four-module system does.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # dynrag's tree, last on the path: for record.py alone
from jobs.conform.record import prompt_sha, question_row, write_row  # noqa: E402

TRACE: list[dict] = []  # the current question's events
OPENAI = "https://api.openai.com/v1"


def redirect_transport(utils, llm_url: str) -> None:
    """The authors' LLM calls to the harness's server: requests.post and aiohttp's ClientSession.post with the
    OpenAI URL rewritten; everything else as it is."""
    import types

    import aiohttp
    import requests

    def to_harness(url: str) -> str:
        return llm_url + url[len(OPENAI) :] if url.startswith(OPENAI) else url

    shim = types.SimpleNamespace(**{k: getattr(requests, k) for k in dir(requests) if not k.startswith("__")})
    shim.post = lambda url, *a, **k: requests.post(to_harness(url), *a, **k)
    utils.requests = shim

    import warnings

    with warnings.catch_warnings():  # aiohttp discourages subclassing; this one changes the URL only
        warnings.simplefilter("ignore", DeprecationWarning)

        class ClientSession(aiohttp.ClientSession):
            def post(self, url, *a, **k):
                return super().post(to_harness(url), *a, **k)

    utils.ClientSession = ClientSession  # the import utils.py has commented out


def traced_llm(fn, is_async: bool):
    """GPT_QA / async_GPT_QA with each call's prompt and output into TRACE."""

    def record(prompt: str, text: str) -> str:
        TRACE.append({"kind": "generate", "prompt_sha": prompt_sha(prompt), "prompt": prompt, "text": text})
        return text

    if is_async:

        async def acall(prompt, *a, **k):
            return record(prompt, await fn(prompt, *a, **k))

        return acall
    return lambda prompt, *a, **k: record(prompt, fn(prompt, *a, **k))


def search_with(retrieval_url: str):
    """`searchbing(query, page_num)` answered by the harness, in Bing's JSON shape."""

    def searchbing(query, page_num):
        body = json.dumps({"queries": [query], "k": int(page_num)}).encode()
        req = urllib.request.Request(retrieval_url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            hits = json.loads(r.read())["hits"][0]
        TRACE.append({"kind": "retrieve", "query": query, "ids": [h["id"] for h in hits]})
        return {"webPages": {"value": [{"name": h["title"], "url": h["id"], "snippet": h["text"]} for h in hits]}}

    return searchbing


def prediction_of(result) -> str:
    """The reader's answer as their evaluation reads it: the parsed JSON list's items (their EM/F1 take each
    item), joined; a response that was not JSON as it is."""
    if isinstance(result, list):
        return " ".join(str(x) for x in result)
    return result if isinstance(result, str) else json.dumps(result)


def main(config_path: str) -> None:
    import asyncio

    c = json.loads(Path(config_path).read_text())
    src = Path(c["source"])
    sys.path.insert(0, str(src))
    sys.argv = ["main.py", "--root_path", str(src), *c["argv"]]
    import Components  # the authors' modules (config.py parses sys.argv on import)
    import utils
    from config import args

    redirect_transport(utils, c["llm_url"])
    Components.GPT_QA = traced_llm(utils.GPT_QA, False)
    Components.async_GPT_QA = traced_llm(utils.async_GPT_QA, True)
    Components.searchbing = search_with(c["retrieval_url"])
    rewriter = Components.QuestionRewriter(args.question_rewritter_prompt)
    retriever = Components.KnowledgeRetriever()
    knowledge_filter = Components.KnowledgeFilter(args.knowledge_filter_prompt)
    reader = Components.Reader(args.reader_prompt, silicon_flow_qa=args.use_silicon_flow)
    with open(c["out"], "w") as out:
        write_row(out, {"setup": True, "args": vars(args)})
        for q in c["questions"]:
            # main.py's loop body, with the retriever its demo skips
            with question_row(q["id"], q["question"], TRACE) as row:
                rewritten_list, queries = rewriter.rewrite(q["question"])
                rewritten = " ".join(rewritten_list)
                knowledge = retriever.retrieve(queries, summary=True, maxlength=args.maxlength, pagenum=args.page_num)
                if c["filter"]:
                    knowledge = asyncio.run(knowledge_filter.filter(q["question"], knowledge))
                result = reader.read(rewritten, knowledge, None, None, None)
                row.update(kept=list(knowledge), text=json.dumps(result), prediction=prediction_of(result))
            write_row(out, row)


if __name__ == "__main__":
    main(sys.argv[1])
