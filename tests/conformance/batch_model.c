/*
 * Batches against a byte model: seeded random rounds, each one batch of
 * 1..300 copies over 2 or 3 buffers (one round in eight 9 or 10: more
 * (direction, buffer) pairs than the plan's radix sort takes, so the flush
 * sorts them another way), both directions, mostly 1 B .. 2 KiB,
 * sometimes 64 KiB and more (which makes the flush plan groups and send
 * those straight through), with touching and overlapping ranges and ranges
 * a few bytes apart. The copies are added in plan order (host-to-device
 * first, then buffer by pointer, then offset: the one-pass flush), shuffled,
 * or in plan order with a few out-of-order copies at the end (the queue
 * turns unsorted late), and flushed blocking or on a stream. After each round every byte of the
 * buffers (read back) and of the host destinations is compared with the
 * model:
 * - host-to-device copies take effect in add order (the later of two
 *   overlapping ones wins), all before the device-to-host copies;
 * - a host byte that several device-to-host copies of one flush write holds
 *   the byte one of them read (the header leaves which one unspecified).
 *
 * Seeds are printed; MAPPING_TEST_SEED=<n> runs that one round alone.
 */
#include <stdint.h>
#include "harness.h"

enum {
    NBUF = 10,
    MANY_LANES = 17, /* (direction, buffer) pairs beyond the plan's radix sort */
    BUF_BYTES = 160 << 10,
    SRC_BYTES = 256 << 10,
    DST_BYTES = 256 << 10,
    MAX_COPIES = 300,
    LARGE = 64 << 10, /* the smallest copy the one-pass flush leaves to the general one */
    ROUNDS = 300
};

enum { ORDER_PLAN, ORDER_SHUFFLED, ORDER_LATE_UNSORTED, ORDER_KINDS };
static const char *const order_name[ORDER_KINDS] = {"plan order", "shuffled", "plan order, then unsorted"};

typedef struct copy {
    int    to_gpu, buf;
    size_t off, bytes, host; /* host: offset in src (to_gpu) or dst */
} copy;

typedef struct world {
    mapping_device *dev;
    mapping_stream *stream;
    mapping_batch  *batch;
    mapping_buffer *bufs[NBUF];
    int             rank[NBUF]; /* the buffers' places in pointer order */
    unsigned char  *dev_model[NBUF], *got;
    unsigned char  *src, *dst, *dst_model;
    unsigned char  *writers; /* per dst byte: how many device-to-host copies of the round write it */
    copy            copies[MAX_COPIES];
    size_t          n;
    unsigned long long rng;
    unsigned        seed;
    int             rounds_of[ORDER_KINDS][2]; /* per order: rounds with and without a large copy */
    int             stream_rounds;
    int             nbuf;             /* buffers this round uses: bufs[0, nbuf) */
    int             many_lanes_rounds; /* rounds with MANY_LANES pairs or more */
} world;

static unsigned long long rnd(world *w)
{
    return test_xorshift64(&w->rng);
}

static size_t below(world *w, size_t n)
{
    return (size_t)(rnd(w) % n);
}

#define FAIL_AT(w, ...)                                                                                      \
    do {                                                                                                     \
        fprintf(stderr, "seed %u (%zu copies): ", (w)->seed, (w)->n);                                        \
        test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                          \
    } while (0)

/* mapping__batch_in_order's order: direction (to the device first), buffer
 * pointer, offset. 0 when a may precede b. */
static int plan_after(const world *w, const copy *a, const copy *b)
{
    if (a->to_gpu != b->to_gpu)
        return b->to_gpu;
    if (a->buf != b->buf)
        return w->rank[a->buf] > w->rank[b->buf];
    return a->off > b->off;
}

static size_t copy_size(world *w, int large_round, int *larges)
{
    unsigned r = (unsigned)below(w, 16);
    if (r < 10)
        return 1 + below(w, 2048);
    if (r < 13)
        return 1 + below(w, 16);
    if (r < 15)
        return 2049 + below(w, 6144);
    if (large_round && *larges < 2) {
        ++*larges;
        return LARGE + below(w, 32 << 10);
    }
    return 1 + below(w, 64);
}

