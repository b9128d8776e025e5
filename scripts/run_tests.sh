#!/usr/bin/env bash
# Run the tests in one pytest process, so that the tiny vLLM engine, the models and the JVM start once per
# session (tests/conftest.py), except the files marked `own_process`, each run in a process of its own after the
# rest: those that start Ray (Ray beside a JVM that other files started crashed one long-lived interpreter, a
# segfault seen with test_indexing_incremental's Ray build), and the index-build memory test (its allocator and
# JVM settings apply only before the JVM starts; after other faults tests it grew 252 MiB instead of ~8).
# TESTS=glob picks the files (default tests/test_*.py). Ends with the failing test ids, if any, and the summed
# plain line "N passed, N failed, N skipped"; each process prints its 15 slowest tests. Extra args go to every pytest.
# An own-process file names each test as it starts (-v); one that ends without pytest's summary (a native exit)
# shows its last lines and Ray's driver log, is run once more, and is named at the end as crashed once.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
files=(${TESTS:-tests/test_*.py})
own=(); shared=()
for f in "${files[@]}"; do
  if grep -q "pytest.mark.own_process" "$f"; then own+=("$f"); else shared+=("$f"); fi
done
# each file's test seconds (tests/conftest.py appends them) and each process's wall seconds, printed at the end
times=${DYNRAG_TEST_TIMES:-$(mktemp)}; export DYNRAG_TEST_TIMES=$times; walls=""
passed=0; failed=0; skipped=0; status=0; failures=""
pytest_once() {  # sets out and rc
  out=$("$py" -m pytest -rfE -p no:cacheprovider --durations=15 "$@" "${extra[@]}" 2>&1); rc=$?
}
summary() { printf '%s\n' "$out" | grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|deselected|error)' | tail -n 1; }
run() {  # one pytest process over the files given ($1: -q, or -v to name each test as it starts)
  local mode=$1; shift
  echo "=== $*"
  local t0=$SECONDS
  pytest_once "$mode" "$@"
  if [ "$mode" = -v ] && [ "$rc" -ne 0 ] && [ -z "$(summary)" ]; then
    # the process ended without pytest's summary (a native exit: Ray's core worker ends its driver with exit 1
    # when it loses its raylet or GCS): show where, with Ray's driver log, then run the file once more
    printf '%s\n' "$out" | tail -n 15
    log=$(ls -t /tmp/dynrag-gpu-*/session_*/logs/python-core-driver-*.log /tmp/ray/session_*/logs/python-core-driver-*.log 2>/dev/null | head -n 1)
    [ -n "$log" ] && { echo "--- the last lines of $log"; tail -n 20 "$log"; }
    echo "CRASHED $* (pytest exit $rc, no summary): running it once more"
    crashed="$crashed$*"$'\n'
    pytest_once "$mode" "$@"
  fi
  printf '%s\n' "$out" | tail -n 40
  walls="$walls$((SECONDS - t0)) s  process: $([ $# -gt 1 ] && echo "$# files" || echo "$1")"$'\n'
  line=$(summary)
  n() { printf '%s' "$line" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
  passed=$((passed + $(n passed))); failed=$((failed + $(n failed) + $(n error)))
  skipped=$((skipped + $(n skipped)))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    status=1; [ "$(n failed)$(n error)" = "00" ] && failed=$((failed + 1))
    ids=$(printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' || true)
    failures="$failures${ids:-CRASHED $* (pytest exit $rc)}"$'\n'
  fi
}
extra=("$@")
crashed=""
[ ${#shared[@]} -gt 0 ] && run -q "${shared[@]}"
for f in "${own[@]}"; do run -v "$f"; done
echo; echo "test seconds per file (setup + call + teardown), slowest first; tests run"
sort -t$'\t' -k2,2 -rn "$times" | awk -F'\t' '{ printf "%8.1f s %4d  %s\n", $2, $3, $1 }'
printf 'wall seconds per process (with its start and collection):\n%s' "$walls"
# Repeat the failures last, so that a log's tail names them.
[ -n "$failures" ] && printf '\nfailures:\n%s' "$failures"
[ -n "$crashed" ] && printf '\ncrashed once, then run again (see above):\n%s' "$crashed"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
