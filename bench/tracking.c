/*
 * Write-tracking mirrors (MAPPING_MIRROR_TRACK_WRITES) against the same
 * work with explicit marks, all measured in this run, on the host back end
 * with a PCIe-like link model (25 GB/s, 5 us), where a sync's cost is what
 * a GPU's would be:
 *   1. 1 byte written in a 1 GiB mirror, then a sync: time and bytes
 *      (targets: <= 2x the marked sync, <= one page)
 *   2. 1,000 scattered 64-byte writes in 256 MiB, then a sync (targets:
 *      <= 3x the marked workload, <= 1,000 pages)
 *   3. sync of a clean tracked 1 GiB mirror (target <= 2 us)
 *   4. a streaming write (memset) of the whole mirror, tracked / untracked
 *      (target <= 1.3): every page's first write faults once
 * The mechanism is the process's (MAPPING_TRACK=uffd|mprotect picks one;
 * run the section once per mechanism). --quick: 64 MiB mirrors.
 * Also the cost of MAPPING_CHECK=races per async round trip, and the
 * device-side diff (tracking_diff.c), on the device benchmarked (run once
 * with each variable and once without).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"

typedef struct track_pair {
    mapping_device *dev;
    mapping_mirror *tracked, *marked;
    size_t          size;
} track_pair;

static uint64_t h2d_bytes(mapping_device *dev)
{
    mapping_stats s;
    return mapping_device_stats(dev, &s) == MAPPING_OK ? s.h2d_bytes : 0;
}

static int median_of(double *v, int n, double *out)
{
    *out = bench_median(v, n);
    return 0;
}

/* One byte per run, a page apart from the last. */
static int one_byte(bench_ctx *ctx, track_pair *p, mapping_mirror *m, int mark, double *seconds, double *bytes)
{
    double t[64];
    int runs = ctx->runs < 64 ? ctx->runs * 4 : 64;
    unsigned char *cpu = mapping_mirror_cpu(m);
    uint64_t before = h2d_bytes(p->dev);
    for (int r = 0; r < runs; r++) {
        size_t at = ((size_t)r * 40961 + 7) % p->size;
        double t0 = bench_now();
        cpu[at]++;
        if ((mark && bench_check(mapping_mirror_mark_cpu_modified(m, at, 1), "mark")) ||
            bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
            return 1;
        t[r] = bench_now() - t0;
    }
    *bytes = (double)(h2d_bytes(p->dev) - before) / runs;
    return median_of(t, runs, seconds);
}

static int scattered(bench_ctx *ctx, track_pair *p, mapping_mirror *m, size_t span, int mark, double *seconds,
                     double *bytes)
{
    double t[32];
    int runs = ctx->runs < 32 ? ctx->runs : 32;
    unsigned char *cpu = mapping_mirror_cpu(m);
    uint64_t before = h2d_bytes(p->dev);
    unsigned long long x = 0x2545F4914F6CDD1Dull;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now();
        for (int i = 0; i < 1000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t at = (size_t)(x % (span / 64)) * 64;
            memset(cpu + at, r + i, 64);
            if (mark && bench_check(mapping_mirror_mark_cpu_modified(m, at, 64), "mark"))
                return 1;
        }
        if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
            return 1;
        t[r] = bench_now() - t0;
    }
    *bytes = (double)(h2d_bytes(p->dev) - before) / runs;
    return median_of(t, runs, seconds);
}

static int clean_sync(bench_ctx *ctx, mapping_mirror *m, double *seconds)
{
    if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
        return 1;
    double t[64];
    int runs = ctx->runs < 16 ? ctx->runs * 4 : 64;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now();
        if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
            return 1;
        t[r] = bench_now() - t0;
    }
    return median_of(t, runs, seconds);
}

/* The memset alone is timed; the sync after it (not timed) protects the
 * pages again for the next run. *first: the slower of the first two runs
 * (uffd opens the run at the second sync that finds it written: those two
 * fault on every page). At least 3 runs. */