/* The round's copies, in generation order. */
static void generate(world *w, int large_round)
{
    size_t n = below(w, 4) == 0 ? 1 + below(w, 8) : 1 + below(w, MAX_COPIES);
    int nbuf = below(w, 8) == 0 ? NBUF - (int)below(w, 2) : 2 + (int)below(w, 2), larges = 0;
    w->nbuf = nbuf;
    unsigned bias = (unsigned)below(w, 3); /* 0: both directions alike; 1: mostly to the device; 2: mostly back */
    const copy *last[NBUF][2] = {{NULL}};
    const copy *last_d2h = NULL;
    for (size_t i = 0; i < n; i++) {
        copy *c = &w->copies[i];
        unsigned d = (unsigned)below(w, 8);
        c->to_gpu = bias == 0 ? (int)(d & 1) : bias == 1 ? d != 0 : d == 0;
        c->buf = (int)below(w, (size_t)nbuf);
        c->bytes = copy_size(w, large_round, &larges);
        const copy *prev = last[c->buf][c->to_gpu];
        unsigned how = (unsigned)below(w, 5);
        if (prev && how == 0)
            c->off = prev->off + prev->bytes; /* touching */
        else if (prev && how == 3)
            c->off = prev->off + prev->bytes + 1 + below(w, 8); /* a gap of a few bytes: not merged */
        else if (prev && how == 1)
            c->off = prev->off + below(w, prev->bytes); /* overlapping */
        else if (prev && how == 2 && prev->off >= c->bytes / 2)
            c->off = prev->off - c->bytes / 2; /* overlapping from below */
        else
            c->off = below(w, BUF_BYTES - c->bytes + 1);
        if (c->off + c->bytes > BUF_BYTES)
            c->off = BUF_BYTES - c->bytes;
        size_t room = (c->to_gpu ? SRC_BYTES : DST_BYTES) - c->bytes + 1;
        if (!c->to_gpu && last_d2h && below(w, 4) == 0) /* a destination overlapping the last one */
            c->host = last_d2h->host + below(w, last_d2h->bytes);
        else
            c->host = below(w, room);
        if (c->host >= room)
            c->host = room - 1;
        last[c->buf][c->to_gpu] = c;
        if (!c->to_gpu)
            last_d2h = c;
    }
    w->n = n;
}

/* Stable insertion sort into plan order (n <= 300). */
static void sort_plan(world *w)
{
    for (size_t i = 1; i < w->n; i++) {
        copy c = w->copies[i];
        size_t j = i;
        while (j > 0 && plan_after(w, &w->copies[j - 1], &c)) {
            w->copies[j] = w->copies[j - 1];
            j--;
        }
        w->copies[j] = c;
    }
}

static void arrange(world *w, int order)
{
    if (order == ORDER_SHUFFLED) {
        for (size_t i = w->n; i > 1; i--) {
            size_t j = below(w, i);
            copy t = w->copies[i - 1];
            w->copies[i - 1] = w->copies[j];
            w->copies[j] = t;
        }
        return;
    }
    sort_plan(w);
    if (order == ORDER_LATE_UNSORTED && w->n >= 2) { /* 1..3 early copies move to the end */
        size_t moves = 1 + below(w, 3);
        for (size_t k = 0; k < moves; k++) {
            size_t from = below(w, w->n / 2 + 1);
            copy t = w->copies[from];
            memmove(&w->copies[from], &w->copies[from + 1], (w->n - from - 1) * sizeof t);
            w->copies[w->n - 1] = t;
        }
    }
}

/* The bytes of d2h copy c as the device holds them after the round's
 * host-to-device copies (dev_model is already updated). */
static const unsigned char *d2h_bytes(world *w, const copy *c)
{
    return w->dev_model[c->buf] + c->off;
}

/* The first byte where a and b differ (they do). */
static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

