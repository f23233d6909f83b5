#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU and driver (no toolkit
# needed: the library loads libcuda at run time and ships its kernels as PTX).
# From a clean copy of the repository, with gcc and cmake, no network:
#
#   OUT=/some/dir tests/gpu/run.sh
#
# Steps, all under one deadline (DEADLINE seconds, default 480; each step gets
# what is left, minus the seconds kept for what follows it; a step whose share
# is below its minimum is skipped and says so, never run without a limit;
# every limit is `timeout -k 10`, so a step that ignores SIGTERM is killed):
#   1. build (Release, tests on) into build-gpu/ (Ninja where make is absent;
#      -DPython3_EXECUTABLE=$(command -v python3), and whether Python.h exists)
#   2. mapping info, nvidia-smi, where libcuda is; the link the device
#      measured at open and the scatter mode in use
#   3. ctest: labels cuda and example (conformance.cuda.*, internal.cuda.*,
#      backend.cuda.*, examples), no cli.* and no fake-driver tests; -j8 only
#      when the GPU's compute mode is Default (an exclusive-process GPU takes
#      one process at a time: -j1); the skipped tests' reasons, counted
#   4. the CUDA example (a real kernel from the shipped PTX)
#   5. mapping bench --backend cuda --only cuda-raw,cuda-host,cuda-graph (every
#      figure a ratio against direct driver calls, or page-locked memory, in
#      the same run: memory pinned elsewhere as torch pins it, pageable memory
#      registered in place, the cost of registering at 4 KiB and 2 MiB pages;
#      mirror syncs in a CUDA graph replayed 1,000 times against the same loop
#      called eagerly, per iteration, and the replays whose bytes moved were
#      not the bytes stale then)
#   6. the Python package's tests (PyTorch/CuPy interop), up to 90 s, then
#      Python's cost per call on CUDA against the C call's; without the
#      package, numpy or pytest: "python: NOT CHECKED", and the result says so
#   7. with the time left, the other bench sections (--quick), the device
#      diff and the write-tracking rows of the tracking section among them
# The commit is `git rev-parse HEAD`, else $MAPPING_COMMIT (a copy without .git).
# $OUT/summary.txt is appended line by line as steps finish, so a run killed
# at any point still leaves the figures so far. At most 6 files in $OUT:
# summary.txt, build.log, ctest.log, bench.txt, bench.json, misc.log.
#
# MAPPING_GPU_REHEARSAL=1 runs the same steps on the fake driver built with
# the tests (tests/fake/fake_libcuda.c), on a machine without a GPU.
# Exit status: 0 all passed on CUDA, 1 something failed, 3 everything ran
# passed but Python was not checked (no package, numpy or pytest), 77 CUDA
# unavailable.
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
# Seconds left for a step, keeping `reserve` for what follows it (may be <= 0).
left() { echo $((deadline - $(date +%s) - ${1:-10})); }
# budget RESERVE MINIMUM [CAP]: the seconds a step may take; fails (and the
# step is skipped) when fewer than MINIMUM are left. `timeout 0` would mean
# no limit at all, so no step ever runs with a budget below 1.
budget() {
    local l
    l=$(left "$1")
    [ -n "${3:-}" ] && [ "$l" -gt "$3" ] && l=$3
    [ "$l" -ge "$2" ] && [ "$l" -ge 1 ] || return 1
    echo "$l"
}
# limit SECONDS COMMAND...: the command under `timeout -k 10` (SIGKILL 10 s
# after SIGTERM, for a step that ignores the TERM).
limit() { local t=$1; shift; timeout -k 10 "$t" "$@"; }
elapsed() { echo $(($(date +%s) - t_start)); }
misc() { printf '\n==== %s (%ds)\n' "$*" "$(elapsed)" >>"$OUT/misc.log"; }

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) || commit=""
[ -z "$commit" ] && commit=${MAPPING_COMMIT:-"unknown (no .git; set MAPPING_COMMIT)"}
say "tests/gpu/run.sh $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, deadline ${DEADLINE:-480} s, $(nproc) cores"

# ---- the driver: nvidia-smi, where libcuda is ----------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    smi=$(timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>&1 | head -4)
    say "nvidia-smi: ${smi//$'\n'/; }"
    compute_mode=$(printf '%s\n' "$smi" | head -1 | awk -F', *' '{print $NF}')
else
    say "nvidia-smi: not found"
