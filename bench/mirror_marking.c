/*
 * Marking a mirror that already holds many modified ranges: the per-mark
 * time must grow like log n (the range sets are B+ trees), not like n (a
 * sorted array moves its tail on every insertion). Measured through the
 * public API on mirrors holding 1,000 / 100,000 / 1,000,000 disjoint
 * modified ranges, with a sorted array of the same ranges as the baseline
 * in the same run (the storage the sets had before; a mark inserted into
 * two of them).
 *   - new range: a mark that creates a range (both sets it touches grow)
 *   - grow a range: a mark adjacent to an existing range (it merges)
 * --quick stops at 100,000 ranges (says so).
 */
#include <stdlib.h>
#include <string.h>
#include "bench.h"

enum { SLOT = 16 }; /* range i lives in [SLOT i, SLOT i + 4) */

/* Slot k of a fixed pseudo-random order of 0..n-1 (a full cycle: the
 * multiplier is odd and not a multiple of 5, n a power of ten). */
static size_t slot_of(size_t k, size_t n)
{
    return (size_t)(((unsigned long long)k * 2654435761ull + 12345u) % n);
}

typedef struct sorted_array { /* the baseline: the old storage */
    size_t (*v)[2];
    size_t n;
} sorted_array;

static void array_insert(sorted_array *a, size_t lo, size_t hi)
{
    size_t l = 0, r = a->n;
    while (l < r) {
        size_t mid = l + (r - l) / 2;
        if (a->v[mid][1] > lo)
            r = mid;
        else
            l = mid + 1;
    }
    memmove(a->v + l + 1, a->v + l, (a->n - l) * sizeof *a->v);
    a->v[l][0] = lo;
    a->v[l][1] = hi;
    a->n++;
}

typedef struct marking_job {
    mapping_mirror *m;
    sorted_array    a;
    size_t          n, added; /* ranges the mirror was built with; marks since (the array grows too) */
} marking_job;

/* A mirror (and an array) holding n ranges [SLOT i, SLOT i + 4), GPU side
 * valid elsewhere. */
static int build(bench_ctx *ctx, marking_job *j)
{
    mapping_mirror_destroy(j->m);
    j->m = NULL;
    j->a.n = 0;
    j->added = 0;
    if (bench_check(mapping_mirror_create(ctx->dev, j->n * SLOT, 0, &j->m), "mirror_create") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, j->m), "first sync"))
        return 1;
    for (size_t i = 0; i < j->n; i++) { /* ascending: cheap for both designs */
        if (bench_check(mapping_mirror_mark_cpu_modified(j->m, i * SLOT, 4), "mark"))
            return 1;
        j->a.v[i][0] = i * SLOT;
        j->a.v[i][1] = i * SLOT + 4;
    }
    j->a.n = j->n;
    return 0;
}

/* Seconds per mark of `per` marks of `bytes` at SLOT s + at, for the slots
 * s = slot(k0), slot(k0 + 1), ... */
static double time_marks(marking_job *j, size_t per, size_t k0, size_t (*slot)(size_t, size_t), size_t at,
                         size_t bytes)
{
    double t0 = bench_now();
    for (size_t q = 0; q < per; q++)
        if (mapping_mirror_mark_cpu_modified(j->m, slot(k0 + q, j->n) * SLOT + at, bytes) != MAPPING_OK)
            return -1;
    /* A query applies whatever the marks left for later (a mark log): the
     * marks' share of it is part of their cost. */
    if (mapping_mirror_stale_bytes(j->m, MAPPING_GPU) == 0)
        return -1;
    return (bench_now() - t0) / (double)per;
}

static size_t slot_in_order(size_t k, size_t n)
{
    return k % n;
}

/* Median seconds per operation at n ranges: row[0] mark creating a range at
 * a random slot, row[1] mark growing a range at a random slot, row[2] mark
 * creating a range next to the previous one (cache warm), row[3] insertion
 * into the sorted array at a random slot. */
