/*
 * Mirrors: what tracking stale ranges saves over a dirty-flag design (Kokkos
 * DualView, Caffe SyncedMemory), which copies the whole buffer whenever
 * anything changed. Every baseline is measured in the same run.
 *   1. sync of a clean 1 GiB mirror: time and bytes moved (target < 100 ns, 0 B)
 *   2. 1 byte modified in a 1 GiB mirror: mark + sync vs a whole-buffer copy
 *   3. 1,000 scattered 64-byte modifications in 256 MiB: mirror sync (merging
 *      neighbours by the link) vs a whole-buffer copy vs 1,000 single copies
 * --quick shrinks the mirrors (says so) to keep the CLI test short.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bench.h"
#include "floor.h"

typedef struct mirror_job {
    mapping_mirror *m;
    mapping_buffer *gpu;
    void           *cpu;
    size_t          size;
    size_t          next; /* byte to modify next */
    const size_t   *offsets;
    size_t          count, bytes;
} mirror_job;

static int do_clean_sync(void *arg)
{
    return mapping_mirror_sync_to_gpu(NULL, ((mirror_job *)arg)->m) != MAPPING_OK;
}

static int do_whole_copy(void *arg)
{
    mirror_job *j = arg;
    return mapping_sync_to_gpu_range(NULL, j->cpu, j->gpu, 0, j->size) != MAPPING_OK;
}

static int do_one_byte(void *arg)
{
    mirror_job *j = arg;
    unsigned char *cpu = j->cpu;
    j->next = (j->next + 4099) % j->size;
    cpu[j->next]++;
    return mapping_mirror_mark_cpu_modified(j->m, j->next, 1) != MAPPING_OK ||
           mapping_mirror_sync_to_gpu(NULL, j->m) != MAPPING_OK;
}

static int do_single_copies(void *arg)
{
    mirror_job *j = arg;
    for (size_t i = 0; i < j->count; i++)
        if (mapping_sync_to_gpu_range(NULL, (char *)j->cpu + j->offsets[i], j->gpu, j->offsets[i], j->bytes))
            return 1;
    return 0;
}

/* The program's own work before it marks: the CPU writes each edit (so
 * the edited bytes are in its cache, as in a real program). Not timed. */
static void edit_scattered(mirror_job *j)
{
    unsigned char *cpu = j->cpu;
    for (size_t i = 0; i < j->count; i++)
        memset(cpu + j->offsets[i], (int)(i + j->next++), j->bytes);
}

static int mark_scattered(mirror_job *j)
{
    for (size_t i = 0; i < j->count; i++)
        if (mapping_mirror_mark_cpu_modified(j->m, j->offsets[i], j->bytes) != MAPPING_OK)
            return 1;
    return 0;
}

static uint64_t h2d_bytes(mapping_device *dev, uint64_t *copies)
{
    mapping_stats s;
    mapping_device_stats(dev, &s);
    if (copies)
        *copies = s.h2d_copies;
    return s.h2d_bytes;
}

static double time_once(bench_ctx *ctx, int (*fn)(void *), void *arg, double target)
{
    double t0 = bench_now();
    if (fn(arg) != 0)
        return NAN;
    return bench_time(ctx, bench_reps_for(bench_now() - t0, target), fn, arg);
}

