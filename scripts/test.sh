#!/usr/bin/env bash
# Builds and runs the whole test suite: every back end available here (the
# others print SKIP with the reason), the examples, the CLI, an install, and
# the Python tests with a Python that has numpy and pytest
# (scripts/find_python.sh picks it; PYTHON=/path/to/python3 chooses one).
# Extra arguments go to cmake; BUILD_DIR picks the build folder (build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
python_note=""
given=""
for a in "$@"; do
    case "$a" in -DPython3_EXECUTABLE=*) given=${a#-DPython3_EXECUTABLE=} ;; esac
done
if [ -n "$given" ]; then
    export PYTHON=$given
fi
why=$(mktemp)
trap 'rm -f "$why"' EXIT
if py=$(scripts/find_python.sh 2>"$why"); then
    echo "scripts/test.sh: the Python tests run with $py"
    [ -n "$given" ] || set -- "-DPython3_EXECUTABLE=$py" "$@"
elif [ -n "${PYTHON:-}" ]; then
    echo "scripts/test.sh: PYTHON=$PYTHON cannot run the Python tests:" >&2
    cat "$why" >&2
    exit 2
else
    python_note="scripts/test.sh: the Python tests (python.pytest) are SKIPPED: $(cat "$why")"
    echo "$python_note" >&2
fi
cmake -S . -B "$build" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" || status=$?
if [ -n "$python_note" ]; then
    echo >&2
    echo "$python_note" >&2
fi
exit $status