static int streaming(bench_ctx *ctx, mapping_mirror *m, size_t size, double *seconds, double *first)
{
    double t[16];
    int runs = ctx->runs < 3 ? 3 : ctx->runs < 16 ? ctx->runs : 16;
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (int r = 0; r < runs; r++) {
        if (bench_check(mapping_mirror_mark_cpu_modified(m, 0, size), "mark") ||
            bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
            return 1;
        double t0 = bench_now();
        memset(cpu, r + 1, size);
        t[r] = bench_now() - t0;
    }
    if (first)
        *first = t[0] > t[1] ? t[0] : t[1];
    return median_of(t, runs, seconds);
}

/* After the streams stop: 1-byte writes, a sync each; how many syncs
 * moved more than a page (uffd: the open run, until it closes) and the
 * bytes they moved in all. */
static int after_streams(track_pair *p, mapping_mirror *m, double *syncs, double *bytes)
{
    unsigned char *cpu = mapping_mirror_cpu(m);
    size_t page = 0;
    mapping_write_tracking(&page);
    *syncs = 0;
    *bytes = 0;
    if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync")) /* the last memset's pages */
        return 1;
    for (int k = 0; k < 8; k++) {
        uint64_t before = h2d_bytes(p->dev);
        cpu[((size_t)k + 1) * 40961 % p->size]++; /* off the sample pages (every 2 MiB): a write there keeps a run open */
        if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "sync"))
            return 1;
        uint64_t moved = h2d_bytes(p->dev) - before;
        if (moved > page) {
            *syncs += 1;
            *bytes += (double)moved;
        }
    }
    return 0;
}

/* MAPPING_CHECK=races: an async 64 KiB upload and download on a stream,
 * then a synchronize; the checker is on or off for the whole process, so
 * the two figures come from two runs (with and without the variable). */
typedef struct async_job {
    mapping_stream *stream;
    mapping_buffer *buf;
    unsigned char  *host;
} async_job;

static int do_async_round_trip(void *arg)
{
    async_job *j = arg;
    return mapping_sync_to_gpu_range(j->stream, j->host, j->buf, 0, 64 << 10) != MAPPING_OK ||
           mapping_sync_to_cpu_range(j->stream, j->buf, 0, j->host + (64 << 10), 64 << 10) != MAPPING_OK ||
           mapping_stream_synchronize(j->stream) != MAPPING_OK;
}

static int race_check_cost(bench_ctx *ctx)
{
    const char *check = getenv("MAPPING_CHECK");
    int on = check && strstr(check, "races") != NULL;
    async_job j = {0};
    int rc = 1;
    if (bench_check(mapping_stream_create(ctx->dev, &j.stream), "stream") ||
        bench_check(mapping_allocate_gpu(ctx->dev, 64 << 10, &j.buf), "buffer") ||
        bench_check(mapping_allocate_cpu(ctx->dev, 128 << 10, (void **)&j.host), "host memory"))
        goto done;
    double t = bench_time(ctx, 200, do_async_round_trip, &j);
    bench_figure(ctx, on ? "races_check_on_async_round_trip_us" : "races_check_off_async_round_trip_us", t * 1e6, "us",
                 on ? "async 64 KiB upload + download + synchronize, MAPPING_CHECK=races on"
                    : "async 64 KiB upload + download + synchronize, MAPPING_CHECK=races off (run again with it on)");
    rc = 0;
done:
    mapping_free_cpu(ctx->dev, j.host);
    mapping_free_gpu(j.buf);
    mapping_stream_destroy(j.stream);
    return rc;
}

