"""ERM4's small world for the tests of its programs, runs and tables: four passages, a bag-of-words embedder
and the scripted replies of its prompts (query rewriter, NLI filter, answer)."""

from __future__ import annotations

import re

import numpy as np

PASSAGES = [
    ("p1", "Titanic (1997 film)", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
    ("p3", "Rome", "Rome is the capital of Italy."),
    ("p4", "Academy Awards", "The Academy Awards honour films."),
]


class WordEmbedder:
    """Bag-of-words vectors over a fixed vocabulary: titles sharing words with a query are similar."""

    VOCAB = ["titanic", "film", "cameron", "james", "rome", "academy", "awards", "picture", "director", "1998"]

    def __init__(self):
        self.calls = []

    def embed(self, texts, model=None):
        self.calls.append(len(texts))
        out = np.zeros((len(texts), len(self.VOCAB) + 1), dtype=np.float32)
        for i, t in enumerate(texts):
            words = re.findall(r"\w+", t.lower())
            for j, w in enumerate(self.VOCAB):
                out[i, j] = words.count(w)
            out[i, -1] = 0.1  # never a zero vector
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def reply(prompt):
    text = str(prompt)
    if "search-friendly Queries" in text:
        return "Who directed Titanic, the 1998 Best Picture?**Titanic film**James Cameron director**Academy Awards 1998"
    if "one short search query" in text:
        return "Titanic director"
    if "NLI problem" in text:
        return "entailment" if "Cameron" in text.split("[Knowledge]:")[-1] else "neutral"
    return "Answer: James Cameron"
