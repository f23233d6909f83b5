/*
 * Write tracking with mprotect on memory backed by transparent huge pages:
 * a streaming write opens runs that end on huge-page boundaries, so past
 * the first few pages it splits no huge page, and protecting them again at
 * the sync keeps them whole (track/write_track_mprotect.c). Run with
 * MAPPING_TRACK=mprotect (tests/CMakeLists.txt); skipped where the mirror
 * gets no huge pages.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "testing/test_hooks.h"
#include "harness.h"

/* Huge-page bytes of the anonymous mappings inside [lo, hi) (whole VMAs
 * only: a tracked region's VMAs lie inside it). */
static size_t huge_bytes_in(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    size_t total = 0;
    bool inside = false;
    while (fgets(line, sizeof line, f)) {
        uintptr_t a, b;
        size_t kb;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = a >= lo && b <= hi;
        else if (inside && sscanf(line, "AnonHugePages: %zu kB", &kb) == 1)
            total += kb << 10;
    }
    fclose(f);
    return total;
}

TEST(tracked_streaming_write_keeps_the_huge_pages_whole_under_mprotect)
{
    if (mapping_write_tracking(NULL) != MAPPING_TRACK_MPROTECT)
        test_skip("this test is for MAPPING_TRACK=mprotect, and this process tracks with %s",
                  mapping_write_tracking_description());
    mapping_device *dev = test_device();
    size_t size = (size_t)128 << 20;
    mapping_mirror *m = NULL;
    CHECK_OK(mapping_mirror_create(dev, size, MAPPING_MIRROR_TRACK_WRITES, &m));
    unsigned char *cpu = mapping_mirror_cpu(m);
    uintptr_t lo = (uintptr_t)cpu, hi = lo + size;
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    size_t before = huge_bytes_in(lo, hi);
    if (before < size / 2) {
        mapping_mirror_destroy(m);
        test_skip("the mirror got %zu MiB of transparent huge pages of %zu (THP off or madvise refused)",
                  before >> 20, size >> 20);
    }
    /* From an offset that is not on a huge-page boundary (runs that only
     * doubled from there would end off every boundary). */
    size_t from = 5 * 4096 + 100;
    for (int r = 0; r < 3; r++) {
        memset(cpu + from, r + 1, size - from);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    }
    size_t after = huge_bytes_in(lo, hi);
    fprintf(stderr, "huge pages: %zu MiB before, %zu MiB after\n", before >> 20, after >> 20);
    /* The ramp (1, 1, 2, 4, ... pages) splits at most the huge pages it
     * crosses before a run reaches 2 MiB: two. */
    if (after + ((size_t)4 << 20) < before)
        test_fail(__FILE__, __LINE__, "huge pages: %zu MiB before three streaming writes, %zu MiB after", before >> 20,
                  after >> 20);
    unsigned char *got = malloc(size);
    CHECK(got != NULL);
    CHECK_OK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), mapping_mirror_gpu_offset(m), got, size));
    for (size_t i = from; i < size; i += 4093)
        CHECK(got[i] == 3);
    free(got);
    mapping_mirror_destroy(m);
}
