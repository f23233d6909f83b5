#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU and driver (no toolkit
# needed: the library loads libcuda at run time and ships its kernels as PTX).
# From a fresh copy of the repository, with gcc and cmake:
#
#   tests/gpu/run.sh
#
# 1. builds (Release, with tests) into build-gpu/
# 2. runs the tests on cuda (ctest label cuda: conformance.cuda.*, internal.cuda.*,
#    backend.cuda.*) and the examples
#    (their default back end is cuda when a GPU is present)
# 3. runs `mapping info`, `mapping bench --backend cuda` (full) and the cuda
#    example (a real kernel from the shipped PTX, on the library's stream)
# 4. prints a summary last: card, driver, pass/fail/skip counts, bench figures.
#
# Every step has a time limit; the whole script stays well under 10 minutes.
# Logs and the bench JSON go to $RESULTS (default: $OUT if set, else
# build-gpu/gpu-results). Exit status: 0 all passed on a GPU, 1 something
# failed, 77 CUDA is unavailable here (everything on cuda skipped).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${BUILD_DIR:-build-gpu}
RESULTS=${RESULTS:-${OUT:-$build/gpu-results}}
mkdir -p "$RESULTS"
# Results of an earlier run must not show up in this one's summary.
rm -f "$RESULTS"/{cmake.log,build.log,info.txt,nvidia-smi.txt,ctest.log,example_cuda_kernel.txt,bench.txt,bench.json}
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$(date +%s)
failures=()

step() { printf '\n==== %s (%ds)\n' "$*" $(($(date +%s) - t_start)); }

# ---- 1. build -----------------------------------------------------------------
step "build ($build, Release, -j$jobs)"
if ! timeout 300 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMAPPING_BUILD_TESTS=ON >"$RESULTS/cmake.log" 2>&1 ||
   ! timeout 300 cmake --build "$build" -j"$jobs" >"$RESULTS/build.log" 2>&1; then
    tail -30 "$RESULTS/cmake.log" "$RESULTS/build.log"
    echo "SUMMARY: build failed (logs in $RESULTS)"
    exit 1
fi
grep -iE "warning" "$RESULTS/build.log" | head -20

# ---- 2. mapping info ----------------------------------------------------------
step "mapping info"
timeout 60 "$build/mapping" info | tee "$RESULTS/info.txt"
cuda_line=$(grep -E '^  cuda ' "$RESULTS/info.txt" || echo "  cuda    (not listed)")
card=$(awk '/^  cuda +available/{f=1;next} f && /^    \[0\]/{sub(/^    \[0\] /,""); print; exit}' "$RESULTS/info.txt")
driver=$(awk '/^  cuda +available/{f=1;next} f && /driver:/{sub(/^ *driver: /,""); print; exit}' "$RESULTS/info.txt")
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
        --format=csv >"$RESULTS/nvidia-smi.txt" 2>&1 && cat "$RESULTS/nvidia-smi.txt"
fi
cuda_available=$(awk '$1 == "cuda" && $2 == "available" {print 1; exit}' "$RESULTS/info.txt")
cuda_available=${cuda_available:-0}

# ---- 3. the tests on cuda, and the examples -----------------------------------
step "ctest: label cuda (conformance, internal, backend) and examples"
timeout 300 ctest --test-dir "$build" -L '^(cuda|example)$' -LE fakecuda -j"$jobs" --timeout 60 --output-on-failure \
    >"$RESULTS/ctest.log" 2>&1
ctest_rc=$?
grep -E "Test +#|tests passed|tests failed" "$RESULTS/ctest.log" | sed 's/^ *//' | tail -80
total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$RESULTS/ctest.log" | tail -1)
failed=$(sed -n 's/.*, \([0-9]*\) tests failed out of.*/\1/p' "$RESULTS/ctest.log" | tail -1)
skipped=$(grep -c "(Skipped)" "$RESULTS/ctest.log")
total=${total:-0}
failed=${failed:-$total}
passed=$((total - failed - skipped))
if [ "$ctest_rc" -ne 0 ]; then
    failures+=("ctest ($failed failed)")
    grep -E "\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)" "$RESULTS/ctest.log" | head -40
