#!/usr/bin/env bash
# Checks scripts/find_python.sh (which scripts/test.sh uses) with fake
# interpreters: it picks the first Python that has numpy, pytest and headers
# even when python3 on PATH lacks them; it skips an interpreter seen under
# another name; $PYTHON is the only one tried; and when none fits it exits 1
# naming each one it tried, what each lacks (or what is really wrong with one
# that does not run: missing, a pyenv shim of a version not installed, a
# crash), and PYTHON= / -DPython3_EXECUTABLE.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A fake interpreter answers find_python.sh's probe with fixed words:
# sys.executable, version, what it lacks.
fake() { # fake DIR NAME EXECUTABLE MISSING
    mkdir -p "$1"
    printf '#!/bin/sh\nprintf "%%s\\t3.11\\t%%s\\n" "%s" "%s"\n' "$3" "$4" >"$1/$2"
    chmod +x "$1/$2"
}
fake "$tmp/a" python3 /opt/plain/bin/python3 "numpy pytest"
fake "$tmp/a" python3.11 /opt/plain/bin/python3 "numpy pytest"   # python3 again, by another name
fake "$tmp/a" python3.12 /opt/full/bin/python3.12 ""
fake "$tmp/b" python3 /opt/nohdr/bin/python3 "headers"

# Only the fakes: PATH holds nothing else, and no /usr/bin/python3 fallback.
run() {
    env -i PATH="$1" MAPPING_PYTHON_FALLBACK= ${2:+PYTHON="$2"} "$BASH" "$here/find_python.sh" >"$tmp/out" 2>"$tmp/err"
}

run "$tmp/a" "" || fail "python3.12 has everything, yet: $(cat "$tmp/err")"
[ "$(cat "$tmp/out")" = /opt/full/bin/python3.12 ] || fail "picked $(cat "$tmp/out"), not /opt/full/bin/python3.12"

run "$tmp/b" "" && fail "no fake interpreter has headers, yet it picked $(cat "$tmp/out")"
grep -q "$tmp/b/python3 (Python 3.11, /opt/nohdr/bin/python3): lacks headers" "$tmp/err" ||
    fail "the message does not name the interpreter tried and what it lacks: $(cat "$tmp/err")"
grep -q "PYTHON=/path/to/python3" "$tmp/err" && grep -q -- "-DPython3_EXECUTABLE=" "$tmp/err" ||
    fail "the message does not say how to point at another interpreter: $(cat "$tmp/err")"

run "$tmp/a" "$tmp/a/python3" && fail "PYTHON names one without numpy, yet it picked $(cat "$tmp/out")"
grep -q "lacks numpy, pytest" "$tmp/err" || fail "PYTHON's lacks are not named: $(cat "$tmp/err")"
grep -q "python3.12" "$tmp/err" && fail "with PYTHON set, others were tried: $(cat "$tmp/err")"
run "$tmp/b" "$tmp/a/python3.12" || fail "PYTHON=python3.12 has everything, yet: $(cat "$tmp/err")"

run "$tmp/a" "$tmp/none" && fail "PYTHON names no file, yet it picked $(cat "$tmp/out")"
grep -q "$tmp/none: does not exist" "$tmp/err" || fail "a missing PYTHON is not named: $(cat "$tmp/err")"

# A pyenv shim of a version pyenv does not have: it says so, not "not Python 3".
mkdir -p "$tmp/shims"
printf '#!/bin/sh\necho "pyenv: python3.8: command not found" >&2\nexit 127\n' >"$tmp/shims/python3.8"
chmod +x "$tmp/shims/python3.8"
run "$tmp/a" "$tmp/shims/python3.8" && fail "a broken shim was picked"
grep -q "python3.8: a pyenv shim for a Python that pyenv does not provide here (pyenv: python3.8: command not found" \
    "$tmp/err" || fail "a broken pyenv shim is not named as such: $(cat "$tmp/err")"
printf '#!/bin/sh\necho "Segmentation fault" >&2\nexit 139\n' >"$tmp/shims/python3"
chmod +x "$tmp/shims/python3"
run "$tmp/a" "$tmp/shims/python3" && fail "a crashing interpreter was picked"
grep -q "python3: fails to start (exit 139: Segmentation fault)" "$tmp/err" ||
    fail "a crashing interpreter is not named as such: $(cat "$tmp/err")"
echo "find_python.sh: picks a Python with numpy, pytest and headers; names each one tried, what is wrong with it, and how to choose"
