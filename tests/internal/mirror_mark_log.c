/* Mirrors: marks of one side are logged and applied at the next reader of
 * the range sets; the sets and the data must be exactly what marking one by
 * one makes, whatever the order, overlaps and size of the log. */
#include <stdlib.h>
#include <string.h>
#include "testing/test_hooks.h"
#include "harness.h"

static unsigned long long next_random(unsigned long long *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The set equals the byte flags. */
static void check_set(const mapping_range_set *s, const unsigned char *flags, size_t n)
{
    CHECK(mapping__rs_valid(s));
    size_t runs = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += flags[i];
        runs += flags[i] && (i == 0 || !flags[i - 1]);
        if (flags[i] != (mapping__rs_bytes_in(s, i, i + 1) == 1))
            CHECK(!"a byte of the set differs from the model");
    }
    CHECK(mapping__rs_count(s) == runs && mapping__rs_bytes_in(s, 0, n) == bytes);
}

TEST(logged_marks_in_random_order_leave_the_sets_marking_one_by_one_would)
{
    enum { SIZE = 1 << 18, ROUNDS = 6 };
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, SIZE, 0, 3);
    unsigned char *stale_gpu = calloc(SIZE, 1), *stale_cpu = calloc(SIZE, 1);
    unsigned char *cpu = mapping_mirror_cpu(m);
    CHECK(stale_gpu && stale_cpu);
    unsigned long long r = 12345;
    for (int round = 0; round < ROUNDS; round++) {
        /* From a few marks (insertion sort) to thousands (radix sort, rebuilt trees). */
        size_t marks = round % 2 ? 20000 : 8 + (size_t)round * 5;
        for (size_t k = 0; k < marks; k++) {
            size_t lo = next_random(&r) % SIZE, len = 1 + next_random(&r) % 40;
            size_t hi = lo + len > SIZE ? SIZE : lo + len;
            for (size_t i = lo; i < hi; i++) {
                cpu[i] = (unsigned char)(round * 31 + k);
                stale_gpu[i] = 1;
                stale_cpu[i] = 0;
            }
            CHECK_OK(mapping_mirror_mark_cpu_modified(m, lo, hi - lo));
        }
        check_set(mapping__test_mirror_stale(m, MAPPING_GPU), stale_gpu, SIZE);
        check_set(mapping__test_mirror_modified(m, MAPPING_CPU), stale_gpu, SIZE);
        check_set(mapping__test_mirror_stale(m, MAPPING_CPU), stale_cpu, SIZE);
        if (round == 2) { /* a mark of the other side flushes the log, then conflicts */
            size_t lo = 0;
            while (lo < SIZE && !stale_gpu[lo])
                lo++;
            CHECK(lo < SIZE);
            CHECK(mapping_mirror_mark_gpu_modified(m, lo, 1) == MAPPING_ERR_CONFLICT);
        }
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
        memset(stale_gpu, 0, SIZE);
        test_check_mirror_sides_equal(m);
    }
    free(stale_gpu);
    free(stale_cpu);
    mapping_mirror_destroy(m);
}

TEST(a_logged_mark_is_synced_even_with_copies_queued)
{
    mapping_device *dev = test_device();
    mapping_stream *s;
    CHECK_OK(mapping_stream_create(dev, &s));
    mapping_mirror *m = test_synced_mirror(dev, 1 << 16, 0, 5);
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = 0; i < 100; i++) { /* logged */
        cpu[i * 600] ^= 0x5a;
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 600, 1));
    }
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m)); /* queued: the next marks take the slow way */
    for (size_t i = 0; i < 100; i++) {
        /* Mark first: the mark waits for the queued copy, which may read these
         * bytes (merged gaps); host memory a queued copy reads must not be
         * written until the stream reaches it (mapping.h). */
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, i * 600 + 7, 1));
        cpu[i * 600 + 7] ^= 0x33;
    }
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 100);
    CHECK_OK(mapping_mirror_sync_to_gpu(s, m));
    CHECK_OK(mapping_stream_synchronize(s));
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
    test_check_mirror_sides_equal(m);
    mapping_mirror_destroy(m);
    mapping_stream_destroy(s);
}

TEST(a_blocking_sync_straight_after_logged_marks_copies_exactly_them)
{
    enum { SIZE = 1 << 18 };
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, SIZE, 0, 4);
    unsigned char *cpu = mapping_mirror_cpu(m);
    unsigned long long r = 777;
    for (int round = 0; round < 4; round++) {
        size_t marks = round % 2 ? 3000 : 10, bytes = 0;
        unsigned char *hit = calloc(SIZE, 1);
        CHECK(hit != NULL);
        for (size_t k = 0; k < marks; k++) {
            size_t lo = next_random(&r) % (SIZE - 64), len = 1 + next_random(&r) % 64;
            for (size_t i = lo; i < lo + len; i++) {
                cpu[i] = (unsigned char)(k + round);
                bytes += !hit[i];
                hit[i] = 1;
            }
            CHECK_OK(mapping_mirror_mark_cpu_modified(m, lo, len));
        }
        if (round == 3) { /* a view's sync goes the usual way, then the rest */
            mapping_mirror *view;
            CHECK_OK(mapping_mirror_view(m, SIZE / 2, SIZE / 2, &view));
            CHECK_OK(mapping_mirror_sync_to_gpu(NULL, view));
            mapping_mirror_destroy(view);
        }
        mapping_stats before = test_stats(dev);
        CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m)); /* straight after the marks: the log is not applied first */
        mapping_stats after = test_stats(dev);
        if (round != 3)
            CHECK(after.sync_skipped_bytes - before.sync_skipped_bytes <= SIZE - bytes);
        CHECK(mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_GPU)) == 0);
        CHECK(mapping__rs_count(mapping__test_mirror_modified(m, MAPPING_CPU)) == 0);
        CHECK(mapping__rs_count(mapping__test_mirror_stale(m, MAPPING_CPU)) == 0);
        CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 0);
        test_check_mirror_sides_equal(m);
        free(hit);
    }
    mapping_mirror_destroy(m);
}

