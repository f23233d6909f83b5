#!/usr/bin/env bash
# Prints the path of a Python 3 that can run the Python tests (numpy, pytest
# and its C headers, which the extension is built with), for
# -DPython3_EXECUTABLE. $PYTHON, when set, is the only one tried; else
# python3 on PATH, then python3.N on PATH, then /usr/bin/python3. When none
# fits: exit 1, and stderr says which interpreters were tried, what each
# lacks, and how to point at another.
set -uo pipefail
probe='import os, sys, sysconfig
missing = []
for m in ("numpy", "pytest"):
    try:
        __import__(m)
    except Exception:
        missing.append(m)
inc = sysconfig.get_paths().get("include") or ""
if not os.path.exists(os.path.join(inc, "Python.h")):
    missing.append("headers")
print("%s\t%d.%d\t%s" % (sys.executable, sys.version_info[0], sys.version_info[1], " ".join(missing)))'

if [ -n "${PYTHON:-}" ]; then
    candidates=("$PYTHON")
else
    candidates=()
    command -v python3 >/dev/null 2>&1 && candidates+=("$(command -v python3)")
    for v in 14 13 12 11 10 9 8; do
        command -v "python3.$v" >/dev/null 2>&1 && candidates+=("$(command -v "python3.$v")")
    done
    # The system's own last (its apt packages), unless the test empties it.
    fallback=${MAPPING_PYTHON_FALLBACK-/usr/bin/python3}
    [ -n "$fallback" ] && [ -x "$fallback" ] && candidates+=("$fallback")
fi

# Why a candidate gave no answer to the probe: what is really wrong with it.
# A pyenv shim of a version that is not installed or not selected exits 127
# with "pyenv: python3.8: command not found". (Bash builtins only: the check
# runs this with nothing else on PATH.)
why_not() { # PY EXIT_STATUS OUTPUT
    local first="" l
    while IFS= read -r l; do
        [ -n "${l//[[:space:]]/}" ] && { first=${l:0:120}; break; }
    done <<<"$3"
    if [ ! -e "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
        echo "does not exist"
    elif [ "$2" = 0 ]; then
        echo "runs, but not as Python 3 (no answer to the probe)"
    elif [[ "$first" == pyenv:* ]]; then
        echo "a pyenv shim for a Python that pyenv does not provide here ($first; 'pyenv versions' lists those installed, 'pyenv global' selects them)"
    else
        echo "fails to start (exit $2${first:+: $first})"
    fi
}

tried=""
seen=" "
for py in "${candidates[@]}"; do
    out=$("$py" -c "$probe" 2>&1)
    rc=$?
    line=""
    while IFS= read -r l; do # the probe's answer: the line with two tabs (warnings aside)
        [[ "$l" == *$'\t'*$'\t'* ]] && line=$l
    done <<<"$out"
    if [ "$rc" != 0 ] || [ -z "$line" ]; then
        tried+="  $py: $(why_not "$py" "$rc" "$out")"$'\n'
        continue
    fi
    IFS=$'\t' read -r exe version missing <<<"$line"
    if [ "${version%%.*}" != 3 ]; then
        tried+="  $py ($exe): is Python $version, not Python 3"$'\n'
        continue
    fi
    case "$seen" in *" $exe "*) continue ;; esac # the same interpreter by another name
    seen+="$exe "
    if [ -z "$missing" ]; then
        echo "$exe"
        exit 0
    fi
    tried+="  $py (Python $version, $exe): lacks ${missing// /, }"$'\n'
done

{
    if [ ${#candidates[@]} -eq 0 ]; then
        echo "no Python 3 found (python3 is not on PATH)"
    else
        echo "no Python 3 here has numpy, pytest and its C headers; tried:"
        printf '%s' "$tried"
    fi
    echo "Install what is missing (Debian: apt-get install python3-dev python3-numpy python3-pytest;"
    echo "or: python3 -m pip install numpy pytest), or point at another interpreter:"
    echo "  PYTHON=/path/to/python3 scripts/test.sh     (CMake: -DPython3_EXECUTABLE=/path/to/python3)"
} >&2
exit 1