static int marking_row(bench_ctx *ctx, size_t n, double *row)
{
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    /* Marks per sample; the mirror is rebuilt before the marks would add
     * more than a tenth to its ranges. */
    size_t per = n / 10 < 100 ? 100 : n / 10 > 1000 ? 1000 : n / 10;
    marking_job j = {NULL, {malloc((n + n / 10 + per) * sizeof *j.a.v), 0}, n, 0};
    double t[4][64];
    int rc = 1;
    if (!j.a.v) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    /* Slot sequences: random new ranges from k = 0, grown ranges from n / 2,
     * in-order new ranges from n / 4 (each at its own offset in the slot,
     * none adjacent to another: [0, 4) base, [4, 6) grow, [8, 12) new, [13, 15) in order). */
    size_t k_new = 0, k_grow = n / 2, k_seq = n / 4;
    for (int r = 0; r < runs; r++) {
        if ((!j.m || (j.added + 3 * per) * 10 > n) && build(ctx, &j))
            goto out;
        t[0][r] = time_marks(&j, per, k_new, slot_of, 8, 4);
        t[1][r] = time_marks(&j, per, k_grow, slot_of, 4, 2);
        t[2][r] = time_marks(&j, per, k_seq, slot_in_order, 13, 2);
        if (t[0][r] < 0 || t[1][r] < 0 || t[2][r] < 0) {
            fprintf(stderr, "bench: mark failed: %s\n", mapping_last_error_message());
            goto out;
        }
        double t0 = bench_now();
        for (size_t q = 0; q < per; q++) {
            size_t lo = slot_of(k_new + q, n) * SLOT + 8;
            array_insert(&j.a, lo, lo + 4);
        }
        t[3][r] = (bench_now() - t0) / (double)per;
        k_new += per;
        k_grow += per;
        k_seq += per;
        j.added += 3 * per;
    }
    for (int c = 0; c < 4; c++)
        row[c] = bench_median(t[c], runs);
    rc = 0;
out:
    mapping_mirror_destroy(j.m);
    free(j.a.v);
    return rc;
}

/* Amortised marking: n marks at random places on a clean mirror of n slots
 * (AMORTISED_SLOT apart, so that no two stale ranges are close enough for
 * a sync to merge them: the sync moves exactly the n ranges), per mark.
 * Each round times two ways the marks reach the sets, and a baseline:
 *   - the marks, then a stale-bytes query (which applies what the marks
 *     logged to the range sets), then the sync: the worst case, a reader
 *     of the sets between marking and syncing;
 *   - the marks, then the sync straight away (as a program does);
 *   - the baseline: the same n ranges added to a batch in order, then its
 *     flush, of which only the flush is timed: moving those bytes, the work
 *     of the sync that is not the marks'.
 * The marks' share of the next sync is the second minus the baseline.
 * row: mark only, mark + apply, that sync per range, all of it per mark,
 * marks + sync, the flush, the share (all per mark). */
enum { AMORTISED_SLOT = 128 };

static int amortised_row(bench_ctx *ctx, size_t n, double *row)
{
    int runs = ctx->runs < 64 ? ctx->runs : 64;
    if (runs > 15 && n >= 1000000)
        runs = 15;
    mapping_mirror *m = NULL;
    mapping_batch *b = NULL;
    double tm[64], ta[64], ts[64], tms[64], tf[64], share[64];
    if (bench_check(mapping_mirror_create(ctx->dev, n * AMORTISED_SLOT, 0, &m), "mirror_create") ||
        bench_check(mapping_mirror_sync_to_gpu(NULL, m), "first sync") ||
        bench_check(mapping_batch_create(ctx->dev, &b), "batch_create"))
        goto fail;
    char *cpu = mapping_mirror_cpu(m);
    mapping_buffer *gpu = mapping_mirror_gpu(m);
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now();
        for (size_t k = 0; k < n; k++)
            if (mapping_mirror_mark_cpu_modified(m, slot_of(k, n) * AMORTISED_SLOT + 8, 4) != MAPPING_OK)
                goto fail;
        double t1 = bench_now();
        if (mapping_mirror_stale_bytes(m, MAPPING_GPU) != 4 * n)
            goto fail;
        double t2 = bench_now();
        if (mapping_mirror_sync_to_gpu(NULL, m) != MAPPING_OK)
            goto fail;
        double t3 = bench_now();
        for (size_t k = 0; k < n; k++)
            if (mapping_mirror_mark_cpu_modified(m, slot_of(k, n) * AMORTISED_SLOT + 8, 4) != MAPPING_OK)
                goto fail;
        if (mapping_mirror_sync_to_gpu(NULL, m) != MAPPING_OK)
            goto fail;
        double t4 = bench_now();
        for (size_t k = 0; k < n; k++) {
            size_t at = k * AMORTISED_SLOT + 8;
            if (mapping_batch_add_to_gpu(b, cpu + at, gpu, at, 4) != MAPPING_OK)
                goto fail;
        }
        double t5 = bench_now();
        if (mapping_batch_flush(NULL, b) != MAPPING_OK)
            goto fail;
        double t6 = bench_now();
        tm[r] = (t1 - t0) / (double)n;
        ta[r] = (t2 - t0) / (double)n;
        ts[r] = (t3 - t2) / (double)n;
        tms[r] = (t4 - t3) / (double)n;
        tf[r] = (t6 - t5) / (double)n;
        share[r] = tms[r] - tf[r];
    }
    row[0] = bench_median(tm, runs) * 1e9;
    row[1] = bench_median(ta, runs) * 1e9;
    row[2] = bench_median(ts, runs) * 1e9;
    row[3] = row[1] + row[2];
    row[4] = bench_median(tms, runs) * 1e9;
    row[5] = bench_median(tf, runs) * 1e9;
    row[6] = bench_median(share, runs) * 1e9;
    mapping_batch_destroy(b);
    mapping_mirror_destroy(m);
    return 0;