/* Marks a random range of at most max_len bytes on the CPU side and in the model. */
static void mark_random(mapping_mirror *m, unsigned char *stale_gpu, size_t size, size_t max_len,
                        unsigned long long *r)
{
    size_t lo = next_random(r) % size, len = 1 + next_random(r) % max_len;
    size_t hi = lo + len > size ? size : lo + len;
    unsigned char *cpu = mapping_mirror_cpu(m);
    for (size_t i = lo; i < hi; i++) {
        cpu[i] = (unsigned char)(i * 7 + *r);
        stale_gpu[i] = 1;
    }
    CHECK_OK(mapping_mirror_mark_cpu_modified(m, lo, hi - lo));
}

static size_t runs_of(const unsigned char *flags, size_t n)
{
    size_t runs = 0;
    for (size_t i = 0; i < n; i++)
        runs += flags[i] && (i == 0 || !flags[i - 1]);
    return runs;
}

/* A log past 131,072 marks is compacted each time it doubles (sorted and
 * merged in place, the trees untouched); one whose ranges the trees already
 * outnumber four to one is applied instead. Either way the sets end exactly
 * as marking one by one makes them, and the log stays within twice the
 * ranges it names. */
TEST(a_long_log_is_compacted_and_the_sets_stay_exact)
{
    enum { SIZE = 1 << 20, COMPACT_FROM = 1 << 17 }; /* MIRROR_LOG_MIN_COMPACT */
    mapping_device *dev = test_device();
    mapping_mirror *m = test_synced_mirror(dev, SIZE, 0, 9);
    unsigned char *stale_gpu = calloc(SIZE, 1), *none = calloc(SIZE, 1);
    CHECK(stale_gpu && none);
    unsigned long long r = 4242;

    /* 1. 300,000 random marks on a clean mirror: compactions at 131,072
     * and 262,144 marks, with overlaps and repeats across them. */
    for (size_t k = 0; k < 300000; k++)
        mark_random(m, stale_gpu, SIZE, 8, &r);
    size_t runs = runs_of(stale_gpu, SIZE);
    CHECK(mapping__test_mirror_logged(m) <= 2 * (runs > COMPACT_FROM ? runs : COMPACT_FROM) + 1);
    CHECK(mapping__test_mirror_logged(m) < 300000);
    check_set(mapping__test_mirror_stale(m, MAPPING_GPU), stale_gpu, SIZE);
    check_set(mapping__test_mirror_modified(m, MAPPING_CPU), stale_gpu, SIZE);
    check_set(mapping__test_mirror_stale(m, MAPPING_CPU), none, SIZE);
    CHECK(mapping__test_mirror_logged(m) == 0);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    memset(stale_gpu, 0, SIZE);

    /* 2. The same 1,000 ranges marked again and again, never two neighbours
     * in a row: 200,000 marks, which compactions keep to a log of 1,000. */
    for (size_t k = 0; k < 200000; k++) {
        size_t slot = (k * 617) % 1000, lo = slot * 1000;
        stale_gpu[lo] = stale_gpu[lo + 1] = 1;
        CHECK_OK(mapping_mirror_mark_cpu_modified(m, lo, 2));
    }
    CHECK(mapping__test_mirror_logged(m) <= COMPACT_FROM + 1);
    check_set(mapping__test_mirror_modified(m, MAPPING_CPU), stale_gpu, SIZE);
    CHECK(mapping_mirror_stale_bytes(m, MAPPING_GPU) == 2000);

    /* 3. With those 1,000 ranges in the trees, 200,000 more random marks: the
     * log outgrows four times the trees' ranges and is applied part-way. */
    for (size_t k = 0; k < 200000; k++)
        mark_random(m, stale_gpu, SIZE, 3, &r);
    CHECK(mapping__test_mirror_logged(m) <= 200000 - COMPACT_FROM); /* applied at COMPACT_FROM marks */
    check_set(mapping__test_mirror_stale(m, MAPPING_GPU), stale_gpu, SIZE);
    check_set(mapping__test_mirror_modified(m, MAPPING_CPU), stale_gpu, SIZE);
    check_set(mapping__test_mirror_stale(m, MAPPING_CPU), none, SIZE);
    CHECK_OK(mapping_mirror_sync_to_gpu(NULL, m));
    test_check_mirror_sides_equal(m);
    free(stale_gpu);
    free(none);
    mapping_mirror_destroy(m);
}