fi
# ctest's parallelism: several test processes share the GPU only in the
# Default compute mode (Exclusive_Process admits one context at a time).
# The fake driver of a rehearsal is shared like a Default GPU.
compute_mode=${compute_mode:-}
[ "${MAPPING_GPU_REHEARSAL:-0}" = 1 ] && [ -z "$compute_mode" ] && compute_mode="Default (rehearsal)"
case $compute_mode in
Default*) ctest_jobs=8 ;;
*) ctest_jobs=1 ;;
esac
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
generator=()
if [ ! -e "$build/CMakeCache.txt" ] && ! command -v make >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja) # no make here
fi
python_args=()
if py=$(command -v python3); then
    python_args=(-DPython3_EXECUTABLE="$py")
    if "$py" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
        say "python3: $py ($("$py" -V 2>&1)), Python.h found"
    else
        say "python3: $py ($("$py" -V 2>&1)), no Python.h (the Python package is not built)"
    fi
else
    say "python3: not found"
fi
t0=$(date +%s)
if ! b_config=$(budget 180 60); then
    say "build: SKIPPED ($(left 180) s left for it; needs 60)"
    say "result: FAILED (build), $(elapsed) s"
    exit 1
fi
if limit "$b_config" cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMAPPING_BUILD_TESTS=ON \
       "${python_args[@]}" >"$OUT/build.log" 2>&1 &&
   b_build=$(budget 150 30) &&
   limit "$b_build" cmake --build "$build" -j"$jobs" >>"$OUT/build.log" 2>&1; then
    warnings=$(grep -c -i "warning:" "$OUT/build.log")
    say "build: ok in $(($(date +%s) - t0)) s, $warnings warnings ($(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt"))"
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
if b=$(budget 120 5 60); then
    limit "$b" "$build/mapping" info >>"$OUT/misc.log" 2>&1
else
    echo "skipped: too little time" >>"$OUT/misc.log"
fi
cuda_line=$(grep -E '^  cuda ' "$OUT/misc.log" | head -1)
cuda_available=$(awk '$1 == "cuda" && $2 == "available" {print 1; exit}' "$OUT/misc.log")
cuda_available=${cuda_available:-0}
card=$(awk '/^  cuda +available/{f=1;next} f && /^    \[0\]/{sub(/^    \[0\] /,""); print; exit}' "$OUT/misc.log")
driver=$(awk '/^  cuda +available/{f=1;next} f && /driver:/{sub(/^ *driver: /,""); print; exit}' "$OUT/misc.log")
if [ "$cuda_available" = 1 ]; then
    say "info: cuda available: ${card:-?}; ${driver:-?}"
    link=$(awk '/^  cuda +available/{f=1;next} f && /^ *link:/{sub(/^ *link: */,""); print; exit}' "$OUT/misc.log")
    scatter=$(printf '%s\n' "$driver" | sed -n 's/.*scatter \([a-z]*\).*/\1/p')
    say "link (measured at open): ${link:-not reported}; scatter mode: ${scatter:-not reported}"
else
    cuda_line=$(echo "${cuda_line:-cuda not listed}" | sed 's/^ *//; s/  */ /g')
    say "info: $cuda_line"
fi

# ---- 3. ctest: cuda and the examples ---------------------------------------------
labels=(-L '^(cuda|example)$' -LE '^(fakecuda|fakecuda128|cli)$')
total=$(ctest --test-dir "$build" -N "${labels[@]}" 2>/dev/null | sed -n 's/^Total Tests: *//p')
t0=$(date +%s)
if b_ctest=$(budget 150 20); then # keeps time for the example, the bench's headline figures and Python
    stop=$(date -d "@$(($(date +%s) + b_ctest))" +%H:%M:%S)
    limit "$((b_ctest + 15))" ctest --test-dir "$build" "${labels[@]}" -j"$ctest_jobs" --stop-time "$stop" \
        --output-on-failure >"$OUT/ctest.log" 2>&1
    ctest_rc=$?
else
    echo "ctest skipped: $(left 150) s left for it" >"$OUT/ctest.log"
    ctest_rc=1
fi
passed=$(grep -cE "Test +#[0-9]+: .* +Passed" "$OUT/ctest.log")
skipped=$(grep -cE "Test +#[0-9]+: .*\*\*\*Skipped" "$OUT/ctest.log")
failed=$(($(grep -cE "Test +#[0-9]+: .*\*\*\*" "$OUT/ctest.log") - skipped))
ran=$((passed + failed + skipped))
line="ctest (labels cuda, example; -j$ctest_jobs, compute mode ${compute_mode:-unknown}): $passed passed, $failed failed, $skipped skipped of ${total:-?} in $(($(date +%s) - t0)) s"
[ -n "$total" ] && [ "$ran" -lt "$total" ] && line="$line; $((total - ran)) NOT RUN (out of time)"
say "$line"
if [ "$ctest_rc" -ne 0 ] || [ "$failed" -ne 0 ] || { [ -n "$total" ] && [ "$ran" -lt "$total" ]; }; then
    failures+=("ctest")
    grep -E "Test +#[0-9]+: .*\*\*\*" "$OUT/ctest.log" | grep -v "\*\*\*Skipped" |
        head -20 | sed 's/^ */  /' | tee -a "$summary"
