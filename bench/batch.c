/*
 * Batches: N scattered 64-byte copies as one batch, against the same N
 * copies made one by one, blocking and on a stream, in the same run. On the
 * section's device, and (host back end) on a second host device with the
 * link modelled at 25 GB/s and 5 us, where per-transfer cost is PCIe-like.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "floor.h"

enum { COPY = 64, STRIDE = 3 * COPY };

typedef struct batch_job {
    mapping_device *dev;
    mapping_buffer *buf;
    mapping_stream *stream;
    mapping_batch  *batch;
    unsigned char  *host; /* N * COPY bytes, pageable */
    const size_t   *order; /* the order the copies are added in; NULL: by offset */
    size_t          n;
    int             to_gpu;
} batch_job;

static int run_batch(void *arg)
{
    batch_job *j = arg;
    for (size_t k = 0; k < j->n; k++) {
        size_t i = j->order ? j->order[k] : k;
        mapping_status st = j->to_gpu ? mapping_batch_add_to_gpu(j->batch, j->host + i * COPY, j->buf, i * STRIDE, COPY)
                                      : mapping_batch_add_to_cpu(j->batch, j->buf, i * STRIDE, j->host + i * COPY, COPY);
        if (st != MAPPING_OK)
            return 1;
    }
    return mapping_batch_flush(NULL, j->batch) != MAPPING_OK;
}

static int run_singles(void *arg)
{
    batch_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        mapping_status st = j->to_gpu ? mapping_sync_to_gpu_range(j->stream, j->host + i * COPY, j->buf, i * STRIDE, COPY)
                                      : mapping_sync_to_cpu_range(j->stream, j->buf, i * STRIDE, j->host + i * COPY, COPY);
        if (st != MAPPING_OK)
            return 1;
    }
    return j->stream ? mapping_stream_synchronize(j->stream) != MAPPING_OK : 0;
}

static double timed(bench_ctx *ctx, int (*fn)(void *), batch_job *j)
{
    if (fn(j) != 0) /* warm-up: staging allocated, pages touched, the call checked */
        return NAN;
    return bench_time(ctx, 1, fn, j);
}

/* One table row per direction on dev; returns 0 on success. ratios: batch
 * vs blocking and vs stream singles per direction, batch / floor H2D and
 * D2H, then a blocking single copy's median time (s) H2D and D2H. */
