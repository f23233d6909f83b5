/*
 * A write-tracking mirror: the program writes its array like any array
 * (scattered stores, a memset, a loop) and never calls a mark; each sync
 * still moves the bytes it changed (and only those, but for gaps the link
 * model merges), which mapping_mirror_stale_bytes and the device's
 * statistics show. Device results come back the usual way (the device's writes are
 * marked: the library cannot see them). Runs on the default back end
 * ($MAPPING_BACKEND to choose); $MAPPING_TRACK picks the mechanism.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "mapping.h"

enum { N = 1 << 22 }; /* 16 MiB of floats */

static unsigned long long moved_to_gpu(mapping_device *dev)
{
    mapping_stats s;
    CHECK(mapping_device_stats(dev, &s));
    return (unsigned long long)s.h2d_bytes;
}

int main(void)
{
    size_t page = 0;
    if (mapping_write_tracking(&page) == MAPPING_TRACK_NONE) {
        printf("SKIP: no write tracking here: %s\n", mapping_write_tracking_description());
        return 77;
    }
    printf("write tracking: %s, %zu-byte pages\n", mapping_write_tracking_description(), page);
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    const size_t whole = N * sizeof(float);
    mapping_mirror *m;
    CHECK(mapping_mirror_create(dev, whole, MAPPING_MIRROR_TRACK_WRITES, &m));
    float *data = mapping_mirror_cpu(m);
    for (size_t i = 0; i < N; i++)
        data[i] = (float)i;
    CHECK(mapping_mirror_sync_to_gpu(NULL, m)); /* all of it, the first time */

    /* 8 scattered stores, a memset of 1,000 floats, a loop over a row: no marks. */
    unsigned long long before = moved_to_gpu(dev);
    for (size_t k = 0; k < 8; k++)
        data[k * (N / 8) + 5] = -1.0f;
    memset(data + 100000, 0, 1000 * sizeof(float));
    for (size_t i = 2000000; i < 2000000 + 4096; i++)
        data[i] *= 2.0f;
    size_t stale = mapping_mirror_stale_bytes(m, MAPPING_GPU); /* the bytes that changed */
    CHECK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned long long moved = moved_to_gpu(dev) - before;
    printf("sync after scattered writes: %zu bytes stale of %zu, %llu moved (gaps cheaper to copy than to skip on "
           "this link are merged)\n", stale, whole, moved);

    /* The device side holds every write. */
    float *check = malloc(whole);
    if (!check)
        return 1;
    CHECK(mapping_sync_to_cpu_range(NULL, mapping_mirror_gpu(m), 0, check, whole));
    int wrong = memcmp(check, data, whole) != 0;

    /* A clean sync moves nothing. */
    before = moved_to_gpu(dev);
    CHECK(mapping_mirror_sync_to_gpu(NULL, m));
    unsigned long long clean = moved_to_gpu(dev) - before;
    printf("clean sync: %llu bytes moved\n", clean);

    /* The device writes a range (a kernel would): marked, and synced back. */
    CHECK(mapping_fill_gpu(NULL, mapping_mirror_gpu(m), 0, 4096, 0));
    CHECK(mapping_mirror_mark_gpu_modified(m, 0, 4096));
    CHECK(mapping_mirror_sync_to_cpu(NULL, m));
    wrong |= data[0] != 0.0f || data[1023] != 0.0f || data[1024] != 1024.0f;
    free(check);
    mapping_mirror_destroy(m);
    mapping_close(dev);
    if (wrong || moved < stale || stale == 0 || stale > 16 * page || clean != 0) {
        fprintf(stderr, "tracked mirror: unexpected result\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}