fi
# Why tests skipped: their output is in CTest's log of the run, not in
# ctest.log (--output-on-failure shows failures only).
if [ "$skipped" -gt 0 ]; then
    last_log=$(ls -t "$build"/Testing/Temporary/LastTest*.log 2>/dev/null | head -1)
    reasons=$(grep -h "^SKIP: " "${last_log:-/dev/null}" 2>/dev/null | sed 's/^SKIP: //' | sort | uniq -c | sort -rn)
    if [ -n "$reasons" ]; then
        printf '%s\n' "$reasons" | head -8 | sed 's/^ */  skip: /' | tee -a "$summary"
    else
        say "  skip: reasons not found (no SKIP lines in ${last_log:-the CTest log})"
    fi
fi

# ---- 4. the CUDA example -----------------------------------------------------------
misc "example_cuda_kernel"
if b=$(budget 110 10 60); then
    limit "$b" "$build/example_cuda_kernel" >>"$OUT/misc.log" 2>&1
    case $? in
    0) say "example cuda_kernel: passed" ;;
    77) say "example cuda_kernel: skipped ($(grep -m1 SKIP "$OUT/misc.log" || echo no reason))" ;;
    124 | 137) say "example cuda_kernel: TIMED OUT"; failures+=("example") ;;
    *) say "example cuda_kernel: FAILED (misc.log)"; failures+=("example") ;;
    esac
else
    say "example cuda_kernel: NOT RUN (out of time)"; failures+=("example")
fi

# ---- 5. the bench: cuda-raw ----------------------------------------------------------
if [ "$cuda_available" = 1 ]; then
    t0=$(date +%s)
    if b=$(budget 100 20); then # keeps 90 s for Python
        limit "$b" "$build/mapping" bench --backend cuda --only cuda-raw,cuda-host,cuda-graph --json >"$OUT/bench.json" \
            2>"$OUT/bench.txt"
        rc=$?
    else
        rc=skip
    fi
    case $rc in
    0) say "bench cuda-raw, cuda-host, cuda-graph: completed in $(($(date +%s) - t0)) s (speed ratio = driver time / mapping time; / page-locked = page-locked time / this time)" ;;
    skip) say "bench cuda-raw, cuda-host, cuda-graph: NOT RUN ($(left 100) s left for it)"; failures+=("bench") ;;
    124 | 137) say "bench cuda-raw, cuda-host, cuda-graph: TIMED OUT after $(($(date +%s) - t0)) s (the tables it finished are in bench.txt)"; failures+=("bench") ;;
    *) say "bench cuda-raw, cuda-host, cuda-graph: FAILED (exit $rc)"; failures+=("bench") ;;
    esac
    grep -E "^  => " "$OUT/bench.txt" 2>/dev/null | grep -v "registration in place" | sed 's/^  => /  /' |
        tee -a "$summary"
    # figures without a target are in bench.json only
    fig() { grep -o "\"$1\":[^,}]*" "$OUT/bench.json" 2>/dev/null | head -1 | sed 's/.*://'; }
    say "  registration in place (first copy less a registered one): $(fig cuda_register_s_per_gib_4k) s/GiB at 4 KiB pages, $(fig cuda_register_s_per_gib_2m) s/GiB at 2 MiB pages asked for"
    say "  mirror syncs in a CUDA graph (cuda-graph), us per iteration, graph / eager: nothing stale $(fig cuda_graph_us_per_iteration_clean) / $(fig cuda_graph_us_per_iteration_eager_clean), 16 + 16 ranges of 64 B $(fig cuda_graph_us_per_iteration_stale) / $(fig cuda_graph_us_per_iteration_eager_stale); replays moving other than the stale bytes: $(fig cuda_graph_replays_moving_other_than_stale)"
else
    say "bench: skipped, cuda is unavailable"
fi

# ---- 6. the Python package (PyTorch / CuPy interop), before the optional bench -------
# The build made the extension in $build/python/mapping (tests/python/CMakeLists.txt).
# Without the package, numpy or pytest nothing of Python is checked: the
# summary and the result say so (never PASSED).
python_unchecked=""
if [ ! -d "$build/python/mapping" ]; then
    python_unchecked="the package was not built (no Python headers or numpy for ${py:-python3})"
