#!/usr/bin/env bash
# Run the tests in one pytest process, so that the tiny vLLM engine, the models and the JVM start once per
# session (tests/conftest.py), except the files marked `own_process`, each run in a process of its own after the
# rest: those that start Ray (Ray beside a JVM that other files started crashed one long-lived interpreter, a
# segfault seen with test_indexing_incremental's Ray build), and the index-build memory test (its allocator and
# JVM settings apply only before the JVM starts; after other faults tests it grew 252 MiB instead of ~8).
# TESTS=glob picks the files (default tests/test_*.py). Ends with the failing test ids, if any, and the summed
# plain line "N passed, N failed, N skipped"; each process prints its 15 slowest tests. Extra args go to every pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
files=(${TESTS:-tests/test_*.py})
own=(); shared=()
for f in "${files[@]}"; do
  if grep -q "pytest.mark.own_process" "$f"; then own+=("$f"); else shared+=("$f"); fi
done
passed=0; failed=0; skipped=0; status=0; failures=""
run() {  # one pytest process over the files given
  echo "=== $*"
  out=$("$py" -m pytest -q -rfE -p no:cacheprovider --durations=15 "$@" "${extra[@]}" 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 40
  line=$(printf '%s\n' "$out" | grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|deselected|error)' | tail -n 1)
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
[ ${#shared[@]} -gt 0 ] && run "${shared[@]}"
for f in "${own[@]}"; do run "$f"; done
# Repeat the failures last, so that a log's tail names them.
[ -n "$failures" ] && printf '\nfailures:\n%s' "$failures"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