BENCH_SECTION(bench_tracking, 42, "tracking",
              "write-tracking mirrors (no marks) vs explicit marks: 1 byte, 1,000 scattered writes, clean sync, "
              "streaming-write overhead")
{
    size_t granularity = 0;
    mapping_track_mechanism mech = mapping_write_tracking(&granularity);
    fprintf(ctx->out, "\n== tracking: %s, granularity %zu B ==\n", mapping_write_tracking_description(), granularity);
    if (race_check_cost(ctx))
        return 1;
    if (bench_device_diff(ctx))
        return 1;
    if (mech == MAPPING_TRACK_NONE) {
        bench_note(ctx, "no write tracking in this process: the tracking figures are skipped");
        return 0;
    }
    track_pair p = {0};
    mapping_device_desc desc = {.backend = "host", .link_bandwidth = 25e9, .link_latency = 5e-6};
    if (bench_check(mapping_open(&desc, &p.dev), "open host with a link model"))
        return 1;
    size_t full = (size_t)1 << 30;
    p.size = ctx->quick ? (size_t)64 << 20 : full;
    size_t scatter_span = ctx->quick ? p.size : (size_t)256 << 20;
    int rc = 1;
    double one_t = NAN, one_m = NAN, one_tb = NAN, one_mb = NAN, sc_t = NAN, sc_m = NAN, sc_tb = NAN, sc_mb = NAN;
    double clean = NAN, clean_marked = NAN, st_t = NAN, st_u = NAN, st_f = NAN, st_first = NAN;
    double stop_syncs = NAN, stop_bytes = NAN;
    if (bench_check(mapping_mirror_create(p.dev, p.size, MAPPING_MIRROR_TRACK_WRITES, &p.tracked), "tracked mirror") ||
        bench_check(mapping_mirror_create(p.dev, p.size, 0, &p.marked), "mirror") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, p.tracked), "sync") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, p.marked), "sync"))
        goto done;
    /* The two take turns, so that neither always runs on warmer caches. */
    for (int turn = 0; turn < 2; turn++) {
        if (turn == 0 ? one_byte(ctx, &p, p.tracked, 0, &one_t, &one_tb) : one_byte(ctx, &p, p.marked, 1, &one_m, &one_mb))
            goto done;
    }
    for (int turn = 0; turn < 2; turn++) {
        if (turn == 0 ? scattered(ctx, &p, p.marked, scatter_span, 1, &sc_m, &sc_mb)
                      : scattered(ctx, &p, p.tracked, scatter_span, 0, &sc_t, &sc_tb))
            goto done;
    }
    if (clean_sync(ctx, p.tracked, &clean) || clean_sync(ctx, p.marked, &clean_marked) ||
        streaming(ctx, p.marked, p.size, &st_u, NULL) || streaming(ctx, p.tracked, p.size, &st_t, NULL))
        goto done;
    /* The streaming write once more on a fresh tracked mirror: the writes
     * above left the first one's memory in 4 KiB pages where it had huge
     * pages (an isolated write opens one page; with mprotect that splits
     * the huge page around it), and a program that only streams keeps them. */
    mapping_mirror_destroy(p.tracked);
    p.tracked = NULL;
    if (bench_check(mapping_mirror_create(p.dev, p.size, MAPPING_MIRROR_TRACK_WRITES, &p.tracked),
                    "tracked mirror") ||
        streaming(ctx, p.tracked, p.size, &st_f, &st_first) || after_streams(&p, p.tracked, &stop_syncs, &stop_bytes))
        goto done;
    bench_table t;
    static const char *const cols[] = {"tracked us", "marked us", "tracked/marked", "tracked B", "marked B"};
    bench_table_begin(ctx, &t, "tracking", "tracked (no marks) vs marked, host back end, link 25 GB/s 5 us", "workload",
                      2, 5, cols);
    char label[64], sz[32];
    snprintf(label, sizeof label, "1 byte in %s", bench_size_name(p.size, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){one_t * 1e6, one_m * 1e6, one_t / one_m, one_tb, one_mb});
    snprintf(label, sizeof label, "1,000 x 64 B in %s", bench_size_name(scatter_span, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){sc_t * 1e6, sc_m * 1e6, sc_t / sc_m, sc_tb, sc_mb});
    snprintf(label, sizeof label, "clean sync, %s", bench_size_name(p.size, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){clean * 1e6, clean_marked * 1e6, clean / clean_marked, 0, 0});
    snprintf(label, sizeof label, "memset of %s, fresh", bench_size_name(p.size, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){st_f * 1e6, st_u * 1e6, st_f / st_u, NAN, NAN});
    snprintf(label, sizeof label, "memset of %s, first two", bench_size_name(p.size, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){st_first * 1e6, st_u * 1e6, st_first / st_u, NAN, NAN});
    snprintf(label, sizeof label, "memset of %s, after the above", bench_size_name(p.size, sz, sizeof sz));
    bench_table_row(&t, label, (double[]){st_t * 1e6, st_u * 1e6, st_t / st_u, NAN, NAN});
    snprintf(label, sizeof label, "streams stop: 8 x (1 B + sync)");
    bench_table_row(&t, label, (double[]){NAN, NAN, NAN, stop_bytes, 8.0 * (double)granularity});
    bench_table_end(&t);
    bench_note(ctx, "The tracked mirror finds its written pages at each sync (%s); the marked one is told. Clean sync: "
                    "the tracked one still asks the kernel (uffd: one getrusage call; mprotect: one atomic read).",
               mech == MAPPING_TRACK_UFFD ? "PAGEMAP_SCAN over the pages the fault log names, or over the whole range"
                                          : "the SIGSEGV handler's bitmap");
    bench_note(ctx, "memset (timed alone; 'marked us': an untracked mirror): uffd faults once per page until a run "
                    "written in two periods in a row opens (MAPPING_TRACK_STREAMS), then on its sample pages only; "
                    "mprotect opens widening runs, on huge-page boundaries once they reach 2 MiB.");
    bench_note(ctx, "'fresh': a new tracked mirror, median of the runs; 'first two': the slower of its first two "
                    "(before a run opens); 'after the above': the mirror the isolated writes above left in 4 KiB "
                    "pages; 'streams stop': bytes the 8 syncs after the last memset moved beyond a page each "
                    "(the open run, until a sync finds fewer than half of its samples written), against 8 pages.");
    bench_figure(ctx, "tracking_one_byte_bytes", one_tb, "B", "bytes moved, 1 written byte, tracked (target <= 4096)");
    bench_figure(ctx, "tracking_one_byte_vs_marked", one_t / one_m, "x", "1 byte: tracked / marked sync (target <= 2)");
    bench_figure(ctx, "tracking_scattered_vs_marked", sc_t / sc_m, "x",
                 "1,000 scattered 64 B writes: tracked / marked (target <= 3)");
    bench_figure(ctx, "tracking_scattered_pages", sc_tb / (double)granularity, "pages",
                 "pages moved, 1,000 scattered writes, tracked (target <= 1000)");
    /* Not scaled by --quick: a clean sync asks the kernel once, whatever the
     * mirror's size, so a smaller mirror has the same bound. */
    bench_figure(ctx, "tracking_clean_sync_us", clean * 1e6, "us", "clean sync of a tracked mirror (target <= 2)");
    bench_figure(ctx, "tracking_streaming_overhead", st_f / st_u, "x",
                 "memset of a fresh tracked mirror, tracked / untracked (target <= 1.3)");
    bench_figure(ctx, "tracking_streaming_overhead_after_isolated_writes", st_t / st_u, "x",
                 "memset of the mirror the isolated writes used, tracked / untracked");
    bench_figure(ctx, "tracking_streaming_first_two", st_first / st_u, "x",
                 "memset of a fresh tracked mirror, the slower of the first two, tracked / untracked");
    bench_figure(ctx, "tracking_stream_stop_syncs", stop_syncs, "syncs",
                 "after the streams stop, syncs of a 1-byte write that moved more than a page");
    rc = 0;
done:
    mapping_mirror_destroy(p.tracked);
    mapping_mirror_destroy(p.marked);
    mapping_close(p.dev);
    return rc;
}