static void check_round(world *w)
{
    for (int b = 0; b < w->nbuf; b++) { /* the others were not touched */
        CHECK_OK(mapping_sync_to_cpu(w->bufs[b], w->got));
        if (memcmp(w->got, w->dev_model[b], BUF_BYTES) != 0) {
            size_t i = first_difference(w->got, w->dev_model[b], BUF_BYTES);
            FAIL_AT(w, "buffer %d byte %zu is 0x%02x, the model says 0x%02x", b, i, w->got[i], w->dev_model[b][i]);
        }
    }
    /* A host byte several copies wrote holds what one of them read; then
     * the model takes it, and every byte must match. */
    for (size_t k = 0; k < w->n; k++) {
        const copy *c = &w->copies[k];
        if (c->to_gpu)
            continue;
        for (size_t i = c->host; i < c->host + c->bytes; i++) {
            if (w->writers[i] <= 1 || w->dst_model[i] == w->dst[i])
                continue;
            int found = 0;
            for (size_t j = 0; j < w->n && !found; j++) {
                const copy *d = &w->copies[j];
                found = !d->to_gpu && d->host <= i && i < d->host + d->bytes && d2h_bytes(w, d)[i - d->host] == w->dst[i];
            }
            if (!found)
                FAIL_AT(w, "host destination byte %zu (written by %d copies) is 0x%02x, which none of them read", i,
                        w->writers[i], w->dst[i]);
            w->dst_model[i] = w->dst[i];
        }
    }
    if (memcmp(w->dst, w->dst_model, DST_BYTES) != 0) {
        size_t i = first_difference(w->dst, w->dst_model, DST_BYTES);
        FAIL_AT(w, "host destination byte %zu is 0x%02x, the model says 0x%02x", i, w->dst[i], w->dst_model[i]);
    }
}

/* The round's source bytes: cheap to make (8 at a time), new every round. */
static void fill_sources(world *w)
{
    for (size_t i = 0; i < SRC_BYTES; i += 8) {
        unsigned long long x = rnd(w);
        memcpy(w->src + i, &x, 8);
    }
}

static void run_round(world *w, unsigned seed)
{
    w->seed = seed;
    w->rng = 0x9E3779B97F4A7C15ull ^ ((unsigned long long)seed * 0x2545F4914F6CDD1Dull);
    rnd(w);
    int large_round = below(w, 4) == 0;
    int order = (int)below(w, ORDER_KINDS);
    int on_stream = below(w, 3) == 0;
    generate(w, large_round);
    arrange(w, order);
    fill_sources(w);

    int h2d = 0, d2h = 0, has_large = 0;
    memset(w->writers, 0, DST_BYTES);
    for (size_t i = 0; i < w->n; i++) {
        const copy *c = &w->copies[i];
        has_large |= c->bytes >= LARGE;
        if (c->to_gpu) {
            h2d = 1;
            CHECK_OK(mapping_batch_add_to_gpu(w->batch, w->src + c->host, w->bufs[c->buf], c->off, c->bytes));
        } else {
            d2h = 1;
            CHECK_OK(mapping_batch_add_to_cpu(w->batch, w->bufs[c->buf], c->off, w->dst + c->host, c->bytes));
        }
    }
    CHECK(mapping_batch_count(w->batch) == w->n);

    /* The model: host-to-device copies in add order, then the reads. */
    for (size_t i = 0; i < w->n; i++) {
        const copy *c = &w->copies[i];
        if (c->to_gpu)
            memcpy(w->dev_model[c->buf] + c->off, w->src + c->host, c->bytes);
    }
    for (size_t i = 0; i < w->n; i++) {
        const copy *c = &w->copies[i];
        if (c->to_gpu)
            continue;
        memcpy(w->dst_model + c->host, d2h_bytes(w, c), c->bytes);
        for (size_t k = 0; k < c->bytes; k++)
            if (w->writers[c->host + k] < 255)
                w->writers[c->host + k]++;
    }

    mapping_stats before = test_stats(w->dev);
    CHECK_OK(mapping_batch_flush(on_stream ? w->stream : NULL, w->batch));
    if (on_stream)
        CHECK_OK(mapping_stream_synchronize(w->stream));
    mapping_stats after = test_stats(w->dev);
    if (mapping_batch_count(w->batch) != 0)
        FAIL_AT(w, "%zu copies still queued after a successful flush", mapping_batch_count(w->batch));
    if (after.batch_flushes - before.batch_flushes != 1)
        FAIL_AT(w, "the flush counted %llu flushes", (unsigned long long)(after.batch_flushes - before.batch_flushes));
    if (h2d && after.h2d_copies == before.h2d_copies)
        FAIL_AT(w, "host-to-device copies were flushed but h2d_copies did not move");
    if (d2h && after.d2h_copies == before.d2h_copies)
        FAIL_AT(w, "device-to-host copies were flushed but d2h_copies did not move");
    if (!d2h && after.d2h_copies != before.d2h_copies)
        FAIL_AT(w, "no device-to-host copy was queued but d2h_copies moved");
    check_round(w);
    w->rounds_of[order][has_large]++;
    w->stream_rounds += on_stream;
    int used[NBUF][2] = {{0}}, lanes = 0;
    for (size_t i = 0; i < w->n; i++) {
        const copy *c = &w->copies[i];
        lanes += !used[c->buf][c->to_gpu]++;
    }
    w->many_lanes_rounds += lanes >= MANY_LANES;
}

