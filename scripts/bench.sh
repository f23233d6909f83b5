#!/usr/bin/env bash
# Builds (Release, in build-release) and runs `mapping bench` on the default
# back end. Arguments go to `mapping bench` (e.g. --quick, --backend opencl,
# --explain, --json). It says what it does: the build's progress on one line
# (in place on a terminal, every 25 % otherwise), its whole output in
# build-release/build.log, then the benchmark, whose sections report their
# own progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-release
log=$build/build.log
[ -t 1 ] && tty=1 || tty=0
say() { echo "scripts/bench.sh: $*" >&2; }

mkdir -p "$build"
: >"$log"
if [ -f "$build/CMakeCache.txt" ]; then
    say "building the mapping command (Release) in $build; the build's output goes to $log"
else
    say "configuring and building the mapping command (Release) in $build, the first time (about a minute);" \
        "the build's output goes to $log"
fi
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMAPPING_BUILD_TESTS=OFF >>"$log" 2>&1; then
    tail -n 25 "$log" >&2
    say "cmake failed; the whole output: $log"
    exit 1
fi
set +e
cmake --build "$build" -j"$(nproc)" --target mapping_cli 2>&1 | awk -v logf="$log" -v tty="$tty" '
    { print >> logf }
    /^\[ *[0-9]+%\]/ { p = $0; sub(/^\[ */, "", p); sub(/%.*/, "", p); p += 0 }
    /^\[[0-9]+\/[0-9]+\]/ { split(substr($0, 2), a, /[\/\]]/); p = int(100 * a[1] / a[2]) }
    p != "" && tty && p != shown { printf "\r\033[Kscripts/bench.sh: building: %d%%", p > "/dev/stderr"; shown = p }
    p != "" && !tty && int(p / 25) > step { step = int(p / 25); printf "scripts/bench.sh: building: %d%%\n", p > "/dev/stderr" }
    END { if (tty && shown != "") printf "\r\033[K" > "/dev/stderr" }'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then
    grep -n -m 20 -E 'error|Error' "$log" >&2 || tail -n 25 "$log" >&2
    say "the build failed; the whole output: $log"
    exit 1
fi
say "built; running $build/mapping bench $* (each section says when it is done)"
exec "./$build/mapping" bench "$@"
