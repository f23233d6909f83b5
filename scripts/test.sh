#!/usr/bin/env bash
# Builds and runs the whole test suite: every back end available here (the
# others print SKIP with the reason), the examples, the CLI and an install.
# Extra arguments go to cmake; BUILD_DIR picks the build folder (build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
