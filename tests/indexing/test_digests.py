"""DigestSet (indexing/corpus/digests.py) answers like a dict of 64-bit keys to 32-bit values, across flushes
and log-structured merges of its sorted runs."""

import random

import numpy as np

from indexing.corpus.digests import DigestSet


def test_digest_set_answers_like_a_dict_across_runs_and_merges():
    rng, d, ref = random.Random(7), DigestSet(run=16), {}
    keys = [rng.getrandbits(64) for _ in range(3000)] + [0, 2**64 - 1]
    for k in keys:
        if d.get(k) is None:  # first value kept, as passages_of keeps the first passage of an id
            v = rng.getrandbits(64)
            d.add(k, v)
            ref.setdefault(k, v & 0xFFFFFFFF)
        assert d.get(k) == ref[k]
    assert len(d) == len(ref) and len(d._runs) > 1
    for keys_, values in d._runs:
        assert keys_.dtype == np.uint64 and values.dtype == np.uint32 and np.all(np.diff(keys_.astype(object)) > 0)
    assert all(d.get(k) == v for k, v in ref.items())
    assert sum(d.get(rng.getrandbits(64)) is not None for _ in range(2000)) == 0