static void world_open(world *w)
{
    memset(w, 0, sizeof *w);
    w->dev = test_device();
    CHECK_OK(mapping_stream_create(w->dev, &w->stream));
    CHECK_OK(mapping_batch_create(w->dev, &w->batch));
    for (int b = 0; b < NBUF; b++) {
        CHECK_OK(mapping_allocate_gpu(w->dev, BUF_BYTES, &w->bufs[b]));
        CHECK((w->dev_model[b] = malloc(BUF_BYTES)) != NULL);
        test_pattern(w->dev_model[b], BUF_BYTES, 1000u + (unsigned)b);
        CHECK_OK(mapping_sync_to_gpu(w->dev_model[b], w->bufs[b]));
    }
    for (int b = 0; b < NBUF; b++)
        for (int o = 0; o < NBUF; o++)
            w->rank[b] += (uintptr_t)w->bufs[o] < (uintptr_t)w->bufs[b];
    CHECK((w->got = malloc(BUF_BYTES)) != NULL);
    CHECK((w->src = malloc(SRC_BYTES)) != NULL);
    CHECK((w->dst = malloc(DST_BYTES)) != NULL);
    CHECK((w->dst_model = malloc(DST_BYTES)) != NULL);
    CHECK((w->writers = malloc(DST_BYTES)) != NULL);
    test_pattern(w->dst, DST_BYTES, 999);
    memcpy(w->dst_model, w->dst, DST_BYTES);
}

static void world_close(world *w)
{
    mapping_batch_destroy(w->batch);
    mapping_stream_destroy(w->stream);
    for (int b = 0; b < NBUF; b++) {
        mapping_free_gpu(w->bufs[b]);
        free(w->dev_model[b]);
    }
    free(w->got);
    free(w->src);
    free(w->dst);
    free(w->dst_model);
    free(w->writers);
}

static void run_rounds(unsigned rounds)
{
    static world W; /* large: off the stack */
    world *w = &W;
    world_open(w);
    const char *env = getenv("MAPPING_TEST_SEED");
    if (env) {
        unsigned seed = (unsigned)strtoul(env, NULL, 10);
        printf("seed %u\n", seed);
        run_round(w, seed);
    } else {
        for (unsigned seed = 1; seed <= rounds; seed++)
            run_round(w, seed);
        /* The seeds are fixed: every kind of round must have come up. */
        for (int o = 0; o < ORDER_KINDS; o++) {
            printf("%s: %d rounds of small copies, %d with a large copy\n", order_name[o], w->rounds_of[o][0],
                   w->rounds_of[o][1]);
            CHECK(w->rounds_of[o][0] >= 3 && w->rounds_of[o][1] >= 1);
        }
        printf("%d rounds flushed on a stream, %d blocking (replay one with MAPPING_TEST_SEED=<1..%u>)\n",
               w->stream_rounds, (int)rounds - w->stream_rounds, rounds);
        CHECK(w->stream_rounds >= 5 && (int)rounds - w->stream_rounds >= 5);
        printf("%d rounds with %d or more (direction, buffer) pairs\n", w->many_lanes_rounds, MANY_LANES);
        CHECK(w->many_lanes_rounds >= 3);
    }
    world_close(w);
}

TEST(batch_matches_a_byte_model_over_random_rounds)
{
    run_rounds(ROUNDS);
}

