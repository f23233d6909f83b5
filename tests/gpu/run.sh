#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU and driver (no toolkit
# needed: the library loads libcuda at run time and ships its kernels as PTX).
# From a clean copy of the repository, with gcc and cmake, no network:
#
#   OUT=/some/dir tests/gpu/run.sh
#
# Steps, all under one deadline (DEADLINE seconds, default 480; each step gets
# what is left, minus a few seconds kept for the summary):
#   1. build (Release, tests on) into build-gpu/
#   2. mapping info, nvidia-smi, where libcuda is
#   3. ctest: labels cuda and example (conformance.cuda.*, internal.cuda.*,
#      backend.cuda.*, examples), -j8, no cli.* and no fake-driver tests
#   4. the CUDA example (a real kernel from the shipped PTX)
#   5. mapping bench --backend cuda --only cuda-raw (every figure a ratio
#      against direct driver calls in the same run), then, with time left,
#      the other sections (--quick)
#   6. the Python package's tests (PyTorch/CuPy interop), once it exists
# $OUT/summary.txt is appended line by line as steps finish, so a run killed
# at any point still leaves the figures so far. At most 6 files in $OUT:
# summary.txt, build.log, ctest.log, bench.txt, bench.json, misc.log.
#
# MAPPING_GPU_REHEARSAL=1 runs the same steps on the fake driver built with
# the tests (tests/fake/fake_libcuda.c), on a machine without a GPU.
# Exit status: 0 all passed on CUDA, 1 something failed, 77 CUDA unavailable.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$build/gpu-results}
mkdir -p "$OUT"
t_start=$(date +%s)
deadline=$((t_start + ${DEADLINE:-480}))
summary=$OUT/summary.txt
rm -f "$OUT"/{summary.txt,build.log,ctest.log,bench.txt,bench.json,misc.log}
failures=()

# Appends one line to the summary (and prints it).
say() { printf '%s\n' "$*" | tee -a "$summary"; }
# Seconds left for a step, keeping `reserve` for what follows it.
left() { local l=$((deadline - $(date +%s) - ${1:-10})); echo $((l > 0 ? l : 0)); }
elapsed() { echo $(($(date +%s) - t_start)); }
misc() { printf '\n==== %s (%ds)\n' "$*" "$(elapsed)" >>"$OUT/misc.log"; }

say "tests/gpu/run.sh $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), deadline ${DEADLINE:-480} s, $(nproc) cores"

# ---- the driver: nvidia-smi, where libcuda is ----------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>&1 | head -4)
    say "nvidia-smi: ${smi//$'\n'/; }"
else
    say "nvidia-smi: not found"
fi
libcuda=""
if [ -n "${MAPPING_CUDA_LIBRARY:-}" ]; then
    libcuda="$MAPPING_CUDA_LIBRARY (MAPPING_CUDA_LIBRARY)"
elif path=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64|libcuda\.so\.1 / {print $NF; exit}') && [ -n "$path" ]; then
    libcuda="$path (ldconfig -p)"
else
    for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [ -e "$dir/libcuda.so.1" ]; then
            export MAPPING_CUDA_LIBRARY="$dir/libcuda.so.1"
            export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            libcuda="$dir/libcuda.so.1 (found there; MAPPING_CUDA_LIBRARY set)"
            break
        fi
    done
fi
[ -z "$libcuda" ] && [ "${MAPPING_GPU_REHEARSAL:-0}" != 1 ] && libcuda="not found (ldconfig -p, /usr/local/nvidia/lib64)"

# ---- 1. build --------------------------------------------------------------------
jobs=$(nproc 2>/dev/null || echo 4)
t0=$(date +%s)
if timeout "$(left 300)" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMAPPING_BUILD_TESTS=ON >"$OUT/build.log" 2>&1 &&
   timeout "$(left 240)" cmake --build "$build" -j"$jobs" >>"$OUT/build.log" 2>&1; then
    warnings=$(grep -c -i "warning:" "$OUT/build.log")
    say "build: ok in $(($(date +%s) - t0)) s, $warnings warnings"