elif ! "${py:-python3}" -c "import numpy" >/dev/null 2>&1; then
    python_unchecked="numpy is not installed for ${py:-python3}"
elif ! "${py:-python3}" -c "import pytest" >/dev/null 2>&1; then
    python_unchecked="pytest is not installed for ${py:-python3}"
elif ! b=$(budget 5 20 90); then
    say "python: NOT RUN ($(left 5) s left)"
    failures+=("python")
else
    misc "pytest tests/python/test_gpu_interop.py tests/python/test_cuda_paths.py"
    t0=$(date +%s)
    MAPPING_BACKEND=cuda PYTHONPATH="$root/$build/python${PYTHONPATH:+:$PYTHONPATH}" \
        limit "$b" "${py:-python3}" -m pytest -q -rs -p no:cacheprovider \
        tests/python/test_gpu_interop.py tests/python/test_cuda_paths.py >>"$OUT/misc.log" 2>&1
    rc=$?
    say "python (torch/CuPy interop): $(tail -1 "$OUT/misc.log") [exit $rc, $(($(date +%s) - t0)) s]"
    [ $rc -ne 0 ] && [ $rc -ne 5 ] && failures+=("python")
    # Python on CUDA: a call's cost against the same copies made by a C loop.
    if [ "$cuda_available" = 1 ] && b=$(budget 5 10 30); then
        misc "python on cuda: per-call cost"
        line=$(PYTHONPATH="$root/$build/python${PYTHONPATH:+:$PYTHONPATH}" limit "$b" "${py:-python3}" - 2>>"$OUT/misc.log" <<'PY'
import time
import numpy as np
import mapping
from mapping import _core
dev = mapping.open("cuda")
small, buf, n = np.arange(16, dtype=np.float32), dev.allocate_gpu(64), 20000
c = _core.bench_copies(buf._ptr(), small, n, True) / n
t0 = time.perf_counter()
for _ in range(n):
    mapping.sync_to_gpu(small, buf)
p = (time.perf_counter() - t0) / n
big = mapping.allocate_cpu(64 << 20, device=dev)
big[:] = 1
gbig = dev.allocate_gpu(64 << 20)
cb = _core.bench_copies(gbig._ptr(), big, 4, True) / 4
t0 = time.perf_counter()
for _ in range(4):
    mapping.sync_to_gpu(big, gbig)
pb = (time.perf_counter() - t0) / 4
print("64 B sync_to_gpu: C %.2f us, Python %.2f us (Python - C = %+.2f us); 64 MiB: C %.2f GB/s, Python %.2f GB/s"
      % (c * 1e6, p * 1e6, (p - c) * 1e6, (64 << 20) / cb / 1e9, (64 << 20) / pb / 1e9))
dev.close()
PY
)
        say "python on cuda: ${line:-no figures (misc.log)}"
    fi
fi
[ -n "$python_unchecked" ] && say "python: NOT CHECKED: $python_unchecked"

# ---- 7. with the time left: the other bench sections ------------------------------------
if [ "$cuda_available" = 1 ]; then
    if b=$(budget 10 40); then
        t0=$(date +%s)
        echo >>"$OUT/bench.txt"
        limit "$b" "$build/mapping" bench --backend cuda --quick \
            --only bandwidth,latency,batch,mirror,mirror_mark,pipeline,staging,tracking >>"$OUT/bench.txt" 2>&1
        rc=$?
        say "bench other sections (--quick): $([ $rc = 0 ] && echo completed || echo "stopped (exit $rc)") in $(($(date +%s) - t0)) s"
        awk 'f && /^  => /; /^Scattered 64-byte copies \(stride/{f=1}' "$OUT/bench.txt" | sed 's/^  => /  /' |
            head -8 | tee -a "$summary"
        grep -E '^  => (device diff|(H2D|D2H) stream copy, pageable / page-locked)' "$OUT/bench.txt" | sed 's/^  => /  /' |
            tee -a "$summary"
        # the write-tracking rows (tracking section)
        grep -E '^  => .*(tracked|marked sync|streaming)' "$OUT/bench.txt" | sed 's/^  => /  /' | head -10 |
            tee -a "$summary"
    else
        say "bench other sections: skipped ($(left 10) s left)"
    fi
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
if [ -n "$python_unchecked" ]; then
    say "result: PYTHON NOT CHECKED ($python_unchecked); the rest passed, $(elapsed) s"
    exit 3
fi
say "result: PASSED, $(elapsed) s"
exit 0