/* On the host back end with a modelled link (50 us + 2 GB/s per copy) the
 * staging is not the device's memory (a write and a read move it) and
 * queued copies are still running when the next round's adds come. */
TEST(batch_matches_a_byte_model_with_slow_copies_in_flight)
{
    if (strcmp(test_backend(), "host") != 0)
        test_skip("the modelled link is a host back end feature");
    setenv("MAPPING_HOST_LINK", "2e9,50e-6", 1);
    run_rounds(ROUNDS / 3);
}

/* A queue in plan order that a last add makes unsorted: the flush must not
 * take the one-pass path. Here its copies overlap so that a walk assuming
 * order would merge them wrongly. */
TEST(batch_copy_added_out_of_order_after_ordered_ones_lands_where_it_belongs)
{
    mapping_device *dev = test_device();
    mapping_buffer *buf;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &buf));
    CHECK_OK(mapping_fill_gpu(NULL, buf, 0, 4096, 0));
    unsigned char one[100], two[300], three[150], expect[4096] = {0}, got[4096], back[2][64];
    memset(one, 1, sizeof one);
    memset(two, 2, sizeof two);
    memset(three, 3, sizeof three);
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    for (int stream_round = 0; stream_round < 2; stream_round++) {
        mapping_stream *s = NULL;
        if (stream_round)
            CHECK_OK(mapping_stream_create(dev, &s));
        size_t base = (size_t)stream_round * 2048;
        CHECK_OK(mapping_batch_add_to_gpu(batch, one, buf, base + 0, 100));     /* [0, 100) */
        CHECK_OK(mapping_batch_add_to_gpu(batch, two, buf, base + 400, 300));   /* [400, 700): in order */
        CHECK_OK(mapping_batch_add_to_cpu(batch, buf, base + 1000, back[0], 64)); /* in order: after */
        CHECK_OK(mapping_batch_add_to_gpu(batch, three, buf, base + 50, 150));  /* [50, 200): back, wins */
        CHECK_OK(mapping_batch_add_to_cpu(batch, buf, base + 60, back[1], 64)); /* sees three */
        memset(expect + base, 1, 100);
        memset(expect + base + 400, 2, 300);
        memset(expect + base + 50, 3, 150);
        CHECK_OK(mapping_batch_flush(s, batch));
        if (s) {
            CHECK_OK(mapping_stream_synchronize(s));
            mapping_stream_destroy(s);
        }
        CHECK(mapping_batch_count(batch) == 0);
        CHECK_OK(mapping_sync_to_cpu(buf, got));
        CHECK_BYTES(got, expect, sizeof expect);
        CHECK_BYTES(back[0], expect + base + 1000, 64);
        CHECK_BYTES(back[1], expect + base + 60, 64);
    }
    /* Another buffer whose pointer is lower, added after: also out of order. */
    mapping_buffer *other;
    CHECK_OK(mapping_allocate_gpu(dev, 4096, &other));
    mapping_buffer *hi = (uintptr_t)other > (uintptr_t)buf ? other : buf, *lo = hi == buf ? other : buf;
    CHECK_OK(mapping_fill_gpu(NULL, lo, 0, 4096, 0));
    CHECK_OK(mapping_fill_gpu(NULL, hi, 0, 4096, 0));
    CHECK_OK(mapping_batch_add_to_gpu(batch, one, hi, 100, 100));
    CHECK_OK(mapping_batch_add_to_gpu(batch, two, hi, 150, 300)); /* overlaps: wins */
    CHECK_OK(mapping_batch_add_to_gpu(batch, three, lo, 120, 150));
    CHECK_OK(mapping_batch_flush(NULL, batch));
    unsigned char expect_hi[4096] = {0}, expect_lo[4096] = {0};
    memset(expect_hi + 100, 1, 100);
    memset(expect_hi + 150, 2, 300);
    memset(expect_lo + 120, 3, 150);
    CHECK_OK(mapping_sync_to_cpu(hi, got));
    CHECK_BYTES(got, expect_hi, sizeof got);
    CHECK_OK(mapping_sync_to_cpu(lo, got));
    CHECK_BYTES(got, expect_lo, sizeof got);
    mapping_batch_destroy(batch);
    mapping_free_gpu(other);
    mapping_free_gpu(buf);
}