static int measure_device(bench_ctx *ctx, bench_table *t, mapping_device *dev, const char *name, size_t n,
                          double ratios[8])
{
    batch_job j = {.dev = dev, .n = n};
    int rc = 1;
    j.host = malloc(n * COPY);
    if (!j.host || bench_check(mapping_allocate_gpu(dev, n * STRIDE, &j.buf), "allocate_gpu") ||
        bench_check(mapping_batch_create(dev, &j.batch), "batch_create"))
        goto out;
    memset(j.host, 7, n * COPY);
    mapping_stream *stream = NULL;
    if (bench_check(mapping_stream_create(dev, &stream), "stream_create"))
        goto out;
    bench_floor *floor = bench_floor_open(dev, n * COPY);
    size_t *offsets = malloc(n * sizeof *offsets);
    for (size_t i = 0; offsets && i < n; i++)
        offsets[i] = i * STRIDE;
    if (offsets)
        bench_floor_scatter(floor, j.buf, offsets, n, COPY);
    for (int dir = 0; dir < 2; dir++) {
        j.to_gpu = dir == 0;
        mapping_stats before, after;
        mapping_device_stats(dev, &before);
        j.stream = NULL;
        if (run_batch(&j) != 0) {
            bench_check(mapping_last_error(), "batch flush");
            goto out_stream;
        }
        mapping_device_stats(dev, &after);
        double transfers = (double)(after.h2d_copies - before.h2d_copies + after.d2h_copies - before.d2h_copies);
        /* The batch and its floor take turns, sample by sample: the ratio is
         * the median of each round's ratio. */
        double tb[64], tf[64], tr[64], floor_s = NAN, over_floor = NAN;
        int runs = ctx->runs < 64 ? ctx->runs : 64;
        if (run_batch(&j) != 0)
            goto out_stream;
        for (int r = 0; r < runs; r++) {
            double t0 = bench_now();
            if (run_batch(&j) != 0)
                goto out_stream;
            tb[r] = bench_now() - t0;
            tf[r] = floor ? bench_floor_sample(floor, j.to_gpu) : NAN;
            tr[r] = tb[r] / tf[r];
        }
        double lo[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN}, hi[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
        lo[0] = hi[0] = tb[0] * 1e3;
        for (int r = 1; r < runs; r++) {
            lo[0] = tb[r] * 1e3 < lo[0] ? tb[r] * 1e3 : lo[0];
            hi[0] = tb[r] * 1e3 > hi[0] ? tb[r] * 1e3 : hi[0];
        }
        double batch = bench_median(tb, runs);
        if (floor) {
            floor_s = bench_median(tf, runs);
            over_floor = bench_median(tr, runs);
        }
        double blocking = timed(ctx, run_singles, &j);
        lo[1] = ctx->last_min * 1e3, hi[1] = ctx->last_max * 1e3;
        j.stream = stream;
        double nonblocking = timed(ctx, run_singles, &j);
        lo[2] = ctx->last_min * 1e3, hi[2] = ctx->last_max * 1e3;
        double v[8] = {batch * 1e3, blocking * 1e3, nonblocking * 1e3, blocking / batch, nonblocking / batch,
                       transfers, floor_s * 1e3, over_floor};
        ratios[4 + dir] = over_floor;
        ratios[6 + dir] = blocking / (double)n;
        char label[48];
        snprintf(label, sizeof label, "%s %s", name, j.to_gpu ? "H2D" : "D2H");
        bench_table_row_range(t, label, 0, v, lo, hi);
        ratios[2 * dir] = v[3];
        ratios[2 * dir + 1] = v[4];
    }
    rc = 0;
out_stream:
    bench_floor_close(floor);
    free(offsets);
    mapping_stream_destroy(stream);
out:
    mapping_batch_destroy(j.batch);
    mapping_free_gpu(j.buf);
    free(j.host);
    return rc;
}

/* The same host-to-device batch with its copies added in a random order
 * (the flush then sorts them) and in offset order, taking turns; returns the
 * median of each pair's ratio, NAN on failure. */
static double shuffled_vs_ordered(bench_ctx *ctx, mapping_device *dev, size_t n)
{
    batch_job j = {.dev = dev, .n = n, .to_gpu = 1};
    size_t *order = malloc(n * sizeof *order);
    double ratio = NAN;
    j.host = malloc(n * COPY);
    if (!order || !j.host || bench_check(mapping_allocate_gpu(dev, n * STRIDE, &j.buf), "allocate_gpu") ||
        bench_check(mapping_batch_create(dev, &j.batch), "batch_create"))
        goto out;
    memset(j.host, 7, n * COPY);
    unsigned long long x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates, xorshift */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t k = (size_t)(x % (i + 1)), t = order[i];
        order[i] = order[k], order[k] = t;
    }
    double tr[64];
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    for (int r = -1; r < runs; r++) { /* r = -1: warm-up */
        j.order = order;
        double t0 = bench_now();
        if (run_batch(&j) != 0)
            goto out;
        double t1 = bench_now();
        j.order = NULL;
        if (run_batch(&j) != 0)
            goto out;
        if (r >= 0)
            tr[r] = (t1 - t0) / (bench_now() - t1);
    }
    ratio = bench_median(tr, runs);
out:
    mapping_batch_destroy(j.batch);
    mapping_free_gpu(j.buf);
    free(j.host);
    free(order);
    return ratio;
}

