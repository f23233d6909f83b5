/*
 * Cold start: the first scattered flush on a freshly opened device (10,000
 * scattered 64-byte host-to-device copies, as in the batch section) against
 * the second flush on it (warm). On OpenCL the first one builds the
 * scatter/gather kernels: from source, or from the program binary an earlier
 * process kept in the per-user cache ($MAPPING_CACHE_DIR). Both are measured:
 * "no cache" runs with MAPPING_CACHE_DIR=off. A device whose memory is the
 * CPU's (PoCL) copies through mapped memory and builds no kernel for such a
 * flush, so those two rows switch that off (MAPPING_BATCH_MAP=0); a third
 * row measures the device as opened.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

enum { N = 10000, COPY = 64, STRIDE = 3 * COPY };

/* Seconds of the first and second flush on a newly opened device. */
static int cold_and_warm(bench_ctx *ctx, unsigned char *host, double *cold, double *warm)
{
    mapping_device_desc desc = {.backend = ctx->info.backend, .device = ctx->info.index};
    mapping_device *dev = NULL;
    mapping_buffer *buf = NULL;
    mapping_batch *b = NULL;
    int rc = 1;
    if (bench_check(mapping_open(&desc, &dev), "open") || bench_check(mapping_allocate_gpu(dev, N * STRIDE, &buf), "alloc") ||
        bench_check(mapping_batch_create(dev, &b), "batch_create"))
        goto out;
    for (int round = 0; round < 2; round++) {
        double t0 = bench_now();
        for (size_t i = 0; i < N; i++)
            if (mapping_batch_add_to_gpu(b, host + i * COPY, buf, i * STRIDE, COPY) != MAPPING_OK)
                goto out;
        if (bench_check(mapping_batch_flush(NULL, b), "flush"))
            goto out;
        *(round ? warm : cold) = bench_now() - t0;
    }
    rc = 0;
out:
    mapping_batch_destroy(b);
    mapping_free_gpu(buf);
    mapping_close(dev);
    return rc;
}

BENCH_SECTION(bench_cold, 45, "cold", "the first scattered flush on a newly opened device vs a warm one")
{
    unsigned char *host = malloc(N * COPY);
    if (!host)
        return 1;
    memset(host, 5, N * COPY);
    const char *old = getenv("MAPPING_CACHE_DIR"), *old_map = getenv("MAPPING_BATCH_MAP");
    char *saved = old ? strdup(old) : NULL, *saved_map = old_map ? strdup(old_map) : NULL;
    int runs = ctx->quick ? 3 : ctx->runs < 9 ? ctx->runs : 9;
    enum { CASES = 3 }; /* no cache, binary cache (both through the kernel), as opened */
    double c[CASES][64], w[CASES][64], r[CASES][64];
    double dummy_c, dummy_w;
    int rc = 1;
    if (cold_and_warm(ctx, host, &dummy_c, &dummy_w)) /* fills the cache, if there is one */
        goto out;
    for (int k = 0; k < runs; k++)
        for (int cache = 0; cache < CASES; cache++) {
            if (cache) {
                if (saved)
                    setenv("MAPPING_CACHE_DIR", saved, 1);
                else
                    unsetenv("MAPPING_CACHE_DIR");
            } else {
                setenv("MAPPING_CACHE_DIR", "off", 1);
            }
            if (cache < 2)
                setenv("MAPPING_BATCH_MAP", "0", 1);
            else if (saved_map)
                setenv("MAPPING_BATCH_MAP", saved_map, 1);
            else
                unsetenv("MAPPING_BATCH_MAP");
            if (cold_and_warm(ctx, host, &c[cache][k], &w[cache][k]))
                goto out;
            r[cache][k] = c[cache][k] / w[cache][k];
        }
    static const char *const cols[] = {"cold ms", "warm ms", "cold/warm"};
    bench_table t;
    bench_table_begin(ctx, &t, "cold_start",
                      "Cold start: first flush of 10,000 scattered 64-byte H2D copies on a newly opened device vs the "
                      "second",
                      "case", 3, 3, cols);
    const char *labels[CASES] = {"no cache", "binary cache", "as opened"};
    double ratio[CASES];
    for (int cache = 0; cache < CASES; cache++) {
        double cm = bench_median(c[cache], runs) * 1e3, wm = bench_median(w[cache], runs) * 1e3;
        ratio[cache] = bench_median(r[cache], runs);
        bench_table_row(&t, labels[cache], (double[]){cm, wm, ratio[cache]});
    }
    bench_table_end(&t);
    bench_note(ctx, "no cache: MAPPING_CACHE_DIR=off (kernels built from source on OpenCL); binary cache: the "
                    "per-user cache directory; both with MAPPING_BATCH_MAP=0 (the kernel path, even where the CPU "
                    "could copy through mapped memory). as opened: the cache and MAPPING_BATCH_MAP as the "
                    "environment has them. cold/warm: the median of each open's ratio.");
    bench_figure(ctx, "cold_start_ratio", ratio[1], "x", "first flush / warm flush, with the binary cache (target <= 2)");
    bench_figure(ctx, "cold_start_as_opened_ratio", ratio[2], "x", "first flush / warm flush, the device as opened");
    rc = 0;
out:
    if (saved)
        setenv("MAPPING_CACHE_DIR", saved, 1);
    else
        unsetenv("MAPPING_CACHE_DIR");
    if (saved_map)
        setenv("MAPPING_BATCH_MAP", saved_map, 1);
    else
        unsetenv("MAPPING_BATCH_MAP");
    free(saved);
    free(saved_map);
    free(host);
    return rc;
}
