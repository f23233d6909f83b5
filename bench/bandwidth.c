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
static int time_variants(bench_ctx *ctx, int runs, int count, int (*const fns[])(void *), void *const jobs[],
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

/* Device to device: the first half of the buffer's bytes onto the second. */
typedef struct d2d_job {
    mapping_buffer *src, *dst;
    size_t          bytes;
} d2d_job;

static int do_d2d(void *arg)
{
    d2d_job *j = arg;
    return mapping_copy_gpu(NULL, j->src, 0, j->dst, 0, j->bytes) != MAPPING_OK;
}

/* Bidirectional: an upload and a download of `bytes` each, on two streams at
 * once (as nvbandwidth's bidirectional test), from page-locked memory. */
typedef struct bidir_job {
    mapping_stream *up, *down;
    mapping_buffer *a, *b;
    char           *host_up, *host_down;
    size_t          bytes;
} bidir_job;

static int do_bidir(void *arg)
{
    bidir_job *j = arg;
    return mapping_sync_to_gpu_range(j->up, j->host_up, j->a, 0, j->bytes) != MAPPING_OK ||
           mapping_sync_to_cpu_range(j->down, j->b, 0, j->host_down, j->bytes) != MAPPING_OK ||
           mapping_stream_synchronize(j->up) != MAPPING_OK || mapping_stream_synchronize(j->down) != MAPPING_OK;
}

/* GB/s of the slowest and fastest run. */
static void speed_range(const timings *t, int v, double bytes, double *lo, double *hi)
{
    double slow = t->samples[v][0], fast = slow;
    for (int r = 1; r < t->runs; r++) {
        slow = t->samples[v][r] > slow ? t->samples[v][r] : slow;
        fast = t->samples[v][r] < fast ? t->samples[v][r] : fast;
    }
    *lo = gbps((size_t)bytes, slow);
    *hi = gbps((size_t)bytes, fast);
}

enum { MAX_COLS = 12 };

/* The variants of one row, chosen by --direction: a column each (and the
 * ratio columns after them). */
typedef struct bw_plan {
    int         count;
    int (*fn[MAX_VARIANTS])(void *);
    void       *job[MAX_VARIANTS];
    const char *col[MAX_COLS];
    double      scale[MAX_VARIANTS]; /* bytes moved per call / bytes */
    int         h2d_locked, d2h_locked, memcpy_from, memcpy_into; /* variant index or -1 */
} bw_plan;

static int plan_add(bw_plan *p, const char *col, int (*fn)(void *), void *job, double scale)
{
    p->col[p->count] = col;
    p->fn[p->count] = fn;
    p->job[p->count] = job;
    p->scale[p->count] = scale;
    return p->count++;
}

BENCH_SECTION(bench_bandwidth, 10, "bandwidth",
              "bandwidth over sizes (--sizes; default 1 KiB..256 MiB): H2D, D2H (pageable, page-locked), D2D, "
              "bidirectional (--direction)")
{
    size_t sizes[64];
    int n = bench_sizes(ctx, 1024, (size_t)256 << 20, ctx->quick ? 16 : 4, sizes, 64);
    const size_t max_bytes = sizes[n - 1];
    const int host = strcmp(ctx->info.backend, "host") == 0;
    const unsigned dirs = ctx->directions;

    mapping_buffer *buf = NULL, *buf2 = NULL;
    mapping_stream *up = NULL, *down = NULL;
    void *locked = NULL, *locked2 = NULL;
    char *pageable = malloc(max_bytes), *other = malloc(max_bytes);
    int rc = 1;
    if (!pageable || !other || bench_check(mapping_allocate_gpu(ctx->dev, max_bytes, &buf), "allocate_gpu") ||
        bench_check(mapping_allocate_cpu(ctx->dev, max_bytes, &locked), "allocate_cpu"))
        goto out;
    if ((dirs & (BENCH_DIR_D2D | BENCH_DIR_BIDIR)) &&
        bench_check(mapping_allocate_gpu(ctx->dev, max_bytes, &buf2), "allocate_gpu (second buffer)"))
        goto out;
    if ((dirs & BENCH_DIR_BIDIR) && (bench_check(mapping_allocate_cpu(ctx->dev, max_bytes, &locked2), "allocate_cpu") ||
                                     bench_check(mapping_stream_create(ctx->dev, &up), "stream_create") ||
                                     bench_check(mapping_stream_create(ctx->dev, &down), "stream_create")))
        goto out;
    memset(pageable, 1, max_bytes);
    memset(other, 2, max_bytes);
    memset(locked, 3, max_bytes);
    if (locked2)
        memset(locked2, 4, max_bytes);
    /* On the host back end the baseline copies between the very same two
     * memory regions the library copies between (the buffer's native handle
     * is its address), so the ratio isolates the library's own cost. */
    void *baseline_peer = other;
    if (host && mapping_buffer_native(buf, &baseline_peer) != MAPPING_OK)
        baseline_peer = other;

    copy_job pj = {buf, pageable, other, 0}, lj = {buf, locked, baseline_peer, 0};
    d2d_job dj = {buf, buf2, 0};
    bidir_job bj = {up, down, buf, buf2, locked, locked2, 0};
    bw_plan plan = {.h2d_locked = -1, .d2h_locked = -1, .memcpy_from = -1, .memcpy_into = -1};
    if (dirs & BENCH_DIR_H2D) {
        plan_add(&plan, "H2D pageable", do_h2d, &pj, 1);
        plan.h2d_locked = plan_add(&plan, "H2D locked", do_h2d, &lj, 1);
    }
    if (dirs & BENCH_DIR_D2H) {
        plan_add(&plan, "D2H pageable", do_d2h, &pj, 1);
        plan.d2h_locked = plan_add(&plan, "D2H locked", do_d2h, &lj, 1);
    }
    if (dirs & BENCH_DIR_D2D)
        plan_add(&plan, "D2D", do_d2d, &dj, 1);
    if (dirs & BENCH_DIR_BIDIR)
        plan_add(&plan, "bidir locked", do_bidir, &bj, 2);
    if (dirs & BENCH_DIR_H2D)
        plan.memcpy_from = plan_add(&plan, "memcpy from", do_memcpy, &lj, 1);
    if (dirs & BENCH_DIR_D2H)
        plan.memcpy_into = plan_add(&plan, "memcpy into", do_memcpy_into, &lj, 1);
    int ncols = plan.count;
    if (plan.h2d_locked >= 0)
        plan.col[ncols++] = "H2D/memcpy";
    if (plan.d2h_locked >= 0)
        plan.col[ncols++] = "D2H/memcpy";

    char title[640];
    snprintf(title, sizeof title,
             "Bandwidth, GB/s (blocking copies; D2D = mapping_copy_gpu within the device; bidir = an upload and a "
             "download at once on two streams, bytes of both; memcpy from/into = single-threaded memcpy on this CPU "
             "from/into the same page-locked memory%s; ratios: median over runs of the page-locked copy / that "
             "memcpy, paired in each run%s)",
             host ? ", between the same regions as the library's copy" : "",
             host ? ": the library's own cost over a plain copy"
                  : ": how the link compares with the CPU's own copy, not a cost of the library");
    bench_table t;
    bench_table_begin(ctx, &t, "bandwidth", title, "size", 2, ncols, plan.col);
    double h2d_ratio = NAN, d2h_ratio = NAN;
    for (int i = 0; i < n; i++) {
        size_t bytes = sizes[i];
        char name[32];
        bench_progress(ctx, "%s (%d of %d sizes)", bench_size_name(bytes, name, sizeof name), i + 1, n);
        pj.bytes = lj.bytes = dj.bytes = bj.bytes = bytes;
        /* The headline size gets more runs: its ratio is the figure to reach. */
        int runs = bytes == max_bytes && !ctx->quick && ctx->runs < 15 ? 15 : ctx->runs;
        timings tm;
        double v[MAX_COLS], lo[MAX_COLS], hi[MAX_COLS];
        if (time_variants(ctx, runs, plan.count, plan.fn, plan.job, &tm) != 0)
            goto out;
        for (int k = 0; k < plan.count; k++) {
            v[k] = gbps(bytes, tm.median[k]) * plan.scale[k];
            speed_range(&tm, k, (double)bytes * plan.scale[k], &lo[k], &hi[k]);
        }
        int c = plan.count;
        if (plan.h2d_locked >= 0) {
            v[c] = paired_speed_ratio(&tm, plan.h2d_locked, plan.memcpy_from);
            lo[c] = hi[c] = NAN;
            h2d_ratio = v[c++];
        }
        if (plan.d2h_locked >= 0) {
            v[c] = paired_speed_ratio(&tm, plan.d2h_locked, plan.memcpy_into);
            lo[c] = hi[c] = NAN;
            d2h_ratio = v[c++];
        }
        bench_table_row_sized(&t, bytes, v, lo, hi);
    }
    bench_table_end(&t);
    char size_name[32], what[96];
    bench_size_name(max_bytes, size_name, sizeof size_name);
    if (plan.h2d_locked >= 0) {
        snprintf(what, sizeof what, "%s H2D page-locked / memcpy", size_name);
        bench_figure(ctx, max_bytes == (size_t)256 << 20 ? "h2d_256MiB_locked_over_memcpy" : "h2d_largest_locked_over_memcpy", h2d_ratio, "x", what);
    }
    if (plan.d2h_locked >= 0) {
        snprintf(what, sizeof what, "%s D2H page-locked / memcpy", size_name);
        bench_figure(ctx, max_bytes == (size_t)256 << 20 ? "d2h_256MiB_locked_over_memcpy" : "d2h_largest_locked_over_memcpy", d2h_ratio, "x", what);
    }
    rc = 0;
out:
    mapping_stream_destroy(up);
    mapping_stream_destroy(down);
    mapping_free_cpu(ctx->dev, locked);
    mapping_free_cpu(ctx->dev, locked2);
    mapping_free_gpu(buf);
    mapping_free_gpu(buf2);
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
    void *const jobs[3] = {&j, &j, &j};
    timings tm;
    if (time_variants(ctx, ctx->runs, 3, fns, jobs, &tm) != 0)
        goto out;
    double h2d = tm.median[0], d2h = tm.median[1], mc = tm.median[2];
    static const char *const cols[] = {"median us", "- memcpy ns", "/ memcpy"};
    bench_table t;
    bench_table_begin(ctx, &t, "latency",
                      strcmp(ctx->info.backend, "host") == 0
                          ? "Latency of one 64-byte blocking copy from page-locked memory (baseline: memcpy of 64 bytes)"
                          : "Latency of one 64-byte blocking copy from page-locked memory across the device's link "
                            "(memcpy = 64 bytes copied by this CPU, the floor of any copy)",
                      "copy", 3, 3, cols);
    double lo[3], hi[3];
    for (int k = 0; k < 3; k++) { /* seconds of the fastest and slowest run */
        lo[k] = hi[k] = tm.samples[k][0];
        for (int r = 1; r < tm.runs; r++) {
            lo[k] = tm.samples[k][r] < lo[k] ? tm.samples[k][r] : lo[k];
            hi[k] = tm.samples[k][r] > hi[k] ? tm.samples[k][r] : hi[k];
        }
    }
    bench_table_row_range(&t, "H2D", 64, (double[]){h2d * 1e6, (h2d - mc) * 1e9, h2d / mc},
                          (double[]){lo[0] * 1e6, NAN, NAN}, (double[]){hi[0] * 1e6, NAN, NAN});
    bench_table_row_range(&t, "D2H", 64, (double[]){d2h * 1e6, (d2h - mc) * 1e9, d2h / mc},
                          (double[]){lo[1] * 1e6, NAN, NAN}, (double[]){hi[1] * 1e6, NAN, NAN});
    bench_table_row_range(&t, "memcpy", 64, (double[]){mc * 1e6, 0, 1}, (double[]){lo[2] * 1e6, NAN, NAN},
                          (double[]){hi[2] * 1e6, NAN, NAN});
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