else
    say "build: FAILED after $(($(date +%s) - t0)) s (tail of build.log:)"
    tail -15 "$OUT/build.log" | sed 's/^/  /' | tee -a "$summary"
    say "result: FAILED (build), $(elapsed) s"
    exit 1
fi
if [ "${MAPPING_GPU_REHEARSAL:-0}" = 1 ]; then
    export MAPPING_CUDA_LIBRARY="$root/$build/tests/libfake_libcuda.so"
    libcuda="$MAPPING_CUDA_LIBRARY (rehearsal: the fake driver)"
fi
say "libcuda: $libcuda"

# ---- 2. mapping info -------------------------------------------------------------
misc "mapping info"
timeout "$(left 60)" "$build/mapping" info >>"$OUT/misc.log" 2>&1
cuda_line=$(grep -E '^  cuda ' "$OUT/misc.log" | head -1)
cuda_available=$(awk '$1 == "cuda" && $2 == "available" {print 1; exit}' "$OUT/misc.log")
cuda_available=${cuda_available:-0}
card=$(awk '/^  cuda +available/{f=1;next} f && /^    \[0\]/{sub(/^    \[0\] /,""); print; exit}' "$OUT/misc.log")
driver=$(awk '/^  cuda +available/{f=1;next} f && /driver:/{sub(/^ *driver: /,""); print; exit}' "$OUT/misc.log")
if [ "$cuda_available" = 1 ]; then
    say "info: cuda available: ${card:-?}; ${driver:-?}"
else
    cuda_line=$(echo "${cuda_line:-cuda not listed}" | sed 's/^ *//; s/  */ /g')
    say "info: $cuda_line"
fi

# ---- 3. ctest: cuda and the examples ---------------------------------------------
labels=(-L '^(cuda|example)$' -LE '^(fakecuda|fakecuda128|cli)$')
total=$(ctest --test-dir "$build" -N "${labels[@]}" 2>/dev/null | sed -n 's/^Total Tests: *//p')
t0=$(date +%s)
budget=$(left 150) # keeps time for the example and the bench's headline figures
stop=$(date -d "@$(($(date +%s) + budget))" +%H:%M:%S)
timeout "$((budget + 15))" ctest --test-dir "$build" "${labels[@]}" -j8 --stop-time "$stop" --output-on-failure \
    >"$OUT/ctest.log" 2>&1
ctest_rc=$?
passed=$(grep -cE "Test +#[0-9]+: .* +Passed" "$OUT/ctest.log")
skipped=$(grep -cE "Test +#[0-9]+: .*\*\*\*Skipped" "$OUT/ctest.log")
failed=$(($(grep -cE "Test +#[0-9]+: .*\*\*\*" "$OUT/ctest.log") - skipped))
ran=$((passed + failed + skipped))
line="ctest (labels cuda, example; -j8): $passed passed, $failed failed, $skipped skipped of ${total:-?} in $(($(date +%s) - t0)) s"
[ -n "$total" ] && [ "$ran" -lt "$total" ] && line="$line; $((total - ran)) NOT RUN (out of time)"
say "$line"
if [ "$ctest_rc" -ne 0 ] || [ "$failed" -ne 0 ] || { [ -n "$total" ] && [ "$ran" -lt "$total" ]; }; then
    failures+=("ctest")
    grep -E "Test +#[0-9]+: .*\*\*\*" "$OUT/ctest.log" | grep -v "\*\*\*Skipped" |
        head -20 | sed 's/^ */  /' | tee -a "$summary"
fi
if [ "$cuda_available" = 1 ] && [ "$skipped" -gt 0 ]; then
    grep -E "^SKIP" "$OUT/ctest.log" | sort | uniq -c | head -5 | sed 's/^ */  skip: /' | tee -a "$summary"
