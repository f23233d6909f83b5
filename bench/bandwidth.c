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

/* The host-side baselines: from `host` (as H2D reads it), and into `host`
 * (as D2H writes it), each against another plain heap buffer. */
static int do_memcpy(void *arg)
{
    copy_job *j = arg;
    memcpy_fn(j->other, j->host, j->bytes);
    return 0;
}

static int do_memcpy_into(void *arg)
{
    copy_job *j = arg;
    memcpy_fn(j->host, j->other, j->bytes);
    return 0;
}

static double gbps(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / seconds * 1e-9 : NAN;
}

enum { MAX_VARIANTS = 8, MAX_RUNS = 64 };

typedef struct timings {
    int    runs;
    double samples[MAX_VARIANTS][MAX_RUNS]; /* seconds per call */
    double median[MAX_VARIANTS];
} timings;

/* Median over runs of the ratio of variant a's speed to variant b's, each
 * pair taken in the same run: robust against load that drifts between runs. */
static double paired_speed_ratio(const timings *t, int a, int b)
{
    double r[MAX_RUNS];
    for (int i = 0; i < t->runs; i++)
        r[i] = t->samples[b][i] / t->samples[a][i];
    return bench_median(r, t->runs);
}

/* Times several variants of a copy, interleaved: each run samples every
 * variant once, so drift in the machine's load hits them all alike. */
static int time_variants(bench_ctx *ctx, int runs, int count, int (*const fns[])(void *), copy_job *const jobs[],
                         timings *out)
{
    int reps[MAX_VARIANTS];
    for (int v = 0; v < count; v++) {
        if (fns[v](jobs[v]) != 0) /* warm-up: faults pages in, checks the call works */
            return 1;
        /* Calibrate on a warm loop of at least 2 ms, not on the first call. */
        int calls = 0;
        double t0 = bench_now(), elapsed;
        do {
            if (fns[v](jobs[v]) != 0)
                return 1;
            calls++;
        } while ((elapsed = bench_now() - t0) < 0.002);
        reps[v] = bench_reps_for(elapsed / calls, ctx->quick ? 0.005 : 0.02);
    }
    out->runs = runs < MAX_RUNS ? runs : MAX_RUNS;
    for (int r = 0; r < out->runs; r++)
        for (int v = 0; v < count; v++) {
            double t0 = bench_now();
            for (int i = 0; i < reps[v]; i++)
                if (fns[v](jobs[v]) != 0)
                    return 1;
            out->samples[v][r] = (bench_now() - t0) / reps[v];
        }
    for (int v = 0; v < count; v++) {
        double sorted[MAX_RUNS];
        memcpy(sorted, out->samples[v], sizeof sorted);
        out->median[v] = bench_median(sorted, out->runs);
    }
    return 0;
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
    /* On the host back end the baseline copies between the very same two
     * memory regions the library copies between (the buffer's native handle
     * is its address), so the ratio isolates the library's own cost. */
    void *baseline_peer = other;
    if (strcmp(ctx->info.backend, "host") == 0 && mapping_native_buffer(buf, &baseline_peer) != MAPPING_OK)
        baseline_peer = other;

    static const char *const cols[] = {"H2D pageable", "H2D locked", "D2H pageable", "D2H locked",
                                       "memcpy from", "memcpy into", "H2D/memcpy", "D2H/memcpy"};
    bench_table t;
    bench_table_begin(ctx, &t, "bandwidth", "Bandwidth, GB/s (blocking copies; memcpy from/into page-locked memory = single-threaded host "
                      "memcpy baseline, between the same regions on the host back end; ratios: median over runs of locked copy / memcpy of the same direction, paired in each run)",
                      "size", 2, 8, cols);
    double h2d_ratio = NAN, d2h_ratio = NAN;
    for (int i = 0; i < n; i++) {
        size_t bytes = sizes[i];
        copy_job pj = {buf, pageable, other, bytes}, lj = {buf, locked, baseline_peer, bytes};
        int (*const fns[6])(void *) = {do_h2d, do_h2d, do_d2h, do_d2h, do_memcpy, do_memcpy_into};
        copy_job *const jobs[6] = {&pj, &lj, &pj, &lj, &lj, &lj};
        /* The headline size gets more runs: its ratio is the figure to reach. */
        int runs = bytes == max_bytes && !ctx->quick && ctx->runs < 15 ? 15 : ctx->runs;
        timings tm;
        double v[8];
        if (time_variants(ctx, runs, 6, fns, jobs, &tm) != 0)
            goto out;
        for (int k = 0; k < 6; k++)
            v[k] = gbps(bytes, tm.median[k]);
        v[6] = paired_speed_ratio(&tm, 1, 4);
        v[7] = paired_speed_ratio(&tm, 3, 5);
        char label[32];
        bench_table_row(&t, bench_size_name(bytes, label, sizeof label), v);
        if (bytes == max_bytes) {
            h2d_ratio = v[6];
            d2h_ratio = v[7];
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
    int (*const fns[3])(void *) = {do_h2d, do_d2h, do_memcpy};
    copy_job *const jobs[3] = {&j, &j, &j};
    timings tm;
    if (time_variants(ctx, ctx->runs, 3, fns, jobs, &tm) != 0)
        goto out;
    double h2d = tm.median[0], d2h = tm.median[1], mc = tm.median[2];
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
