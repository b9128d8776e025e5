"""IdSet: the answered ids a resume skips, exact and compact (pipeline/io/id_set.py)."""

from __future__ import annotations

import pickle

import pyarrow as pa

from pipeline.io.id_set import IdSet


def test_membership_is_exact_for_ids_of_any_length():
    ids = ["q1", "q10", "5a8c7595554299585d9e36b6", "dynrag:line-3", "ü-ñ", "a"]
    s = IdSet(pa.chunked_array([ids[:3], ids[3:]]))
    assert all(q in s for q in ids) and len(s) == len(ids) and s == set(ids)
    for other in ("q", "q100", "5a8c7595554299585d9e36b", "5a8c7595554299585d9e36b6x", "", "b", 1, None):
        assert other not in s  # prefixes, longer ids, other types
    assert sorted(s) == sorted(ids) and IdSet(ids) == s and "q1" not in IdSet()


def test_a_million_ids_take_a_buffer_not_a_million_objects():
    """Held by the driver of a resumed run and unpickled by its read task: 10^6 ids as one buffer (16 MB) against
    a Python set of 10^6 strings (the set's table alone 32 MB, each string another ~60 bytes)."""
    import tracemalloc

    ids = pa.array([f"question-{i:07d}" for i in range(1_000_000)])
    tracemalloc.start()
    compact = pickle.loads(pickle.dumps(IdSet(ids)))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tracemalloc.start()
    plain = pickle.loads(pickle.dumps(set(ids.to_pylist())))
    held_plain = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert held < 0.25 * held_plain, (held, held_plain)
    assert "question-0999999" in compact and "question-1000000" not in compact and len(compact) == len(plain)


def test_seen_ids_grow_one_at_a_time_exactly_and_compactly(monkeypatch):
    """The ids a dataset's reader has seen (to tell a repeat): exact membership across the pending set and the
    merged sorted arrays (ids of different lengths, a NUL inside), far smaller than a Python set of them."""
    import sys

    from pipeline.io.id_set import SeenIds

    monkeypatch.setattr(SeenIds, "PENDING", 7)
    seen = SeenIds()
    ids = [f"q{i}" + "x" * (i % 5) for i in range(200)] + ["a\0b", "ü-ñ"]
    for i, q in enumerate(ids):
        assert q not in seen
        seen.add(q)
        assert q in seen and ids[i // 2] in seen and len(seen) == i + 1
    assert 2 <= len(seen.sorted) <= 8  # merged as they grow: O(log n) arrays
    assert all(q in seen for q in ids)
    for other in ("q1xx", "q", "a", "a\0", "ü", "", None, 3):
        assert other not in seen

    monkeypatch.setattr(SeenIds, "PENDING", 65_536)
    ids = [f"5a8c7595554299585d9e{i:06d}" for i in range(200_000)]
    big = SeenIds()
    for q in ids:
        big.add(q)
    held = sum(a.nbytes for a in big.sorted) + len(big.bits) + sys.getsizeof(big.pending)
    held += sum(sys.getsizeof(q) for q in big.pending)
    plain = set(ids)
    plain_held = sys.getsizeof(plain) + sum(sys.getsizeof(q) for q in plain)
    assert held < 0.5 * plain_held, (held, plain_held)  # ~7 MB against ~23 MB
    assert "5a8c7595554299585d9e199999" in big and "5a8c7595554299585d9e200000" not in big
