/*
 * A mirror over an existing host array: change a few scattered elements on
 * the CPU, sync, let the device change a few others, sync back. Each sync
 * moves only the stale bytes, which the device's statistics show.
 * Runs on the default back end ($MAPPING_BACKEND to choose).
 */
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "mapping.h"

enum { N = 1 << 20, CHANGED = 8, CLEARED = 16 }; /* 4 MiB of floats */

int main(void)
{
    mapping_device *dev;
    CHECK(mapping_open(NULL, &dev));
    float *data = malloc(N * sizeof(float)), *expect = malloc(N * sizeof(float));
    if (!data || !expect) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < N; i++)
        data[i] = expect[i] = (float)i * 0.5f;
    const size_t whole = N * sizeof(float);

    mapping_mirror *m;
    CHECK(mapping_mirror_wrap(dev, data, whole, MAPPING_MIRROR_PIN, &m));
    CHECK(mapping_mirror_sync_to_gpu(NULL, m)); /* the GPU side starts stale: the first sync copies it all */
    mapping_device_stats_reset(dev);

    /* CPU: change CHANGED elements far apart, and say so. */
    for (size_t k = 0; k < CHANGED; k++) {
        size_t i = k * (N / CHANGED) + 123;
        data[i] = expect[i] = -1.0f - (float)k;
        CHECK(mapping_mirror_mark_cpu_modified(m, i * sizeof(float), sizeof(float)));
    }
    size_t stale_gpu = mapping_mirror_stale_bytes(m, MAPPING_GPU);
    CHECK(mapping_mirror_sync_to_gpu(NULL, m));
    mapping_stats up;
    CHECK(mapping_device_stats(dev, &up));

    /* Device: clear CLEARED elements and copy one element onto another, with
     * library calls (a kernel would go here), then say so. */
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    size_t base = mapping_mirror_gpu_offset(m), at = N / 2 + 7, from = 123, to = 3 * (N / 4) + 9;
    CHECK(mapping_fill_gpu(NULL, gpu, base + at * sizeof(float), CLEARED * sizeof(float), 0));
    CHECK(mapping_mirror_mark_gpu_modified(m, at * sizeof(float), CLEARED * sizeof(float)));
    CHECK(mapping_copy_gpu(NULL, gpu, base + from * sizeof(float), gpu, base + to * sizeof(float), sizeof(float)));
    CHECK(mapping_mirror_mark_gpu_modified(m, to * sizeof(float), sizeof(float)));
    for (size_t k = 0; k < CLEARED; k++)
        expect[at + k] = 0.0f;
    expect[to] = expect[from];

    size_t stale_cpu = mapping_mirror_stale_bytes(m, MAPPING_CPU);
    CHECK(mapping_mirror_sync_to_cpu(NULL, m));
    CHECK(mapping_mirror_sync_to_cpu(NULL, m)); /* already in sync: moves nothing */
    mapping_stats down;
    CHECK(mapping_device_stats(dev, &down));

    size_t wrong = 0;
    for (size_t i = 0; i < N; i++)
        wrong += data[i] != expect[i];

    printf("back end %s, mirror of %zu bytes%s\n", mapping_backend_name(dev), whole,
           mapping_mirror_is_pinned(m) ? " (page-locked in place)" : "");
    printf("to GPU: %zu bytes stale, %llu bytes moved in %llu copies\n", stale_gpu,
           (unsigned long long)up.h2d_bytes, (unsigned long long)up.h2d_copies);
    printf("to CPU: %zu bytes stale, %llu bytes moved in %llu copies\n", stale_cpu,
           (unsigned long long)down.d2h_bytes, (unsigned long long)down.d2h_copies);
    printf("bytes the syncs skipped (already valid): %llu\n", (unsigned long long)down.sync_skipped_bytes);

    /* The marks are exact: the stale bytes are what was marked. A sync copies
     * them, plus a valid gap between two of them where one more transfer
     * would cost more than the gap (gap < latency x bandwidth of the link),
     * and never the whole array. */
    mapping_link link;
    CHECK(mapping_device_link(dev, &link));
    double merge = link.latency * link.bandwidth;
    size_t gap = (N / CHANGED - 1) * sizeof(float); /* the smallest gap between two marks here */
    printf("link: %.2f us per transfer, %.1f GB/s: gaps under %.0f bytes are copied with their neighbours\n",
           link.latency * 1e6, link.bandwidth * 1e-9, merge);
    int ok = wrong == 0 && stale_gpu == CHANGED * sizeof(float) && stale_cpu == (CLEARED + 1) * sizeof(float) &&
             mapping_mirror_stale_bytes(m, MAPPING_CPU) == 0;
    ok = ok && up.h2d_bytes >= stale_gpu && up.h2d_bytes < whole && (up.h2d_bytes == stale_gpu || gap < merge);
    ok = ok && down.d2h_bytes >= stale_cpu && down.d2h_bytes < whole && (down.d2h_bytes == stale_cpu || gap < merge);
    printf("%s: %zu of %d elements differ from the expected values\n", ok ? "ok" : "FAIL", wrong, N);

    mapping_mirror_destroy(m);
    mapping_close(dev);
    free(data);
    free(expect);
    return ok ? 0 : 1;
}