BENCH_SECTION(bench_batch, 40, "batch",
              "10,000 scattered 64-byte copies: one batch vs single blocking and non-blocking copies")
{
    size_t n = 10000, n_link = ctx->quick ? 1000 : 10000;
    static const char *const cols[] = {"batch ms", "blocking ms", "stream ms", "blocking/b", "stream/b",
                                       "transfers", "floor ms", "batch/floor"};
    bench_table t;
    bench_table_begin(ctx, &t, "batch",
                      "Scattered 64-byte copies (stride 192 B, pageable host memory): one batch (add + flush) "
                      "vs the same copies one by one; transfers = driver transfers of one batch",
                      "device", 2, 8, cols);
    double r[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN}, rl[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    const double link_bandwidth = 25e9, link_latency = 5e-6;
    char name[32];
    snprintf(name, sizeof name, "%s %zuk", ctx->info.backend, n / 1000);
    if (measure_device(ctx, &t, ctx->dev, name, n, r) != 0)
        return 1;
    if (!strcmp(ctx->info.backend, "host")) {
        mapping_device *link = NULL;
        mapping_device_desc desc = {.backend = "host", .link_bandwidth = link_bandwidth, .link_latency = link_latency};
        if (bench_check(mapping_open(&desc, &link), "open host with link model"))
            return 1;
        snprintf(name, sizeof name, "link %zuk", n_link / 1000);
        int rc = measure_device(ctx, &t, link, name, n_link, rl);
        mapping_close(link);
        if (rc)
            return 1;
    }
    bench_table_end(&t);
    bench_note(ctx, "batch = the copies added to one batch, then one blocking flush; one batch reused by every run "
                    "(its staging kept), as a program would.");
    bench_note(ctx, "stream = the copies queued on one stream, then one synchronize.");
    bench_note(ctx, "floor = one contiguous blocking copy of the same bytes from page-locked memory%s; batch/floor: "
                    "the median of each round's ratio (batch and floor take turns).",
                    bench_floor_extra(ctx->info.backend));
    bench_figure(ctx, "batch_h2d_vs_floor", r[4], "x", "batch / floor, H2D (target <= 2)");
    bench_figure(ctx, "batch_d2h_vs_floor", r[5], "x", "batch / floor, D2H (target <= 2)");
    if (!isnan(rl[4])) {
        bench_figure(ctx, "batch_link_h2d_vs_floor", rl[4], "x", "link model: batch / floor, H2D (target <= 1.5)");
        bench_figure(ctx, "batch_link_d2h_vs_floor", rl[5], "x", "link model: batch / floor, D2H (target <= 1.5)");
        /* How true the model is: one blocking 64 B copy against the time
         * modelled for it (a sleep that ends late made this 3-5x). */
        double modelled = link_latency + COPY / link_bandwidth;
        bench_figure(ctx, "link_single_vs_model", (rl[6] > rl[7] ? rl[6] : rl[7]) / modelled, "x",
                     "link model: a blocking 64 B copy / its modelled time, the slower direction");
    }
    if (!strcmp(ctx->info.backend, "host"))
        bench_note(ctx, "link = host back end with the link modelled at 25 GB/s and 5 us per transfer%s.",
                   ctx->quick ? " (--quick: 1,000 copies)" : "");
    double shuffled = shuffled_vs_ordered(ctx, ctx->dev, n);
    if (!isnan(shuffled)) {
        bench_figure(ctx, "batch_shuffled_vs_ordered", shuffled, "x",
                     "batch added in random order / in offset order, H2D");
        bench_note(ctx, "random order: the same %zu copies added shuffled, so the flush sorts them (a radix sort "
                        "of the copies' keys); taking turns with the ordered batch, median of the pairs' ratios.", n);
    }
    bench_figure(ctx, "batch_h2d_vs_blocking", r[0], "x", "batch vs blocking singles, H2D");
    bench_figure(ctx, "batch_h2d_vs_stream", r[1], "x", "batch vs non-blocking singles, H2D");
    bench_figure(ctx, "batch_d2h_vs_blocking", r[2], "x", "batch vs blocking singles, D2H");
    bench_figure(ctx, "batch_d2h_vs_stream", r[3], "x", "batch vs non-blocking singles, D2H");
    if (!isnan(rl[0])) {
        bench_figure(ctx, "batch_link_h2d_vs_blocking", rl[0], "x", "link model: batch vs blocking, H2D");
        bench_figure(ctx, "batch_link_h2d_vs_stream", rl[1], "x", "link model: batch vs non-blocking, H2D");
        bench_figure(ctx, "batch_link_d2h_vs_blocking", rl[2], "x", "link model: batch vs blocking, D2H");
        bench_figure(ctx, "batch_link_d2h_vs_stream", rl[3], "x", "link model: batch vs non-blocking, D2H");
    }
    return 0;
}