/* 1 and 2: the 1 GiB mirror. */
static int clean_and_one_byte(bench_ctx *ctx, size_t size)
{
    mapping_mirror *m = NULL;
    char name[32];
    if (bench_check(mapping_mirror_create(ctx->dev, size, 0, &m), "mirror_create"))
        return 1;
    mirror_job j = {m, mapping_mirror_gpu(m), mapping_mirror_cpu(m), size, 0, NULL, 0, 0};
    int rc = 1;
    if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "first sync"))
        goto out;

    uint64_t before = h2d_bytes(ctx->dev, NULL);
    double clean = time_once(ctx, do_clean_sync, &j, ctx->quick ? 0.005 : 0.05);
    double clean_lo = ctx->last_min, clean_hi = ctx->last_max;
    uint64_t clean_moved = h2d_bytes(ctx->dev, NULL) - before;
    double whole = time_once(ctx, do_whole_copy, &j, ctx->quick ? 0.01 : 0.2);
    double whole_lo = ctx->last_min, whole_hi = ctx->last_max;

    uint64_t copies0, copies1;
    before = h2d_bytes(ctx->dev, &copies0);
    double one = time_once(ctx, do_one_byte, &j, ctx->quick ? 0.005 : 0.05);
    double one_lo = ctx->last_min, one_hi = ctx->last_max;
    uint64_t moved = h2d_bytes(ctx->dev, &copies1) - before;
    double per_sync = copies1 > copies0 ? (double)moved / (double)(copies1 - copies0) : NAN;

    static const char *const cols[] = {"median ns", "bytes moved", "vs whole copy"};
    bench_table t;
    char title[128];
    snprintf(title, sizeof title, "Mirror of %s: clean sync and 1 modified byte (blocking)",
             bench_size_name(size, name, sizeof name));
    bench_table_begin(ctx, &t, "mirror_sync", title, "case", 1, 3, cols);
    bench_table_row_range(&t, "sync, clean mirror", 0, (double[]){clean * 1e9, (double)clean_moved, whole / clean},
                          (double[]){clean_lo * 1e9, NAN, NAN}, (double[]){clean_hi * 1e9, NAN, NAN});
    bench_table_row_range(&t, "mark 1 B + sync", 0, (double[]){one * 1e9, per_sync, whole / one},
                          (double[]){one_lo * 1e9, NAN, NAN}, (double[]){one_hi * 1e9, NAN, NAN});
    bench_table_row_range(&t, "whole-buffer copy (dirty flag)", 0, (double[]){whole * 1e9, (double)size, 1},
                          (double[]){whole_lo * 1e9, NAN, NAN}, (double[]){whole_hi * 1e9, NAN, NAN});
    bench_table_end(&t);
    bench_note(ctx, "Marking is exact to the byte: 1 modified byte moves 1 byte.");
    bench_figure(ctx, "mirror_clean_sync_ns", clean * 1e9, "ns", "sync of a clean mirror (target < 100 ns)");
    bench_figure(ctx, "mirror_clean_sync_bytes", (double)clean_moved, "B", "bytes moved by clean syncs (target 0)");
    bench_figure(ctx, "mirror_one_byte_bytes", per_sync, "B", "bytes moved per sync, 1 byte modified (target <= 4096)");
    /* The whole copy's cost grows with the mirror: the target is for 1 GiB. */
    bench_figure_sized(ctx, "mirror_one_byte_speedup", whole / one, "x",
                       "whole-buffer copy / (mark 1 B + sync) (target >= 10000)", size, (size_t)1 << 30);
    rc = 0;
out:
    mapping_mirror_destroy(m);
    return rc;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The batch a careful programmer would write for the same ranges: one
 * batch, reused, each range added, one blocking flush. */
static int careful_batch(mirror_job *j, mapping_batch *b)
{
    for (size_t i = 0; i < j->count; i++)
        if (mapping_batch_add_to_gpu(b, (char *)j->cpu + j->offsets[i], j->gpu, j->offsets[i], j->bytes) != MAPPING_OK)
            return 1;
    return mapping_batch_flush(NULL, b) != MAPPING_OK;
}

/* The median of per-round ratios whose two contenders took turns going
 * first (rounds k and k + 1, k even, in opposite orders). Going first after the
 * whole copy means colder caches, so the rounds fall in two groups and a
 * plain median lands in either: each pair of rounds (one of each order)
 * gives one ratio, their geometric mean, and the median is over the pairs. */
static double order_free_median(double *ratio, int runs)
{
    if (runs < 2)
        return bench_median(ratio, runs);
    double pairs[32];
    int n = 0;
    for (int k = 0; k + 1 < runs && n < 32; k += 2)
        pairs[n++] = sqrt(ratio[k] * ratio[k + 1]);
    return bench_median(pairs, n);
}

/* 3: scattered modifications, on one device. Returns a table row, and in
 * vs[] the row of the floor table. */
