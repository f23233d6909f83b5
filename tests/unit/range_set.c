/* The range set against a plain array of flags, one per byte. */
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

static void check_against_flags(const mapping_range_set *s, const unsigned char *flags, size_t n)
{
    CHECK(mapping__rs_valid(s));
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = mapping__rs_lower(s, i);
        int in = k < s->n && s->v[k].lo <= i;
        if (in != flags[i])
            test_fail(__FILE__, __LINE__, "byte %zu: set says %d, model says %d", i, in, flags[i]);
        total += flags[i];
    }
    CHECK(s->total == total);
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
    /* 1,000 ranges spread over a terabyte-sized space: 1,000 entries. */
    for (size_t i = 0; i < 1000; i++)
        CHECK_OK(mapping__rs_add(&s, i << 30, (i << 30) + 64));
    CHECK(s.n == 1000 && s.cap < 4096 && s.total == 64000);
    /* Adjacent ranges merge: one entry covers everything. */
    CHECK_OK(mapping__rs_add(&s, 0, (size_t)1000 << 30));
    CHECK(s.n == 1 && s.total == (size_t)1000 << 30);
    /* A removal in the middle splits in two. */
    CHECK_OK(mapping__rs_remove(&s, 100, 200));
    CHECK(s.n == 2 && s.v[0].hi == 100 && s.v[1].lo == 200);
    /* Empty ranges change nothing. */
    CHECK_OK(mapping__rs_add(&s, 5, 5));
    CHECK_OK(mapping__rs_remove(&s, 7, 7));
    CHECK(s.n == 2 && mapping__rs_valid(&s));
    mapping__rs_free(&s);
}

UNIT_TEST(range_set_adjacent_ranges_merge_into_one)
{
    mapping_range_set s;
    mapping__rs_init(&s);
    CHECK_OK(mapping__rs_add(&s, 10, 20));
    CHECK_OK(mapping__rs_add(&s, 30, 40));
    CHECK_OK(mapping__rs_add(&s, 20, 30));
    CHECK(s.n == 1 && s.v[0].lo == 10 && s.v[0].hi == 40 && s.total == 30);
    CHECK(!mapping__rs_intersects(&s, 0, 10) && !mapping__rs_intersects(&s, 40, 50));
    CHECK(mapping__rs_intersects(&s, 39, 40));
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
