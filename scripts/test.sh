#!/usr/bin/env bash
# Builds and runs the whole test suite: every back end available here (the
# others are skipped, with the reason), the examples, the CLI, an install,
# and the Python tests.
#
#   scripts/test.sh [--no-venv] [CMAKE_ARGS...]
#
# Prints one progress line (in place on a terminal, every 20 % otherwise) and
# a summary: the skips grouped by reason, the failures by name, then
# "N passed, N failed, N skipped". Everything cmake, the compiler and CTest
# print goes to $BUILD_DIR/test.log, which it names; where stdout is not a
# terminal (CI), the output of the first failed tests follows the summary.
# Exit status: 0 when every test passed or was skipped, else non-zero.
#
# The Python tests need a Python 3 with numpy, pytest and its C headers
# (scripts/find_python.sh picks it; PYTHON=/path/to/python3 chooses one).
# When none has numpy and pytest, a venv is made in $BUILD_DIR/venv and they
# are installed into it from PyPI; --no-venv (or MAPPING_TEST_NO_VENV=1)
# skips the Python tests instead. Extra arguments go to cmake; BUILD_DIR
# picks the build folder (build); MAPPING_TEST_CTEST_ARGS adds arguments to
# ctest (e.g. "-L host" or "-R lint").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
no_venv=${MAPPING_TEST_NO_VENV:-0}
jobs=$(nproc)
cmake_args=()
given_python=0
for a in "$@"; do
    case "$a" in
    --no-venv) no_venv=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -DPython3_EXECUTABLE=*) export PYTHON=${a#-DPython3_EXECUTABLE=}; given_python=1; cmake_args+=("$a") ;;
    *) cmake_args+=("$a") ;;
    esac
done
[ "$no_venv" = 1 ] || no_venv=0
mkdir -p "$build"
log=$build/test.log
: >"$log"
[ -t 1 ] && tty=1 || tty=0
python_note=""

say() { echo "scripts/test.sh: $*"; }

# ---- Python ----

# A Python 3 that has its C headers (a venv made from it builds the extension).
base_python() {
    local probe='import os, sys, sysconfig
sys.exit(0 if sys.version_info[0] == 3 and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)'
    for c in python3 /usr/bin/python3; do
        command -v "$c" >/dev/null 2>&1 && "$c" -c "$probe" 2>/dev/null && { command -v "$c"; return 0; }
    done
    return 1
}

# Makes (or reuses) $build/venv with numpy and pytest; prints its python.
venv_python() {
    local venv=$build/venv base
    if [ -x "$venv/bin/python" ] && PYTHON=$venv/bin/python scripts/find_python.sh 2>/dev/null; then
        return 0
    fi
    base=$(base_python) || { echo "no Python 3 with its C headers to make a venv from (Debian: apt-get install python3-dev)"; return 1; }
    say "no Python here has numpy and pytest: making a venv ($venv, from $base) and installing them from PyPI" \
        "(--no-venv or MAPPING_TEST_NO_VENV=1: skip the Python tests instead)" >&2
    "$base" -m venv "$venv" >>"$log" 2>&1 ||
        { echo "$base -m venv failed (Debian: apt-get install python3-venv); see $log"; return 1; }
    "$venv/bin/python" -m pip install -q numpy pytest >>"$log" 2>&1 ||
        { echo "pip install numpy pytest into $venv failed (no network?); see $log"; return 1; }
    PYTHON=$venv/bin/python scripts/find_python.sh 2>>"$log" || { echo "the venv $venv lacks what it needs; see $log"; return 1; }
}

choose_python() {
    local why py
    why=$(mktemp)
    if py=$(scripts/find_python.sh 2>"$why"); then
        say "the Python tests run with $py"
    elif [ -n "${PYTHON:-}" ]; then
        say "PYTHON=$PYTHON cannot run the Python tests:" >&2
        cat "$why" >&2
        rm -f "$why"
        exit 2
    elif [ "$no_venv" = 1 ]; then
        python_note="the Python tests (python.pytest) are SKIPPED (--no-venv): $(head -1 "$why")"
        cat "$why" >>"$log"
    elif py=$(venv_python); then
        say "the Python tests run with $py"
    else
        python_note="the Python tests (python.pytest) are SKIPPED: $py"
    fi
    rm -f "$why"
    [ -z "$python_note" ] || say "$python_note" >&2
    if [ -z "$python_note" ] && [ "$given_python" = 0 ]; then
        cmake_args=("-DPython3_EXECUTABLE=$py" "${cmake_args[@]}")
    fi
}