static int scattered_row(bench_ctx *ctx, mapping_device *dev, size_t size, double *row, double *vs)
{
    enum { COUNT = 1000, BYTES = 64 };
    static size_t offsets[COUNT];
    unsigned long long r = 88172645463325252ull;
    for (size_t i = 0; i < COUNT; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        offsets[i] = (size_t)(r % (size / BYTES)) * BYTES;
    }
    qsort(offsets, COUNT, sizeof offsets[0], cmp_size);
    mapping_mirror *m = NULL;
    mapping_batch *batch = NULL;
    bench_floor *floor = NULL;
    if (bench_check(mapping_mirror_create(dev, size, 0, &m), "mirror_create"))
        return 1;
    mirror_job j = {m, mapping_mirror_gpu(m), mapping_mirror_cpu(m), size, 0, offsets, COUNT, BYTES};
    int rc = 1;
    mapping_link link;
    if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "first sync") ||
        bench_check(mapping_device_link(dev, &link), "device_link"))
        goto out;
    /* Each run times one whole copy, one mirror sync (after marking) and
     * one round of single copies; a whole copy precedes each of the last
     * two, so both start from the same cache state. */
    double ts[64], tw[64], t1[64], tms[64], tb[64], tf[64], rf[64], rb[64];
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    batch = NULL;
    floor = bench_floor_open(dev, j.count * j.bytes);
    bench_floor_scatter(floor, j.gpu, offsets, COUNT, BYTES);
    if (bench_check(mapping_batch_create(dev, &batch), "batch_create") || careful_batch(&j, batch))
        goto out;
    uint64_t copies0 = 0, copies1 = 0, bytes0 = 0, bytes1 = 0;
    for (int k = 0; k < runs; k++) {
        double t0 = bench_now();
        if (do_whole_copy(&j))
            goto out;
        tw[k] = bench_now() - t0;
        if (mark_scattered(&j))
            goto out;
        bytes0 = h2d_bytes(dev, &copies0);
        t0 = bench_now();
        if (bench_check(mapping_mirror_sync_to_gpu(NULL, m), "mirror sync"))
            goto out;
        ts[k] = bench_now() - t0;
        bytes1 = h2d_bytes(dev, &copies1);
        if (do_whole_copy(&j)) /* untimed: the single copies start from the same cache state */
            goto out;
        t0 = bench_now();
        if (do_single_copies(&j))
            goto out;
        t1[k] = bench_now() - t0;
        /* The edits marked one by one and one sync, against the careful
         * batch and the floor, in turns: each round one order of the three,
         * all six in turn, so each goes first (its scatter finds the
         * destinations colder: 25-30 us more on the host back end) as
         * often as the others, and rounds k and k + 1 swap the mirror and
         * the batch (order_free_median). Each follows the CPU's edits. */
        static const char orders[6][3] = {{'m', 'b', 'f'}, {'b', 'm', 'f'}, {'f', 'm', 'b'},
                                          {'f', 'b', 'm'}, {'m', 'f', 'b'}, {'b', 'f', 'm'}};
        tf[k] = NAN;
        for (int turn = 0; turn < 3; turn++) {
            char who = orders[k % 6][turn];
            edit_scattered(&j);
            t0 = bench_now();
            if (who == 'm') {
                if (mark_scattered(&j) || mapping_mirror_sync_to_gpu(NULL, m) != MAPPING_OK)
                    goto out;
                tms[k] = bench_now() - t0;
            } else if (who == 'b') {
                if (careful_batch(&j, batch))
                    goto out;
                tb[k] = bench_now() - t0;
            } else if (floor) {
                tf[k] = bench_floor_sample(floor, 1);
            }
        }
        rf[k] = tms[k] / tf[k];
        rb[k] = tms[k] / tb[k];
    }
    vs[0] = bench_median(tms, runs) * 1e6;
    vs[1] = bench_median(tb, runs) * 1e6;
    vs[2] = floor ? bench_median(tf, runs) * 1e6 : NAN;
    vs[3] = floor ? order_free_median(rf, runs) : NAN;
    vs[4] = order_free_median(rb, runs);
    double sync = bench_median(ts, runs), whole = bench_median(tw, runs), singles = bench_median(t1, runs);
    row[0] = sync * 1e6;
    row[1] = whole * 1e6;
    row[2] = singles * 1e6;
    row[3] = (double)(copies1 - copies0);
    row[4] = (double)(bytes1 - bytes0);
    row[5] = whole / sync;
    row[6] = singles / sync;
    row[7] = link.latency * 1e6;
    row[8] = link.bandwidth * 1e-9;
    rc = 0;
out:
    bench_floor_close(floor);
    mapping_batch_destroy(batch);
    mapping_mirror_destroy(m);
    return rc;
}

