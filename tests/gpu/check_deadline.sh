#!/usr/bin/env bash
# Test of tests/gpu/run.sh itself (ctest gpu.run_sh_deadline): a copy of the
# script outside any git checkout, with a deadline too short for any step.
#   - the commit comes from $MAPPING_COMMIT when there is no .git;
#   - a step with too little time is SKIPPED and says so (`timeout 0` would
#     mean no limit: the build must not start at all);
#   - the result is FAILED (exit 1), and at most the six documented files.
set -uo pipefail
script=$(cd "$(dirname "$0")" && pwd)/run.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/repo/tests/gpu"
cp "$script" "$tmp/repo/tests/gpu/run.sh"
fail=0
check() { if ! grep -q -- "$1" "$tmp/out/summary.txt"; then echo "FAIL: summary lacks '$1'"; fail=1; fi; }
(cd "$tmp" && env -u MAPPING_GPU_REHEARSAL GIT_CEILING_DIRECTORIES="$tmp" DEADLINE=1 OUT="$tmp/out" \
    BUILD_DIR="$tmp/build" MAPPING_COMMIT=c0ffee1 PATH="$PATH" bash repo/tests/gpu/run.sh) >"$tmp/log" 2>&1
rc=$?
cat "$tmp/out/summary.txt"
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, expected 1"; fail=1; }
check "commit c0ffee1"
check "build: SKIPPED"
check "result: FAILED (build)"
if [ -e "$tmp/build/CMakeCache.txt" ]; then echo "FAIL: the build ran with no time left"; fail=1; fi
n=$(find "$tmp/out" -type f | wc -l)
[ "$n" -le 6 ] || { echo "FAIL: $n files in OUT"; fail=1; }
[ "$fail" = 0 ] && echo "PASSED"
exit "$fail"
