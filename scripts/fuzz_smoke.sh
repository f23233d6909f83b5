#!/usr/bin/env bash
# The fuzz smoke run of CI: builds the libFuzzer target (clang, AddressSanitizer
# + UndefinedBehaviorSanitizer, -DMAPPING_FUZZ=ON) and fuzzes each back end
# for FUZZ_SECONDS (60) from the checked-in seed corpus tests/fuzz/corpus/.
# New inputs go to a scratch folder (the checked-in corpus is not changed);
# a failing input is kept as $BUILD_DIR/fuzz-<backend>-crash-*, replay it with
#   MAPPING_BACKEND=<backend> MAPPING_FUZZ_TRACE=1 $BUILD_DIR/tests/fuzz/mapping_fuzz FILE
# Environment: FUZZ_SECONDS, FUZZ_BACKENDS ("host opencl"), BUILD_DIR (build-fuzz).
# docs/testing.md explains longer runs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
build=${BUILD_DIR:-build-fuzz}
if ! command -v clang >/dev/null; then
  echo "SKIP: fuzz smoke: clang is not installed (libFuzzer comes with it)"
  exit 0
fi
CC=clang cmake -S . -B "$build" -DMAPPING_FUZZ=ON -DMAPPING_SANITIZE=address,undefined \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target mapping_fuzz
fuzzer=$build/tests/fuzz/mapping_fuzz
for backend in ${FUZZ_BACKENDS:-host opencl}; do
  work=$(mktemp -d)
  log=$build/fuzz-$backend.log
  echo "== fuzz smoke on $backend: ${seconds} s"
  rc=0
  MAPPING_BACKEND=$backend MAPPING_HOST_POISON=1 "$fuzzer" -max_total_time="$seconds" -max_len=1024 \
    -timeout=30 -print_final_stats=1 -artifact_prefix="$build/fuzz-$backend-" "$work" tests/fuzz/corpus \
    >"$log" 2>&1 || rc=$?
  rm -rf "$work"
  if [ $rc -eq 77 ]; then
    echo "SKIP: fuzz smoke on $backend: $(grep -m1 SKIP "$log" || echo 'the back end is absent')"
    continue
  fi
  if [ $rc -ne 0 ]; then
    tail -n 60 "$log"
    echo "FAIL: fuzz smoke on $backend (exit $rc), log: $log"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  echo "fuzz smoke on $backend: $runs inputs, $rate per second, $cov, no failure"
done