static int scattered(bench_ctx *ctx, size_t size)
{
    static const char *const cols[] = {"mirror us", "whole us", "1000 copies us", "copies", "bytes",
                                       "whole/mirror", "singles/mirror", "link lat us", "link GB/s"};
    char name[32], title[160];
    snprintf(title, sizeof title, "1,000 scattered 64-byte modifications in a %s mirror: one sync vs the baselines",
             bench_size_name(size, name, sizeof name));
    bench_table t;
    double row[9], vs[2][5] = {{NAN, NAN, NAN, NAN, NAN}, {NAN, NAN, NAN, NAN, NAN}};
    bench_table_begin(ctx, &t, "mirror_scattered", title, "device", 2, 9, cols);
    if (scattered_row(ctx, ctx->dev, size, row, vs[0]))
        return 1;
    bench_table_row(&t, ctx->info.backend, row);
    double speed_whole = row[5], speed_single = row[6], link_whole = NAN, link_single = NAN;
    /* On the host back end, also over a modelled PCIe-like link, where the
     * per-transfer latency makes merging pay. */
    if (strcmp(ctx->info.backend, "host") == 0) {
        mapping_device *pcie = NULL;
        mapping_device_desc desc = {.backend = "host", .link_bandwidth = 25e9, .link_latency = 5e-6};
        if (!bench_check(mapping_open(&desc, &pcie), "open host with a link model")) {
            if (scattered_row(ctx, pcie, size, row, vs[1]) == 0) {
                bench_table_row(&t, "host, link 25 GB/s 5 us", row);
                link_whole = row[5];
                link_single = row[6];
            }
            mapping_close(pcie);
        }
    }
    bench_table_end(&t);
    bench_note(ctx, "Below 16 stale ranges, two ranges become one copy when gap / link bandwidth < link latency "
                    "(the link as mapping_device_link measured it on that device); from 16 on, the sync packs them "
                    "into one staged transfer and a device-side scatter (copies = driver transfers).");
    static const char *const vcols[] = {"marks+sync us", "batch us", "floor us", "m+s/floor", "m+s/batch"};
    bench_table_begin(ctx, &t, "mirror_scattered_floor",
                      "The same 1,000 edits marked one by one + one sync, against the batch a careful programmer "
                      "would write (add each range, one flush) and the floor",
                      "device", 2, 5, vcols);
    bench_table_row(&t, ctx->info.backend, vs[0]);
    if (!isnan(vs[1][0]))
        bench_table_row(&t, "host, link 25 GB/s 5 us", vs[1]);
    bench_table_end(&t);
    bench_note(ctx, "before the marks, the batch and the floor, the CPU writes the 1,000 edits (not timed), as a "
                    "program does before it marks them: the edited bytes are in its cache, as are the floor's. The "
                    "three take turns in all six orders, round by round: whoever goes first finds the destinations "
                    "colder.");
    bench_note(ctx, "floor = one contiguous blocking copy of the 64,000 bytes from page-locked memory%s; ratios: the "
                    "median over pairs of rounds (one with the mirror before the batch, one with the batch before "
                    "the mirror; the floor at the same place in both) of the geometric mean of the pair's two "
                    "ratios.",
                    bench_floor_extra(ctx->info.backend));
    bench_figure(ctx, "mirror_scattered_vs_floor", vs[0][3], "x", "(marks + sync) / floor (target <= 2)");
    bench_figure(ctx, "mirror_scattered_vs_batch", vs[0][4], "x", "(marks + sync) / careful batch (target <= 1.1)");
    if (!isnan(vs[1][0])) {
        bench_figure(ctx, "mirror_scattered_link_vs_floor", vs[1][3], "x", "link model: (marks + sync) / floor (target <= 1.5)");
        bench_figure(ctx, "mirror_scattered_link_vs_batch", vs[1][4], "x", "link model: (marks + sync) / careful batch");
    }
    bench_figure(ctx, "mirror_scattered_vs_whole", speed_whole, "x", "whole-buffer copy / mirror sync (target > 1)");
    bench_figure(ctx, "mirror_scattered_vs_singles", speed_single, "x", "1,000 single copies / mirror sync (target > 1)");
    if (!isnan(link_whole)) {
        bench_figure(ctx, "mirror_scattered_link_vs_whole", link_whole, "x", "modelled link: whole copy / mirror sync");
        bench_figure(ctx, "mirror_scattered_link_vs_singles", link_single, "x",
                     "modelled link: 1,000 single copies / mirror sync");
    }
    return 0;
}

BENCH_SECTION(bench_mirror, 40, "mirror",
              "mirror syncs: clean 1 GiB, 1 byte in 1 GiB, 1,000 scattered ranges in 256 MiB, vs whole copies")
{
    size_t big = ctx->quick ? (size_t)64 << 20 : (size_t)1 << 30;
    size_t mid = ctx->quick ? (size_t)16 << 20 : (size_t)256 << 20;
    if (ctx->quick)
        bench_note(ctx, "--quick: mirrors shrunk to 64 MiB (instead of 1 GiB) and 16 MiB (instead of 256 MiB)");
    if (clean_and_one_byte(ctx, big))
        return 1;
    return scattered(ctx, mid);
}
