#!/usr/bin/env bash
# The fuzz smoke run of CI: builds the libFuzzer targets (clang, AddressSanitizer
# + UndefinedBehaviorSanitizer, -DMAPPING_FUZZ=ON) and fuzzes each back end
# for FUZZ_SECONDS (60) in all: two thirds with the operation decoder
# (mapping_fuzz, from tests/fuzz/corpus/), one third with the mirror-core model
# over the feature matrix (mapping_fuzz_model, from tests/fuzz/corpus-model/).
# New inputs go to a scratch folder (the checked-in corpora are not changed);
# a failing input is kept as $BUILD_DIR/fuzz-<backend>-crash-* (the model's:
# fuzz-model-<backend>-crash-*), replay it with
#   MAPPING_BACKEND=<backend> MAPPING_FUZZ_TRACE=1 $BUILD_DIR/tests/fuzz/mapping_fuzz FILE
#   MAPPING_BACKEND=<backend> $BUILD_DIR/tests/fuzz/mapping_fuzz_model FILE
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
cmake --build "$build" -j"$(nproc)" --target mapping_fuzz mapping_fuzz_model
ops_seconds=$((seconds * 2 / 3))
model_seconds=$((seconds - ops_seconds))
# fuzz NAME CORPUS SECONDS BACKEND: one libFuzzer run; 0 passed, 77 skipped, else failed.
fuzz() {
  local name=$1 corpus=$2 secs=$3 backend=$4 work rc=0 tag
  tag=$backend
  [ "$name" = mapping_fuzz ] || tag=model-$backend
  work=$(mktemp -d)
  log=$build/fuzz-$tag.log
  echo "== fuzz smoke ($name) on $backend: ${secs} s"
  # -error_exitcode=1: libFuzzer's own default for a failing input is 77, the
  # exit status of a back end that is absent here.
  MAPPING_BACKEND=$backend MAPPING_HOST_POISON=1 "$build/tests/fuzz/$name" -max_total_time="$secs" -max_len=1024 \
    -timeout=30 -error_exitcode=1 -print_final_stats=1 -artifact_prefix="$build/fuzz-$tag-" "$work" "$corpus" \
    >"$log" 2>&1 || rc=$?
  rm -rf "$work"
  if [ $rc -eq 77 ]; then
    echo "SKIP: fuzz smoke ($name) on $backend: $(grep -m1 SKIP "$log" || echo 'the back end is absent')"
    return 77
  fi
  if [ $rc -ne 0 ]; then
    tail -n 60 "$log"
    echo "FAIL: fuzz smoke ($name) on $backend (exit $rc), log: $log"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  echo "fuzz smoke ($name) on $backend: $runs inputs, $rate per second, $cov, no failure"
}
for backend in ${FUZZ_BACKENDS:-host opencl}; do
  fuzz mapping_fuzz tests/fuzz/corpus "$ops_seconds" "$backend" || continue
  fuzz mapping_fuzz_model tests/fuzz/corpus-model "$model_seconds" "$backend" || true
done
