/*
 * Host-to-device and device-to-host bandwidth over a size sweep, from
 * pageable and from page-locked memory, against single-threaded memcpy
 * measured in the same run (as CUDA's bandwidthTest and nvbandwidth report
 * it: GB/s = 1e9 bytes/s, medians).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef struct copy_job {
    mapping_buffer *buf;
    void           *host;
    void           *other; /* memcpy destination */
    size_t          bytes;
} copy_job;

static int do_h2d(void *arg)
{
    copy_job *j = arg;
    return mapping_sync_to_gpu_range(NULL, j->host, j->buf, 0, j->bytes) != MAPPING_OK;
}

static int do_d2h(void *arg)
{
    copy_job *j = arg;
    return mapping_sync_to_cpu_range(NULL, j->buf, 0, j->host, j->bytes) != MAPPING_OK;
}

/* Through a volatile pointer, so the compiler cannot elide or inline it. */
static void *(*volatile memcpy_fn)(void *, const void *, size_t) = memcpy;

static int do_memcpy(void *arg)
{
    copy_job *j = arg;
    memcpy_fn(j->other, j->host, j->bytes);
    return 0;
}

static double gbps(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / seconds * 1e-9 : NAN;
}

/* Median seconds per call of fn, with enough repetitions per sample. */
static double time_copy(bench_ctx *ctx, int (*fn)(void *), copy_job *job)
{
    double t0 = bench_now();
    if (fn(job) != 0) /* warm-up: faults pages in, and checks the call works */
        return NAN;
    double once = bench_now() - t0;
    return bench_time(ctx, bench_reps_for(once, ctx->quick ? 0.01 : 0.05), fn, job);
}

BENCH_SECTION(bench_bandwidth, 10, "bandwidth", "host<->device bandwidth, 1 KiB..256 MiB, pageable and page-locked")
{
    const size_t max_bytes = (size_t)256 << 20;
    size_t sizes[16];
    int n = 0;
    for (size_t s = 1024; s <= max_bytes; s *= ctx->quick ? 16 : 4)
        sizes[n++] = s;
    if (sizes[n - 1] != max_bytes)
        sizes[n++] = max_bytes;

    mapping_buffer *buf = NULL;
    void *locked = NULL;
    char *pageable = malloc(max_bytes), *other = malloc(max_bytes);
    int rc = 1;
    if (!pageable || !other || bench_check(mapping_allocate_gpu(ctx->dev, max_bytes, &buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, max_bytes, &locked), "allocate_cpu"))
        goto out;
    memset(pageable, 1, max_bytes);
    memset(other, 2, max_bytes);
    memset(locked, 3, max_bytes);

    static const char *const cols[] = {"H2D pageable", "H2D locked", "D2H pageable", "D2H locked", "memcpy",
                                       "H2D/memcpy", "D2H/memcpy"};
    bench_table t;
    bench_table_begin(ctx, &t, "bandwidth", "Bandwidth, GB/s (blocking copies; memcpy = single-threaded host memcpy)",
                      "size", 2, 7, cols);
    double h2d_ratio = NAN, d2h_ratio = NAN;
    for (int i = 0; i < n; i++) {
        size_t bytes = sizes[i];
        copy_job pj = {buf, pageable, other, bytes}, lj = {buf, locked, other, bytes};
        double v[7];
        v[0] = gbps(bytes, time_copy(ctx, do_h2d, &pj));
        v[1] = gbps(bytes, time_copy(ctx, do_h2d, &lj));
        v[2] = gbps(bytes, time_copy(ctx, do_d2h, &pj));
        v[3] = gbps(bytes, time_copy(ctx, do_d2h, &lj));
        v[4] = gbps(bytes, time_copy(ctx, do_memcpy, &lj));
        v[5] = v[1] / v[4];
        v[6] = v[3] / v[4];
        char label[32];
        bench_table_row(&t, bench_size_name(bytes, label, sizeof label), v);
        if (bytes == max_bytes) {
            h2d_ratio = v[5];
            d2h_ratio = v[6];
        }
    }
    bench_table_end(&t);
    bench_figure(ctx, "h2d_256MiB_locked_over_memcpy", h2d_ratio, "x", "256 MiB H2D page-locked / memcpy");
    bench_figure(ctx, "d2h_256MiB_locked_over_memcpy", d2h_ratio, "x", "256 MiB D2H page-locked / memcpy");
    rc = 0;
out:
    mapping_free_cpu(ctx->dev, locked);
    mapping_free_gpu(buf);
    free(pageable);
    free(other);
    return rc;
}

/* ---- small-copy latency ---- */

BENCH_SECTION(bench_latency, 20, "latency", "64-byte blocking copy latency against memcpy of 64 bytes")
{
    mapping_buffer *buf = NULL;
    void *locked = NULL;
    char other[64];
    int rc = 1;
    if (bench_check(mapping_allocate_gpu(ctx->dev, 4096, &buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, 4096, &locked), "allocate_cpu"))
        goto out;
    memset(locked, 5, 4096);
    copy_job j = {buf, locked, other, 64};
    double h2d = time_copy(ctx, do_h2d, &j), d2h = time_copy(ctx, do_d2h, &j), mc = time_copy(ctx, do_memcpy, &j);
    static const char *const cols[] = {"median us", "- memcpy ns", "/ memcpy"};
    bench_table t;
    bench_table_begin(ctx, &t, "latency", "Latency of one 64-byte blocking copy from page-locked memory", "copy", 3, 3,
                      cols);
    bench_table_row(&t, "H2D", (double[]){h2d * 1e6, (h2d - mc) * 1e9, h2d / mc});
    bench_table_row(&t, "D2H", (double[]){d2h * 1e6, (d2h - mc) * 1e9, d2h / mc});
    bench_table_row(&t, "memcpy", (double[]){mc * 1e6, 0, 1});
    bench_table_end(&t);
    bench_figure(ctx, "h2d_64B_us", h2d * 1e6, "us", "64 B H2D blocking latency");
    bench_figure(ctx, "d2h_64B_us", d2h * 1e6, "us", "64 B D2H blocking latency");
    bench_figure(ctx, "h2d_64B_over_memcpy_ns", (h2d - mc) * 1e9, "ns", "64 B H2D cost above memcpy");
    rc = 0;
out:
    mapping_free_cpu(ctx->dev, locked);
    mapping_free_gpu(buf);
    return rc;
}
