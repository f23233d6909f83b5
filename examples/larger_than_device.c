/*
 * Mirrors larger than the device: 12 mirrors of 4 MiB under a device memory
 * budget of 16 MiB (a working set 3x the budget). Each pass a "kernel"
 * visits every mirror (acquire_gpu, device work, release_gpu) and modifies a
 * third of them; the library evicts the least recently used device sides to
 * make room, writing back exactly the bytes the device modified, and makes
 * a device side again when the kernel visits it. The program never frees or
 * copies anything itself, and reads its results on the CPU at the end.
 * Runs on the default back end ($MAPPING_BACKEND to choose).
 */
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "mapping.h"

enum { MIRRORS = 12, PASSES = 3 };
#define MIRROR_BYTES ((size_t)4 << 20)

/* The device work on mirror i in pass p: on a third of the mirrors, set
 * the first 64 KiB to the pass number (a fill, so it runs on any back end). */
static mapping_status kernel(mapping_mirror *m, int p, int i)
{
    mapping_buffer *buf;
    int writes = (i + p) % 3 == 0;
    mapping_status st = mapping_mirror_acquire_gpu(NULL, m, MAPPING_READ, &buf); /* held until release */
    if (st == MAPPING_OK && writes)
        st = mapping_fill_gpu(NULL, buf, mapping_mirror_gpu_offset(m), 65536, (unsigned char)(p + 1));
    if (st == MAPPING_OK && writes)
        st = mapping_mirror_mark_gpu_modified(m, 0, 65536); /* exactly what it wrote */
    mapping_status released = mapping_mirror_release_gpu(NULL, m);
    return st ? st : released;
}

int main(void)
{
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    /* Or: mapping_device_desc .memory_budget at open, or $MAPPING_MEMORY_BUDGET. */
    CHECK(mapping_device_set_memory_budget(dev, 4 * MIRROR_BYTES));
    mapping_mirror *m[MIRRORS];
    for (int i = 0; i < MIRRORS; i++) {
        CHECK(mapping_mirror_create(dev, MIRROR_BYTES, 0, &m[i])); /* evicts older ones as needed */
        unsigned char *cpu = mapping_mirror_cpu(m[i]);
        for (size_t b = 0; b < MIRROR_BYTES; b++)
            cpu[b] = (unsigned char)i;
    }
    /* A lookup table every pass needs: kept on the device. */
    CHECK(mapping_mirror_set_residency(m[0], MAPPING_RESIDENCY_KEEP));
    for (int p = 0; p < PASSES; p++)
        for (int i = 0; i < MIRRORS; i++)
            CHECK(kernel(m[i], p, i));
    /* The results, on the CPU: the device's writes came back, the rest is the CPU's own. */
    int wrong = 0;
    for (int i = 0; i < MIRRORS; i++) {
        CHECK(mapping_mirror_sync_to_cpu(NULL, m[i]));
        const unsigned char *cpu = mapping_mirror_cpu(m[i]);
        int last = -1;
        for (int p = 0; p < PASSES; p++)
            last = (i + p) % 3 == 0 ? p + 1 : last;
        wrong += cpu[0] != (last < 0 ? (unsigned char)i : (unsigned char)last) || cpu[65536] != (unsigned char)i;
    }
    mapping_stats s;
    uint64_t budget, resident;
    CHECK(mapping_device_stats(dev, &s));
    CHECK(mapping_device_memory_budget(dev, &budget, &resident));
    printf("%d mirrors of %zu MiB under a budget of %llu MiB: %llu evictions, %llu KiB written back, %llu MiB "
           "uploaded again, at most %llu MiB resident; mirror 0 (kept) resident: %d\n",
           MIRRORS, MIRROR_BYTES >> 20, (unsigned long long)(budget >> 20), (unsigned long long)s.evictions,
           (unsigned long long)(s.evict_writeback_bytes >> 10), (unsigned long long)(s.evict_reupload_bytes >> 20),
           (unsigned long long)(s.peak_resident_bytes >> 20), mapping_mirror_is_resident(m[0]));
    for (int i = 0; i < MIRRORS; i++)
        mapping_mirror_destroy(m[i]);
    mapping_close(dev);
    if (wrong || s.peak_resident_bytes > budget || !s.evictions) {
        fprintf(stderr, "larger_than_device: %d mirrors wrong, peak %llu of %llu, %llu evictions\n", wrong,
                (unsigned long long)s.peak_resident_bytes, (unsigned long long)budget,
                (unsigned long long)s.evictions);
        return 1;
    }
    printf("every mirror's data is right\n");
    return 0;
}
