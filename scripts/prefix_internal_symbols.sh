#!/usr/bin/env bash
# Gives every global symbol of the library that lacks the mapping_ prefix the
# internal prefix mapping__ (opencl_read -> mapping__opencl_read), in src/ and
# tests/, so that a program linked with the static archive may define names
# such as host_submit or opencl_read itself.
#
# The names come from the static archive of a build with every back end
# (nm: defined global symbols, functions and variables alike); each is
# replaced as a whole word (C identifiers: letters, digits, _) wherever it
# appears in src/ and tests/. Run from anywhere; rebuild afterwards.
#   scripts/prefix_internal_symbols.sh [BUILD_DIR]     (default: build)
# Prints the names it renamed; exits 0 when there was nothing to do.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
archive="$build/libmapping.a"
if [ ! -f "$archive" ]; then
  echo "prefix_internal_symbols: $archive not found: build first (cmake --build $build)" >&2
  exit 1
fi
symbols=$(nm -g --defined-only "$archive")
# Every back end must be in the archive, or its names would be missed.
for backend in host opencl cuda; do
  if ! grep -q " mapping_backend_$backend\$" <<<"$symbols"; then
    echo "prefix_internal_symbols: $archive lacks the $backend back end: build with every back end" >&2
    exit 1
  fi
done
mapfile -t names < <(awk 'NF == 3 && $2 ~ /^[A-Z]$/ {print $3}' <<<"$symbols" |
                     grep -vE '^(mapping_|__(odr_asan|asan|ubsan|tsan))' | sort -u)
if [ ${#names[@]} -eq 0 ]; then
  echo "prefix_internal_symbols: every global symbol already starts with mapping_"
  exit 0
fi
pattern=$(IFS='|'; echo "${names[*]}")
# tests/install/static_clash.c defines the old names on purpose (a user's
# program that must link): it keeps them.
mapfile -t files < <(grep -rlwE "$pattern" src tests --include='*.c' --include='*.h' --include='*.cu' |
                     grep -vxF tests/install/static_clash.c || true)
# \b around the alternation: a whole identifier only (no match inside
# cuda_check_x or my_cuda_check, since _ and letters are word characters).
sed -i -E "s/\\b($pattern)\\b/mapping__\\1/g" "${files[@]}"
echo "prefix_internal_symbols: ${#names[@]} names renamed in ${#files[@]} files:"
printf '  %s\n' "${names[@]}"
