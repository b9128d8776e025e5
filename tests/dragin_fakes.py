"""DRAGIN's tests' shared pieces: three passages, an `attention.stats` item, and VllmLike, a scripted reasoning
returned as vLLM returns it (the tiny model's byte-level tokens) through VllmGenerator's own conversion."""

from __future__ import annotations

import numpy as np

PASSAGES = [
    ("p1", "Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg."),
    ("p2", "Paris", "Paris is the capital of France."),
    ("p3", "Rome", "Rome is the capital of Italy."),
]


def attention_item(tok, prompt: str, generated: str, context, generated_ids=None) -> dict:
    """An `attention.stats` item; the generated ids are the text's own encoding unless given."""
    ids = tok(generated, add_special_tokens=False)["input_ids"] if generated_ids is None else generated_ids
    return {
        "prompt": prompt,
        "prompt_ids": tok(prompt)["input_ids"],
        "generated": generated,
        "generated_ids": list(ids),
        "context": context,
    }


# an answer whose first sentence has multi-byte characters, each of its UTF-8 bytes one token of the tiny model
FIRST = " 東京 and Tōkyō are one city."
BYTE_GUESS = FIRST + " The film was made by Zorblat Unknown. So the answer is Unknown."
BYTE_INFORMED = FIRST + " The film was made by Steven Spielberg. So the answer is Steven Spielberg."


class VllmLike:
    """The scripted reasoning as vLLM returns it (ids of the tiny model's tokenizer, the last completing the stop
    "\\n"; each logprob's `decoded_token` its id decoded alone; " Zorblat" improbable), turned into Completions
    by VllmGenerator's own conversion."""

    def __init__(self, tok):
        from pipeline.backends.vllm_gen import VllmGenerator

        self.tok, self.outs = tok, []
        self.vllm = object.__new__(VllmGenerator)  # only its output conversion, with the model's tokenizer
        self.vllm.tokenizer = tok
        others = tok(BYTE_GUESS.replace(" Zorblat", "") + BYTE_INFORMED, add_special_tokens=False)["input_ids"]
        self.zorblat = set(tok(" Zorblat", add_special_tokens=False)["input_ids"]) - set(others)
        assert self.zorblat

    def generate(self, prompts, samplings, chats):
        from types import SimpleNamespace

        outs = []
        for prompt, spec in zip(prompts, samplings):
            target = BYTE_INFORMED if "Context:" in prompt else BYTE_GUESS
            so_far = prompt.rsplit("\nAnswer:", 1)[1]
            text = target[len(so_far) :] if so_far and target.startswith(so_far) else target
            text = " Unknown." if so_far.endswith("So the answer is") else text
            ids = self.tok(text + "\n", add_special_tokens=False)["input_ids"]
            lps = None
            if spec.logprobs:
                p = [0.1 if t in self.zorblat else 0.9 for t in ids]
                lps = [
                    {t: SimpleNamespace(logprob=np.log(x), decoded_token=self.tok.decode([t]))} for t, x in zip(ids, p)
                ]
            c = SimpleNamespace(text=text, token_ids=ids, logprobs=lps, finish_reason="stop", stop_reason=None)
            ro = SimpleNamespace(prompt_token_ids=self.tok(prompt)["input_ids"], outputs=[c])
            outs.append(self.vllm._completion(ro, spec))
        self.outs += outs
        return outs
