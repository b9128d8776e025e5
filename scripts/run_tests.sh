#!/usr/bin/env bash
# Run each test file in its own pytest process: the JVM (pyserini), vLLM's engine processes and
# torch do not always share one long-lived interpreter well (a segfault was seen in one process).
# TESTS=glob picks the files (default tests/test_*.py). Ends with the failing test ids, if any, and
# the summed plain line "N passed, N failed, N skipped". Extra args go to every pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
passed=0; failed=0; skipped=0; status=0; failures=""
for f in ${TESTS:-tests/test_*.py}; do
  echo "=== $f"
  out=$("$py" -m pytest -q -rfE -p no:cacheprovider "$f" "$@" 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 25
  line=$(printf '%s\n' "$out" | grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|deselected|error)' | tail -n 1)
  n() { printf '%s' "$line" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
  passed=$((passed + $(n passed))); failed=$((failed + $(n failed) + $(n error)))
  skipped=$((skipped + $(n skipped)))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    status=1; [ "$(n failed)$(n error)" = "00" ] && failed=$((failed + 1))
    ids=$(printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' || true)
    failures="$failures${ids:-CRASHED $f (pytest exit $rc)}"$'\n'
  fi
done
# Repeat the failures last, so that a log's tail names them.
[ -n "$failures" ] && printf '\nfailures:\n%s' "$failures"
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