# ---- build ----

# Copies its input to the log and shows "[ 42%]" / "[12/80]" progress (in
# place on a terminal, every 25 % otherwise).
build_progress() {
    awk -v logf="$log" -v tty="$tty" '
    { print >> logf }
    /^\[ *[0-9]+%\]/ { p = $0; sub(/^\[ */, "", p); sub(/%.*/, "", p); p += 0 }
    /^\[[0-9]+\/[0-9]+\]/ { split(substr($0, 2), a, /[\/\]]/); p = int(100 * a[1] / a[2]) }
    /warning:/ { warnings++ }
    p != "" && p != shown && tty { printf "\r\033[Kscripts/test.sh: building: %d%%", p; fflush(); shown = p }
    p != "" && !tty && int(p / 25) > step { step = int(p / 25); print "scripts/test.sh: building: " p "%"; fflush() }
    END { if (tty && shown != "") printf "\r\033[K"; if (warnings) printf "scripts/test.sh: the build printed %d warning line(s): see %s\n", warnings, logf }'
}

build_all() {
    say "configuring and building $build (${jobs} jobs); everything it prints goes to $log"
    if ! cmake -S . -B "$build" "${cmake_args[@]}" >>"$log" 2>&1; then
        tail -n 25 "$log"
        say "cmake failed; the whole output: $log"
        exit 1
    fi
    local rc
    set +e
    cmake --build "$build" -j"$jobs" 2>&1 | build_progress
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" != 0 ]; then
        grep -n -m 20 -E 'error|Error' "$log" || tail -n 25 "$log"
        say "the build failed; the whole output: $log"
        exit 1
    fi
}

# ---- tests ----

# Reads CTest's output: copies it to the log, shows progress, and writes the
# failed tests (name, status) and the skipped ones to $build/test-failed.txt
# and $build/test-skipped.txt.
test_progress() {
    awk -v logf="$log" -v tty="$tty" -v failed_file="$build/test-failed.txt" \
        -v skipped_file="$build/test-skipped.txt" -v total="$1" '
    BEGIN { printf "" > failed_file; printf "" > skipped_file }
    { print >> logf }
    /^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
        line = $0; sub(/^ */, "", line)
        n = line; sub(/\/.*/, "", n); done = n + 0
        name = line; sub(/^[^:]*: +/, "", name); status = name; sub(/ .*/, "", name)
        sub(/^[^ ]+ [ .]*/, "", status); sub(/ +[0-9.]+ sec *$/, "", status); sub(/^\*\*\*/, "", status)
        if (status ~ /^Passed/) passed++
        else if (status ~ /^(Skipped|Not Run)/) { skipped++; print name "\t" status >> skipped_file }
        else { failed++; print name "\t" status >> failed_file }
        line = sprintf("[%d/%d] %d failed, %d skipped", done, total, failed, skipped)
        if (tty) { printf "\r\033[K%s", line; fflush() }
        else if (total > 0 && int(done * 5 / total) > shown) { shown = int(done * 5 / total); print line; fflush() }
    }
    END { if (tty) printf "\r\033[K" }'
}

run_tests() {
    local total
    local -a extra
    read -r -a extra <<<"${MAPPING_TEST_CTEST_ARGS:-}"
    total=$(ctest --test-dir "$build" -N "${extra[@]}" 2>>"$log" | awk '/^Total Tests:/ { print $3 }')
    say "running ${total:-the} tests (${jobs} at a time)"
    start=$(date +%s)
    set +e
    ctest --test-dir "$build" --output-on-failure -j"$jobs" "${extra[@]}" 2>&1 | test_progress "${total:-0}"
    status=${PIPESTATUS[0]}
    set -e
}

# ---- the summary ----