fi

# ---- 4. the CUDA example -----------------------------------------------------------
misc "example_cuda_kernel"
timeout "$(left 120)" "$build/example_cuda_kernel" >>"$OUT/misc.log" 2>&1
case $? in
0) say "example cuda_kernel: passed" ;;
77) say "example cuda_kernel: skipped ($(grep -m1 SKIP "$OUT/misc.log" || echo no reason))" ;;
124) say "example cuda_kernel: TIMED OUT"; failures+=("example") ;;
*) say "example cuda_kernel: FAILED (misc.log)"; failures+=("example") ;;
esac

# ---- 5. the bench: cuda-raw first, the rest with the time left -----------------------
if [ "$cuda_available" = 1 ]; then
    t0=$(date +%s)
    timeout "$(left 30)" "$build/mapping" bench --backend cuda --only cuda-raw --json >"$OUT/bench.json" \
        2>"$OUT/bench.txt"
    rc=$?
    case $rc in
    0) say "bench cuda-raw: completed in $(($(date +%s) - t0)) s (speed ratio = driver time / mapping time)" ;;
    124) say "bench cuda-raw: TIMED OUT after $(($(date +%s) - t0)) s (the tables it finished are in bench.txt)"; failures+=("bench") ;;
    *) say "bench cuda-raw: FAILED (exit $rc)"; failures+=("bench") ;;
    esac
    grep -E "^  => " "$OUT/bench.txt" | sed 's/^  => /  /' | tee -a "$summary"
    rest=$(left 20)
    if [ "$rest" -ge 40 ]; then
        t0=$(date +%s)
        echo >>"$OUT/bench.txt"
        timeout "$rest" "$build/mapping" bench --backend cuda --quick \
            --only bandwidth,latency,batch,mirror,mirror_mark,pipeline >>"$OUT/bench.txt" 2>&1
        rc=$?
        say "bench other sections (--quick): $([ $rc = 0 ] && echo completed || echo "stopped (exit $rc)") in $(($(date +%s) - t0)) s"
        awk 'f && /^  => /; /^Scattered 64-byte copies \(stride/{f=1}' "$OUT/bench.txt" | sed 's/^  => /  /' |
            head -8 | tee -a "$summary"
    else
        say "bench other sections: skipped (${rest} s left)"
    fi
else
    say "bench: skipped, cuda is unavailable"
fi

# ---- 6. the Python package (PyTorch / CuPy interop) ---------------------------------
# The build made the extension in $build/python/mapping (tests/python/CMakeLists.txt).
if [ ! -d "$build/python/mapping" ]; then
    say "python: not built (no Python headers or numpy here)"
elif ! python3 -c "import pytest" >/dev/null 2>&1; then
    say "python: pytest is not installed"
else
    misc "pytest tests/python/test_gpu_interop.py tests/python/test_cuda_paths.py"
    t0=$(date +%s)
    MAPPING_BACKEND=cuda PYTHONPATH="$root/$build/python${PYTHONPATH:+:$PYTHONPATH}" \
        timeout "$(left 5)" python3 -m pytest -q -rs -p no:cacheprovider \
        tests/python/test_gpu_interop.py tests/python/test_cuda_paths.py >>"$OUT/misc.log" 2>&1
    rc=$?
    say "python (torch/CuPy interop): $(tail -1 "$OUT/misc.log") [exit $rc, $(($(date +%s) - t0)) s]"
    [ $rc -ne 0 ] && [ $rc -ne 5 ] && failures+=("python")
fi

# ---- the result -----------------------------------------------------------------------
if [ ${#failures[@]} -gt 0 ]; then
    say "result: FAILED (${failures[*]}), $(elapsed) s"
    exit 1
fi
if [ "$cuda_available" != 1 ]; then
    say "result: SKIPPED (no usable CUDA device), $(elapsed) s"
    exit 77
fi
say "result: PASSED, $(elapsed) s"
exit 0