fail:
    fprintf(stderr, "bench: amortised marking failed: %s\n", mapping_last_error_message());
    mapping_batch_destroy(b);
    mapping_mirror_destroy(m);
    return 1;
}

static int amortised_table(bench_ctx *ctx, const size_t *ns)
{
    static const char *const cols[] = {"mark ns",       "mark+apply ns", "sync ns/range", "all ns/mark",
                                       "mark+sync ns",  "flush ns",      "share ns"};
    bench_table t;
    bench_table_begin(ctx, &t, "mirror_mark_amortised",
                      "Marking n ranges at random places on a clean mirror, then one sync (per mark)", "ranges", 1, 7,
                      cols);
    double worst_share = 0, worst_apply = 0;
    for (int i = 0; i < 3; i++) {
        double row[7];
        if (amortised_row(ctx, ns[i], row))
            return 1;
        char label[32];
        snprintf(label, sizeof label, "%zu", ns[i]);
        bench_table_row(&t, label, row);
        worst_apply = row[1] > worst_apply ? row[1] : worst_apply;
        worst_share = row[6] > worst_share ? row[6] : worst_share;
    }
    bench_table_end(&t);
    bench_note(ctx, "mark: the n marks alone; mark+apply: the marks and a stale-bytes query, which applies what the "
                    "marks logged to the range sets; sync ns/range: the blocking sync after that query; mark+sync: the "
                    "same marks, then the sync straight away; flush: a batch of the same n ranges, added in order (not "
                    "timed) and flushed (timed), the same bytes moved; share: mark+sync - flush, the marks plus their "
                    "share of the next sync. Slots are %d bytes apart: no two ranges merge into one copy.",
                    AMORTISED_SLOT);
    bench_figure(ctx, "mirror_mark_share_ns", worst_share, "ns",
                 "a mark at a random place plus its share of the next sync, worst n (target <= 20)");
    bench_figure(ctx, "mirror_mark_amortised_ns", worst_apply, "ns",
                 "a mark plus applying it to the sets (a stale-bytes query before the sync), worst n");
    return 0;
}

BENCH_SECTION(bench_mirror_marking, 41, "mirror_mark",
              "marking a mirror that holds 1e3 / 1e5 / 1e6 modified ranges: O(log n) vs a sorted array")
{
    static const size_t full[] = {1000, 100000, 1000000}, quick[] = {1000, 10000, 100000};
    const size_t *ns = ctx->quick ? quick : full;
    if (ctx->quick)
        bench_note(ctx, "--quick: up to 100,000 ranges (instead of 1,000,000)");
    static const char *const cols[] = {"new ns",      "grow ns",       "in order ns",  "array ns",
                                       "new vs 1e3", "in order vs 1e3", "array vs 1e3"};
    bench_table t;
    bench_table_begin(ctx, &t, "mirror_mark", "Per-mark time on a mirror already holding n disjoint modified ranges",
                      "ranges", 1, 7, cols);
    double base[4] = {0}, row[4];
    for (int i = 0; i < 3; i++) {
        if (marking_row(ctx, ns[i], row))
            return 1;
        if (i == 0)
            memcpy(base, row, sizeof base);
        char label[32];
        snprintf(label, sizeof label, "%zu", ns[i]);
        bench_table_row(&t, label,
                        (double[]){row[0] * 1e9, row[1] * 1e9, row[2] * 1e9, row[3] * 1e9, row[0] / base[0],
                                   row[2] / base[2], row[3] / base[3]});
    }
    bench_table_end(&t);
    bench_note(ctx, "Each sample ends with a stale-bytes query: the marks' share of applying what they logged is "
                    "in their time.");
    bench_note(ctx, "new: a mark creating a range at a random place; grow: a mark extending a range at a random "
                    "place; in order: a mark creating a range next to the previous one (the tree path is in cache, "
                    "so this isolates the O(log n) work from cache misses).");
    bench_note(ctx, "array: one insertion into one sorted array of 16-byte ranges, the storage before the B+ tree; "
                    "a mark inserted into two.");
    bench_figure(ctx, "mirror_mark_growth", row[0] / base[0], "x",
                 "per-mark time (new range, random place) at the largest n / at 1,000 ranges");
    bench_figure(ctx, "mirror_mark_in_order_growth", row[2] / base[2], "x",
                 "per-mark time (new range, in order) at the largest n / at 1,000 ranges");
    bench_figure(ctx, "mirror_mark_array_growth", row[3] / base[3], "x",
                 "sorted-array insertion at the largest n / at 1,000 ranges (the old design)");
    return amortised_table(ctx, ns);
}
