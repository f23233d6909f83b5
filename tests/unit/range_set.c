/* The range set against a plain array of flags, one per byte. */
#include <stdlib.h>
#include <string.h>
#include "coherence/range_set.h"
#include "harness.h"

static unsigned long long rng_next(unsigned long long *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static unsigned test_seed(unsigned fallback)
{
    const char *env = getenv("MAPPING_TEST_SEED");
    return env && *env ? (unsigned)strtoul(env, NULL, 0) : fallback;
}

/* Bytes [lo, hi) of the set equal the flags, and walking the set with the
 * cursor gives the flags' runs in order. */
static void check_window(const mapping_range_set *s, const unsigned char *flags, size_t lo, size_t hi)
{
    mapping_rs_cursor c;
    mapping_range r;
    bool ok = mapping__rs_seek(s, lo, &c, &r);
    for (size_t i = lo; i < hi; i++) {
        while (ok && r.hi <= i) {
            size_t prev_hi = r.hi;
            ok = mapping__rs_next(&c, &r);
            if (ok && r.lo <= prev_hi)
                test_fail(__FILE__, __LINE__, "cursor: [%zu, ...) follows an interval ending at %zu", r.lo, prev_hi);
        }
        int in = ok && r.lo <= i;
        if (in != flags[i])
            test_fail(__FILE__, __LINE__, "byte %zu: set says %d, model says %d", i, in, flags[i]);
    }
}

static void check_against_flags(const mapping_range_set *s, const unsigned char *flags, size_t n)
{
    CHECK(mapping__rs_valid(s));
    check_window(s, flags, 0, n);
    size_t total = 0, runs = 0;
    for (size_t i = 0; i < n; i++) {
        total += flags[i];
        runs += flags[i] && (i == 0 || !flags[i - 1]);
    }
    CHECK(s->total == total);
    CHECK(mapping__rs_count(s) == runs);
}

UNIT_TEST(range_set_matches_a_byte_flag_model_over_random_adds_and_removes)
{
    enum { N = 512, STEPS = 4000 };
    unsigned seed = test_seed(20261202u);
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    unsigned long long r = seed ? seed : 1;
    unsigned char flags[N] = {0};
    mapping_range_set s;
    mapping__rs_init(&s);
    for (int step = 0; step < STEPS; step++) {
        size_t lo = rng_next(&r) % N, len = 1 + rng_next(&r) % (rng_next(&r) % 4 ? 16 : N / 2);
        size_t hi = lo + len > N ? N : lo + len;
        int add = (int)(rng_next(&r) % 2);
        /* Queries before the change. */
        size_t expect = 0;
        int any = 0;
        for (size_t i = lo; i < hi; i++) {
            expect += flags[i];
            any |= flags[i];
        }
        CHECK(mapping__rs_bytes_in(&s, lo, hi) == expect);
        CHECK(mapping__rs_intersects(&s, lo, hi) == (any != 0));
        CHECK_OK(add ? mapping__rs_add(&s, lo, hi) : mapping__rs_remove(&s, lo, hi));
        memset(flags + lo, add, hi - lo);
        check_against_flags(&s, flags, N);
    }
    mapping__rs_free(&s);
}

UNIT_TEST(range_set_memory_is_proportional_to_the_number_of_ranges)
{
    mapping_range_set s;
    mapping__rs_init(&s);
    CHECK(mapping__rs_memory(&s) == 0);
    /* 1,000 ranges spread over a terabyte-sized space: memory for 1,000 ranges
     * (at most 64 bytes each, however they arrive), not for the space. */
    for (size_t i = 0; i < 1000; i++)
        CHECK_OK(mapping__rs_add(&s, i << 30, (i << 30) + 64));
    size_t thousand = mapping__rs_memory(&s);
    printf("1,000 ranges: %zu bytes\n", thousand);
    CHECK(mapping__rs_count(&s) == 1000 && thousand <= 64 * 1000 && s.total == 64000);
    CHECK(mapping__rs_valid(&s));
    /* Adjacent ranges merge: one interval covers everything, and the nodes
     * freed go back once the pool is trimmed. */
    CHECK_OK(mapping__rs_add(&s, 0, (size_t)1000 << 30));
    CHECK(mapping__rs_count(&s) == 1 && s.total == (size_t)1000 << 30);
    CHECK_OK(mapping__rs_reserve(&s, 0));
    CHECK(mapping__rs_memory(&s) <= thousand / 4);
    /* A removal in the middle splits in two. */
    CHECK_OK(mapping__rs_remove(&s, 100, 200));
    mapping_rs_cursor c;
    mapping_range r;
    CHECK(mapping__rs_seek(&s, 0, &c, &r) && r.lo == 0 && r.hi == 100);
    CHECK(mapping__rs_next(&c, &r) && r.lo == 200 && r.hi == (size_t)1000 << 30);
    CHECK(!mapping__rs_next(&c, &r));
    /* Empty ranges change nothing. */
    CHECK_OK(mapping__rs_add(&s, 5, 5));
    CHECK_OK(mapping__rs_remove(&s, 7, 7));
    CHECK(mapping__rs_count(&s) == 2 && mapping__rs_valid(&s));
    mapping__rs_free(&s);
    CHECK(mapping__rs_memory(&s) == 0);
}

UNIT_TEST(range_set_ranges_added_in_order_fill_their_nodes)
{
    /* Marks often arrive in address order; a full leaf appended to shares
     * with its left sibling instead of leaving half-empty leaves behind. */
    mapping_range_set s;
    mapping__rs_init(&s);
    for (size_t i = 0; i < 100000; i++)
        CHECK_OK(mapping__rs_add(&s, 10 * i, 10 * i + 5));
    CHECK_OK(mapping__rs_reserve(&s, 0));
    size_t bytes = mapping__rs_memory(&s);
    printf("100,000 ranges added in order: %zu bytes (%.1f per range)\n", bytes, (double)bytes / 100000);
    CHECK(mapping__rs_valid(&s) && bytes <= (size_t)20 * 100000);
    mapping__rs_free(&s);
}

UNIT_TEST(range_set_adjacent_ranges_merge_into_one)
{
    mapping_range_set s;
    mapping__rs_init(&s);
    CHECK_OK(mapping__rs_add(&s, 10, 20));
    CHECK_OK(mapping__rs_add(&s, 30, 40));
    CHECK_OK(mapping__rs_add(&s, 20, 30));
    mapping_rs_cursor c;
    mapping_range r;
    CHECK(mapping__rs_count(&s) == 1 && s.total == 30);
    CHECK(mapping__rs_seek(&s, 0, &c, &r) && r.lo == 10 && r.hi == 40);
    CHECK(!mapping__rs_intersects(&s, 0, 10) && !mapping__rs_intersects(&s, 40, 50));
    CHECK(mapping__rs_intersects(&s, 39, 40));
    mapping__rs_free(&s);
}

UNIT_TEST(range_set_seek_finds_the_first_range_ending_past_a_position)
{
    mapping_range_set s;
    mapping__rs_init(&s);
    /* 10,000 ranges [10k, 10k + 5): enough for several levels. */
    for (size_t k = 0; k < 10000; k++)
        CHECK_OK(mapping__rs_add(&s, 10 * k, 10 * k + 5));
    CHECK(mapping__rs_valid(&s));
    mapping_rs_cursor c;
    mapping_range r;
    for (size_t pos = 0; pos < 100000; pos += 7) {
        size_t k = pos % 10 < 5 ? pos / 10 : pos / 10 + 1; /* inside, or the next one */
        bool found = mapping__rs_seek(&s, pos, &c, &r);
        CHECK(found == (k < 10000));
        if (found)
            CHECK(r.lo == 10 * k && r.hi == 10 * k + 5);
    }
    /* A range's own end is not in it. */
    CHECK(mapping__rs_seek(&s, 5, &c, &r) && r.lo == 10);
    /* Walking from the start visits every range once, in order. */
    size_t seen = 0;
    for (bool ok = mapping__rs_seek(&s, 0, &c, &r); ok; ok = mapping__rs_next(&c, &r)) {
        CHECK(r.lo == 10 * seen && r.hi == 10 * seen + 5);
        seen++;
    }
    CHECK(seen == 10000 && !mapping__rs_next(&c, &r));
    mapping__rs_free(&s);
}

UNIT_TEST(range_set_bulk_removal_matches_one_by_one_removal)
{
    enum { N = 2048, ROUNDS = 300 };
    unsigned seed = test_seed(7u);
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    unsigned long long r = seed ? seed : 1;
    unsigned char flags[N];
    for (int round = 0; round < ROUNDS; round++) {
        mapping_range_set s;
        mapping__rs_init(&s);
        memset(flags, 0, sizeof flags);
        for (int i = 0; i < 40; i++) { /* a random set */
            size_t lo = rng_next(&r) % N, hi = lo + 1 + rng_next(&r) % 100;
            hi = hi > N ? N : hi;
            CHECK_OK(mapping__rs_add(&s, lo, hi));
            memset(flags + lo, 1, hi - lo);
        }
        mapping_range cut[40]; /* sorted, disjoint ranges to remove */
        size_t k = 0, pos = rng_next(&r) % 50;
        while (k < 40 && pos < N) {
            size_t hi = pos + 1 + rng_next(&r) % 80;
            hi = hi > N ? N : hi;
            cut[k++] = (mapping_range){pos, hi};
            memset(flags + pos, 0, hi - pos);
            pos = hi + 1 + rng_next(&r) % 120;
        }
        CHECK_OK(mapping__rs_remove_sorted(&s, cut, k));
        check_against_flags(&s, flags, N);
        mapping__rs_free(&s);
    }
}

/* Sorted, disjoint ranges in [0, n) (some touching), also set/cleared in flags. */
static size_t random_sorted(unsigned long long *r, mapping_range *v, size_t cap, size_t n, size_t gap,
                            unsigned char *flags, unsigned char value)
{
    size_t k = 0, pos = rng_next(r) % gap;
    while (k < cap && pos < n) {
        size_t hi = pos + 1 + rng_next(r) % 24;
        hi = hi > n ? n : hi;
        v[k++] = (mapping_range){pos, hi};
        memset(flags + pos, value, hi - pos);
        pos = hi + rng_next(r) % gap;
    }
    return k;
}

/* Bulk union and difference, through single operations (few ranges) and
 * through a walk and rebuild (many ranges against the set's size). */
UNIT_TEST(range_set_bulk_add_and_removal_match_the_model_by_either_path)
{
    enum { N = 1 << 16, ROUNDS = 60, CAP = 8192 };
    unsigned seed = test_seed(11u);
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    unsigned long long r = seed ? seed : 1;
    unsigned char *flags = calloc(N, 1);
    mapping_range *v = malloc(CAP * sizeof *v);
    CHECK(flags && v);
    mapping_range_set s;
    mapping__rs_init(&s);
    for (int round = 0; round < ROUNDS; round++) {
        size_t gap = (size_t)1 << (2 + rng_next(&r) % 12); /* from dense to sparse: both paths */
        size_t k = random_sorted(&r, v, CAP, N, gap, flags, 1);
        CHECK_OK(mapping__rs_add_sorted(&s, v, k));
        check_against_flags(&s, flags, N);
        gap = (size_t)1 << (2 + rng_next(&r) % 12);
        k = random_sorted(&r, v, CAP, N, gap, flags, 0);
        CHECK_OK(mapping__rs_remove_sorted(&s, v, k));
        check_against_flags(&s, flags, N);
        if (rng_next(&r) % 8 == 0) { /* now and then from empty */
            mapping__rs_free(&s);
            memset(flags, 0, N);
        }
    }
    mapping__rs_free(&s);
    free(flags);
    free(v);
}

/* ---- large sets: splits, merges and redistribution at every level ---- */

enum { BIG_SLOTS = 100000, BIG_SLOT = 16, BIG_N = BIG_SLOTS * BIG_SLOT };

/* One random change of the big test: mostly a few bytes (new ranges, splits,
 * trims), now and then one over hundreds or thousands of ranges (bulk merges
 * and deletions). */
static void big_step(mapping_range_set *s, unsigned char *flags, unsigned long long *r, int add_bias, int wide,
                     size_t *lo_out, size_t *hi_out)
{
    size_t roll = rng_next(r) % 1000;
    size_t len = roll < (wide ? 700u : 970u)  ? 1 + rng_next(r) % 6
                 : roll < (wide ? 950u : 998u) ? 1 + rng_next(r) % 2000
                                               : 1 + rng_next(r) % 100000;
    /* [end - len, end) clipped to the space: every byte equally likely, the ends too. */
    size_t end = 1 + rng_next(r) % (BIG_N + len - 1);
    size_t lo = end > len ? end - len : 0, hi = end < BIG_N ? end : BIG_N;
    int add = (int)(rng_next(r) % 100) < add_bias;
    CHECK_OK(add ? mapping__rs_add(s, lo, hi) : mapping__rs_remove(s, lo, hi));
    memset(flags + lo, add, hi - lo);
    *lo_out = lo;
    *hi_out = hi;
}

UNIT_TEST(range_set_with_100k_ranges_matches_the_model_through_growth_churn_and_shrinking)
{
    unsigned seed = test_seed(5u);
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    unsigned long long r = seed ? seed : 1;
    unsigned char *flags = calloc(BIG_N, 1);
    size_t *order = malloc(BIG_SLOTS * sizeof *order);
    CHECK(flags && order);
    mapping_range_set s;
    mapping__rs_init(&s);
    /* Growth: 100k disjoint ranges (one per 16-byte slot, random offset and
     * width, gaps of at least one byte) in random order. */
    for (size_t i = 0; i < BIG_SLOTS; i++)
        order[i] = i;
    for (size_t i = BIG_SLOTS - 1; i > 0; i--) {
        size_t j = rng_next(&r) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < BIG_SLOTS; i++) {
        size_t lo = order[i] * BIG_SLOT + 1 + rng_next(&r) % 4, hi = lo + 1 + rng_next(&r) % 10;
        CHECK_OK(mapping__rs_add(&s, lo, hi));
        memset(flags + lo, 1, hi - lo);
        if (i % 20000 == 0)
            CHECK(mapping__rs_valid(&s));
    }
    CHECK(mapping__rs_count(&s) == BIG_SLOTS);
    check_against_flags(&s, flags, BIG_N);
    printf("100k ranges: %zu bytes (%.1f per range)\n", mapping__rs_memory(&s),
           (double)mapping__rs_memory(&s) / BIG_SLOTS);
    CHECK(mapping__rs_memory(&s) <= (size_t)64 * BIG_SLOTS);

    /* Churn: thousands of random changes, each checked around where it
     * happened; every invariant and every byte now and then. */
    for (int step = 0; step < 6000; step++) {
        size_t lo, hi;
        big_step(&s, flags, &r, 50, 0, &lo, &hi);
        size_t a = lo > 64 ? lo - 64 : 0, b = hi + 64 < BIG_N ? hi + 64 : BIG_N;
        check_window(&s, flags, a, b);
        if (step % 1500 == 0) {
            check_against_flags(&s, flags, BIG_N);
            printf("step %d: %zu ranges, %u levels\n", step, mapping__rs_count(&s), s.levels);
        }
        else if (step % 50 == 0)
            CHECK(mapping__rs_valid(&s));
    }
    check_against_flags(&s, flags, BIG_N);

    /* Shrinking: mostly removals until the set is empty (merges up to the
     * root), then memory goes back. */
    for (int step = 0; mapping__rs_count(&s) > 0; step++) {
        size_t lo, hi;
        CHECK(step < 100000);
        big_step(&s, flags, &r, step < 2000 ? 10 : 0, 1, &lo, &hi);
        if (step % 25 == 0)
            CHECK(mapping__rs_valid(&s));
        if (step % 1000 == 0)
            printf("shrinking, step %d: %zu ranges, %u levels\n", step, mapping__rs_count(&s), s.levels);
    }
    check_against_flags(&s, flags, BIG_N);
    CHECK_OK(mapping__rs_reserve(&s, 0));
    CHECK(mapping__rs_memory(&s) <= (size_t)16 << 10);
    mapping__rs_free(&s);
    free(order);
    free(flags);
}

UNIT_TEST(range_set_changes_after_a_reservation_allocate_nothing)
{
    /* The contract callers rely on for all-or-nothing steps: after
     * reserve(extra), `extra` adds/removes (each creating at most one
     * interval) neither allocate nor free, so they cannot fail. */
    unsigned seed = test_seed(11u);
    printf("seed %u (replay with MAPPING_TEST_SEED=%u)\n", seed, seed);
    unsigned long long r = seed ? seed : 1;
    for (int round = 0; round < 60; round++) {
        mapping_range_set s;
        mapping__rs_init(&s);
        size_t space = 64 + rng_next(&r) % (1u << 20), n = rng_next(&r) % 20000;
        for (size_t i = 0; i < n; i++) {
            size_t lo = rng_next(&r) % space;
            CHECK_OK(mapping__rs_add(&s, lo, lo + 1 + rng_next(&r) % 8));
        }
        size_t extra = rng_next(&r) % (round % 2 ? 4 : 2000);
        CHECK_OK(mapping__rs_reserve(&s, extra));
        size_t before = mapping__rs_memory(&s);
        for (size_t i = 0; i < extra; i++) {
            size_t lo = rng_next(&r) % space, hi = lo + 1 + rng_next(&r) % 6;
            CHECK_OK(rng_next(&r) % 2 ? mapping__rs_add(&s, lo, hi) : mapping__rs_remove(&s, lo, hi));
            if (mapping__rs_memory(&s) != before)
                test_fail(__FILE__, __LINE__, "round %d: change %zu of %zu reserved allocated", round, i, extra);
        }
        CHECK(mapping__rs_valid(&s));
        mapping__rs_free(&s);
    }
}
