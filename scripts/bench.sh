#!/usr/bin/env bash
# Builds (Release) and runs `mapping bench` on the default back end.
# Arguments go to `mapping bench` (e.g. --quick, --backend opencl, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DMAPPING_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target mapping_cli >/dev/null
exec ./build-release/mapping bench "$@"