fi

# ---- 4. the cuda example -------------------------------------------------------
step "examples/cuda_kernel.c"
timeout 60 "$build/example_cuda_kernel" 2>&1 | tee "$RESULTS/example_cuda_kernel.txt"
example_rc=${PIPESTATUS[0]}
case $example_rc in
0) example="passed" ;;
77) example="skipped" ;;
*) example="FAILED (exit $example_rc)"; failures+=("cuda example") ;;
esac

# ---- 4b. Python: torch / CuPy interop (DLPack, CUDA array interface) -------------
step "python: tests/python/test_gpu_interop.py (torch, CuPy; skipped where absent)"
python_gpu="not run (no Python extension in $build/python)"
if [ -d "$build/python/mapping" ]; then
    PYTHONPATH="$build/python" timeout 120 python3 -m pytest -q -rs -p no:cacheprovider \
        tests/python/test_gpu_interop.py 2>&1 | tee "$RESULTS/python_gpu.txt"
    py_rc=${PIPESTATUS[0]}
    python_gpu=$(tail -1 "$RESULTS/python_gpu.txt")
    [ "$py_rc" -ne 0 ] && [ "$py_rc" -ne 5 ] && failures+=("python gpu interop")
fi

# ---- 5. mapping bench --backend cuda (full) --------------------------------------
bench="not run"
if [ "$cuda_available" = 1 ]; then
    step "mapping bench --backend cuda (full; text in bench.txt, JSON in bench.json)"
    timeout "${BENCH_TIMEOUT:-300}" "$build/mapping" bench --backend cuda --json \
        >"$RESULTS/bench.json" 2> >(tee "$RESULTS/bench.txt" >&2)
    bench_rc=$?
    sleep 1 # let tee finish
    case $bench_rc in
    0) bench="completed" ;;
    124) bench="TIMED OUT after ${BENCH_TIMEOUT:-300}s (partial tables in bench.txt)"; failures+=("bench timeout") ;;
    *) bench="FAILED (exit $bench_rc)"; failures+=("bench") ;;
    esac
else
    step "mapping bench --backend cuda: skipped, cuda is unavailable"
fi

# ---- summary ---------------------------------------------------------------------
elapsed=$(($(date +%s) - t_start))
echo
echo "==================== SUMMARY (tests/gpu/run.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), ${elapsed}s) ===================="
echo "commit:   $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$cuda_available" = 1 ]; then
    echo "card:     ${card:-?}"
    echo "driver:   ${driver:-?}"
    [ -s "$RESULTS/nvidia-smi.txt" ] && echo "nvidia-smi: $(tail -1 "$RESULTS/nvidia-smi.txt")"
else
    echo "CUDA:     $(echo "$cuda_line" | sed 's/^ *cuda *//')"
    echo "          nothing on cuda was verified; the cuda tests below are skips"
fi
echo "ctest (label cuda + examples): $passed passed, $failed failed, $skipped skipped of $total"
echo "cuda example: $example"
echo "python (torch/CuPy): $python_gpu"
echo "bench:    $bench"
if [ -s "$RESULTS/bench.txt" ]; then
    grep -E "^  => " "$RESULTS/bench.txt" | sed 's/^  => /  /'
fi
echo "results:  $RESULTS"
if [ ${#failures[@]} -gt 0 ]; then
    echo "RESULT:   FAILED: ${failures[*]}"
    exit 1
fi
if [ "$cuda_available" != 1 ]; then
    echo "RESULT:   SKIPPED (no usable CUDA device)"
    exit 77
fi
echo "RESULT:   PASSED"
exit 0
