#!/bin/sh
# Instructions per 64-byte copy on the host back end, counted by callgrind:
# the cost the library adds per call, without the noise of timing. Usage:
#   scripts/callgrind_copy.sh BUILD_DIR [BUILD_DIR...]
# For each build (a CMake build folder holding libmapping.so), prints the
# instructions per blocking copy (mapping_sync_to_gpu_range, stream NULL) and
# per asynchronous copy (on a stream, synchronized every 100 copies), as the
# difference between runs of 2,000 and 1,000 copies divided by 1,000 (setup
# and warm-up cancel out). Compare two builds, e.g. one from before a change:
#   git worktree add /tmp/before <commit> && cmake -S /tmp/before -B /tmp/before/build && \
#   cmake --build /tmp/before/build --target mapping && scripts/callgrind_copy.sh /tmp/before/build build
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed (apt-get install valgrind)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/driver.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include "mapping.h"
__attribute__((noinline)) void run_copies(mapping_stream *s, const void *src, mapping_buffer *buf, int n)
{
    for (int i = 0; i < n; i++) {
        if (mapping_sync_to_gpu_range(s, src, buf, 0, 64) != MAPPING_OK)
            abort();
        if (s && i % 100 == 99)
            mapping_stream_synchronize(s);
    }
    if (s)
        mapping_stream_synchronize(s);
}
int main(int argc, char **argv)
{
    int n = atoi(argv[1]), async = atoi(argv[2]);
    mapping_device_desc desc = {.backend = "host"};
    mapping_device *dev;
    mapping_buffer *buf;
    mapping_stream *s = NULL;
    static char src[64];
    if (mapping_open(&desc, &dev) || mapping_allocate_gpu(dev, 64, &buf) || (async && mapping_stream_create(dev, &s)))
        return 1;
    run_copies(s, src, buf, 10); /* warm-up outside the counted calls is not needed: differences cancel it */
    run_copies(s, src, buf, n);
    mapping_stream_destroy(s);
    mapping_free_gpu(buf);
    mapping_close(dev);
    return 0;
}
C
count() { # build n async -> instructions inside run_copies (inclusive)
    out="$work/cg.$2.$3"
    LD_LIBRARY_PATH="$1" valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=run_copies \
        "$work/driver.$4" "$2" "$3" >/dev/null 2>&1
    callgrind_annotate --inclusive=yes "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}'
}
i=0
for build in "$@"; do
    i=$((i + 1))
    build=$(cd "$build" && pwd)
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    cc -O2 -I"$src/include" "$work/driver.c" -L"$build" -lmapping -o "$work/driver.$i"
    for async in 0 1; do
        a=$(count "$build" 1000 $async $i)
        b=$(count "$build" 2000 $async $i)
        kind=$([ $async = 1 ] && echo "async (stream)" || echo "blocking")
        echo "$build ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')): $kind 64 B copy: $(( (b - a) / 1000 )) instructions"
    done
done
