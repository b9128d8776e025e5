"""jobs/bench/rig/memory_cap.py: a command in a memory cgroup is killed when its own (anonymous) memory passes the
cap, and finishes when what passes the cap is page cache of a file it maps. Skipped where cgroups cannot be
made (not root, no memory controller)."""

from __future__ import annotations

import os
import sys

import pytest

from jobs.bench.rig import memory_cap

MIB = 1 << 20
CAP = 200 * MIB


@pytest.fixture(scope="module")
def capped():
    if os.geteuid() != 0:
        pytest.skip("memory cgroups need root")
    try:  # a cgroup made, capped and the page cache dropped: all of it allowed here
        memory_cap.run_capped(["true"], CAP)
    except memory_cap.MemoryCapUnavailable as e:
        pytest.skip(str(e))
    return memory_cap.run_capped


def test_own_memory_over_the_cap_is_killed(capped):
    run = capped([sys.executable, "-c", f"b = bytearray({3 * CAP}); print('survived')"], CAP)
    assert run.oom_killed and "survived" not in run.stdout
    assert run.peak_bytes is None or run.peak_bytes <= CAP


def test_mapped_file_larger_than_the_cap_is_read(capped, tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:  # 2.5 x the cap, each page distinct
        for i in range(5 * CAP // MIB // 2):
            f.write(i.to_bytes(4, "little") * (MIB // 4))
    code = (
        "import mmap, sys\n"
        f"f = open({str(big)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "print(sum(m[i] for i in range(0, len(m), 4096)))\n"
    )
    run = capped([sys.executable, "-c", code], CAP)
    assert run.returncode == 0 and not run.oom_killed
    assert int(run.stdout) == sum(i % 256 for i in range(5 * CAP // MIB // 2)) * (MIB // 4096)
    # the file's pages were charged to the cgroup (the page cache was dropped first) and reclaimed at the cap
    assert run.peak_bytes is None or 0.9 * CAP < run.peak_bytes <= CAP
