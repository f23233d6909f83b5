#!/bin/sh
# Instructions per call on the fast paths of a mirror without features (no
# tracking, no diff), on the host back end, counted by callgrind: a clean
# sync, a 1-byte mark plus its sync (the log's fast path), and a 1-byte mark
# plus a sync of a view. Usage:
#   scripts/callgrind_mirror.sh BUILD_DIR [BUILD_DIR...]
# For each build (a CMake build folder holding libmapping.so), prints the
# instructions per iteration as the difference between runs of 2,000 and
# 1,000 iterations divided by 1,000 (setup and warm-up cancel out). Compare
# two builds, e.g. one from before a change (see callgrind_copy.sh).
set -eu
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed (apt-get install valgrind)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/driver.c" <<'C'
#include <stdlib.h>
#include "mapping.h"
__attribute__((noinline)) void run_loop(mapping_mirror *m, mapping_mirror *view, int kind, int n)
{
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (int i = 0; i < n; i++) {
        mapping_status st = MAPPING_OK;
        if (kind == 0) {
            st = mapping_mirror_sync_to_gpu(NULL, m);
        } else {
            cpu[(i * 4099) % 65536] = (unsigned char)i;
            st = mapping_mirror_mark_cpu_modified(m, (size_t)(i * 4099) % 65536, 1);
            if (st == MAPPING_OK)
                st = mapping_mirror_sync_to_gpu(NULL, kind == 1 ? m : view);
        }
        if (st != MAPPING_OK)
            abort();
    }
}
int main(int argc, char **argv)
{
    int n = atoi(argv[1]), kind = atoi(argv[2]);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_mirror *m, *view;
    if (mapping_open(&desc, &dev) || mapping_mirror_create(dev, 65536, 0, &m) || mapping_mirror_view(m, 0, 65536, &view) ||
        mapping_mirror_sync_to_gpu(NULL, m))
        return 1;
    run_loop(m, view, kind, 10);
    run_loop(m, view, kind, n);
    mapping_mirror_destroy(view);
    mapping_mirror_destroy(m);
    mapping_close(dev);
    return 0;
}
C
count() { # build n kind i -> instructions inside run_loop (inclusive)
    out="$work/cg.$2.$3"
    LD_LIBRARY_PATH="$1" valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=run_loop \
        "$work/driver.$4" "$2" "$3" >/dev/null 2>&1
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}'
}
i=0
for build in "$@"; do
    i=$((i + 1))
    build=$(cd "$build" && pwd)
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    cc -O2 -I"$src/include" "$work/driver.c" -L"$build" -lmapping -o "$work/driver.$i"
    for kind in 0 1 2; do
        a=$(count "$build" 1000 $kind $i)
        b=$(count "$build" 2000 $kind $i)
        what=$(case $kind in 0) echo "clean sync";; 1) echo "mark 1 B + sync";; *) echo "mark 1 B + sync of a view";; esac)
        echo "$build ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')): $what: $(( (b - a) / 1000 )) instructions"
    done
done