# "count<TAB>reason" for the skipped tests, the most common first: each
# test's first "SKIP: " line in CTest's LastTest.log, shortened so that the
# same cause on different back ends or tests groups together. Rewrites
# $build/test-skipped.txt as "name<TAB>reason", the reason in full.
skip_reasons() {
    awk -F'\t' '
    FNR == NR { skipped[$1] = $2; next }
    /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[^:]*: /, "", name); next }
    /^SKIP: / && name in skipped && !(name in why) { why[name] = substr($0, 7) }
    function short(r,   be) {
        if (match(r, /back end [a-z0-9]+ (is not available here|is unavailable|is absent)/)) {
            be = substr(r, RSTART + 9); sub(/ .*/, "", be)
            if (match(r, /is unavailable: /)) r = substr(r, RSTART + RLENGTH)
            else r = "absent here"
            sub(/: .*/, "", r)
            r = "back end " be ": " r
        }
        sub(/ \(.*/, "", r)
        return length(r) > 90 ? substr(r, 1, 87) "..." : r
    }
    END {
        for (n in skipped) {
            full = n in why ? why[n] : (skipped[n] ~ /Disabled/ ? "disabled" : "no reason printed")
            count[n in why ? short(full) : full]++
            print n "\t" full > FILENAME_SKIPPED
        }
        for (r in count) print count[r] "\t" r
    }' FILENAME_SKIPPED="$build/test-skipped.txt" "$build/test-skipped.txt" "$build/Testing/Temporary/LastTest.log" |
        sort -t$'\t' -k1,1nr -k2
}

print_skips() {
    local shown=0 rest=0 groups=0 count reason
    while IFS=$'\t' read -r count reason; do
        if [ "$shown" -lt 12 ]; then
            printf '  %5d skipped: %s\n' "$count" "$reason"
            shown=$((shown + 1))
        else
            rest=$((rest + count))
            groups=$((groups + 1))
        fi
    done < <(skip_reasons)
    [ "$rest" = 0 ] || printf '  %5d skipped for %d other reasons\n' "$rest" "$groups"
    echo "  (every skipped test, with its reason: $build/test-skipped.txt)"
}

print_failures() {
    local n
    n=$(wc -l <"$build/test-failed.txt")
    [ "$n" -gt 0 ] || return 0
    echo "failed (each one's output is in $log; or: ctest --test-dir $build -R NAME --output-on-failure):"
    head -n 15 "$build/test-failed.txt" | awk -F'\t' '{ printf "  %s (%s)\n", $1, $2 }'
    [ "$n" -le 15 ] || echo "  ... and $((n - 15)) more: $build/test-failed.txt"
}

# CI (stdout not a terminal): the output of the first failed tests.
print_failed_output() {
    [ "$tty" = 0 ] && [ -s "$build/test-failed.txt" ] || return 0
    head -n 5 "$build/test-failed.txt" | cut -f1 | while read -r name; do
        echo
        echo "---- output of $name (the last 60 lines) ----"
        awk -v want="$name" '
        /^[0-9]+\/[0-9]+ Test: / { t = $0; sub(/^[^:]*: /, "", t); inside = 0 }
        t == want && /^<end of output>/ { inside = 0 }
        t == want && inside { print }
        t == want && /^Output:/ { inside = 1; getline }' "$build/Testing/Temporary/LastTest.log" | tail -n 60
    done
}

summary() {
    local passed failed skipped
    failed=$(wc -l <"$build/test-failed.txt")
    skipped=$(wc -l <"$build/test-skipped.txt")
    passed=$(awk '/tests passed, [0-9]+ tests failed out of/ { total = $NF } END { print total + 0 }' "$log")
    passed=$((passed - failed - skipped))
    echo
    if [ "$skipped" -gt 0 ]; then
        echo "skipped, by reason:"
        print_skips
    fi
    print_failures
    [ -z "$python_note" ] || say "$python_note"
    echo "$passed passed, $failed failed, $skipped skipped in $(($(date +%s) - start)) s (the whole output: $log)"
    print_failed_output
}

choose_python
build_all
run_tests
summary
exit "$status"
