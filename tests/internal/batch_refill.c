/*
 * A batch after a failed flush, for the one-pass flush (small copies added in
 * plan order) and the general one (the same copies shuffled): each back-end
 * call the flush makes fails in turn (mapping__inject_fault_any). Then:
 * - every copy is done or its destination untouched, and exactly the copies
 *   not done are queued (all of them when the flush could not tell: its one
 *   wait on the device's blocking stream failed);
 * - the queue's order flag (b->unsorted, recomputed by the failed flush)
 *   says whether the copies left are in plan order, so that the retry takes
 *   the one-pass flush only when it may;
 * - the retry lands every byte: as refilled, or with one more copy added
 *   out of order first (the queue turns unsorted after the refill).
 * On a back end with a blocking stream (OpenCL), the fault at that one wait
 * must come up: its message says which copies completed is unknown, names
 * copy 0 and leaves every copy queued.
 *
 * The copies' ranges are disjoint (each copy's state can be read on its
 * own) and, in add order, go back and forth within a buffer: a flush that
 * walked them as if sorted would merge them wrongly.
 */
#include <stdint.h>
#include <time.h>
#include "testing/test_hooks.h"
#include "harness.h"

enum {
    SMALL = 48,
    SLOTS = 24,         /* per direction; slot 0 of the lowest buffer is the late copy's */
    BUF = SLOTS * 3 * SMALL,
    MAX_FAULTS = 200,
    INITIAL_DEVICE = 0x11,
    INITIAL_HOST = 0x22
};

typedef struct rcopy {
    int    to_gpu, buf; /* buf: 0 or 1 (dst[]) for to_gpu; the source buffer otherwise */
    size_t slot;
} rcopy;

typedef struct scene {
    mapping_device *dev;
    mapping_buffer *dst[2], *src; /* dst[0] has the lower pointer */
    unsigned char   h2d_src[2][BUF], d2h_dst[BUF], content[BUF], got[BUF];
    rcopy           copies[2 * SLOTS];
    size_t          n;
} scene;

static size_t dev_off(size_t slot)
{
    return slot * 3 * SMALL;
}

static void reset(scene *s)
{
    CHECK_OK(mapping_fill_gpu(NULL, s->dst[0], 0, BUF, INITIAL_DEVICE));
    CHECK_OK(mapping_fill_gpu(NULL, s->dst[1], 0, BUF, INITIAL_DEVICE));
    CHECK_OK(mapping_sync_to_gpu(s->content, s->src));
    memset(s->d2h_dst, INITIAL_HOST, BUF);
}

/* In plan order: host-to-device into dst[0] then dst[1] (slots 1.. ascending),
 * then device-to-host; shuffled: a fixed permutation of that. */
static void make_copies(scene *s, int shuffled)
{
    s->n = 0;
    for (int b = 0; b < 2; b++)
        for (size_t k = 1; k < SLOTS / 2; k++)
            s->copies[s->n++] = (rcopy){1, b, k * 2 + (size_t)b};
    for (size_t k = 1; k < SLOTS; k++)
        s->copies[s->n++] = (rcopy){0, 0, k};
    if (shuffled) {
        unsigned long long x = 0x243F6A8885A308D3ull;
        for (size_t i = s->n; i > 1; i--) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t j = (size_t)(x % i);
            rcopy t = s->copies[i - 1];
            s->copies[i - 1] = s->copies[j];
            s->copies[j] = t;
        }
    }
}

static void add(scene *s, mapping_batch *batch, const rcopy *c)
{
    size_t off = dev_off(c->slot);
    if (c->to_gpu)
        CHECK_OK(mapping_batch_add_to_gpu(batch, s->h2d_src[c->buf] + off, s->dst[c->buf], off, SMALL));
    else
        CHECK_OK(mapping_batch_add_to_cpu(batch, s->src, off, s->d2h_dst + off, SMALL));
}

/* 1: done; 0: destination untouched; anything else fails. */
static int copy_state(scene *s, const rcopy *c)
{
    size_t off = dev_off(c->slot);
    const unsigned char *got, *want;
    unsigned char old;
    if (c->to_gpu) {
        CHECK_OK(mapping_sync_to_cpu_range(NULL, s->dst[c->buf], off, s->got, SMALL));
        got = s->got, want = s->h2d_src[c->buf] + off, old = INITIAL_DEVICE;
    } else {
        got = s->d2h_dst + off, want = s->content + off, old = INITIAL_HOST;
    }
    if (!memcmp(got, want, SMALL))
        return 1;
    for (size_t i = 0; i < SMALL; i++)
        if (got[i] != old)
            test_fail(__FILE__, __LINE__, "a %s copy (slot %zu) is neither done nor untouched: byte %zu is 0x%02x",
                      c->to_gpu ? "host-to-device" : "device-to-host", c->slot, i, got[i]);
    return 0;
}

/* The queue as the library holds it: is it in plan order? */
static bool queue_in_plan_order(const mapping_batch *b)
{
    for (size_t i = 1; i < b->count; i++)
        if (!mapping__batch_in_order(&b->copies[i - 1], &b->copies[i]))
            return false;
    return true;
}

static void scene_open(scene *s)
{
    s->dev = test_device();
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(s->dev, BUF, &a));
    CHECK_OK(mapping_allocate_gpu(s->dev, BUF, &b));
    s->dst[0] = (uintptr_t)a < (uintptr_t)b ? a : b;
    s->dst[1] = s->dst[0] == a ? b : a;
    CHECK_OK(mapping_allocate_gpu(s->dev, BUF, &s->src));
    test_pattern(s->h2d_src[0], BUF, 31);
    test_pattern(s->h2d_src[1], BUF, 32);
    test_pattern(s->content, BUF, 33);
}

static void scene_close(scene *s)
{
    mapping_free_gpu(s->dst[0]);
    mapping_free_gpu(s->dst[1]);
    mapping_free_gpu(s->src);
}

typedef struct sweep_result {
    int failures, unknown, refilled_unsorted, refilled_sorted;
} sweep_result;

/* Fails each back-end call of one flush in turn, checks the batch it
 * leaves, then retries with a late out-of-order copy added. */
static sweep_result sweep(scene *s, int shuffled)
{
    sweep_result r = {0, 0, 0, 0};
    const rcopy late = {1, 0, 0}; /* host-to-device, lowest buffer, offset 0: before every other copy */
    make_copies(s, shuffled);
    int fault;
    for (fault = 0; fault < MAX_FAULTS; fault++) {
        reset(s);
        mapping_batch *batch;
        CHECK_OK(mapping_batch_create(s->dev, &batch));
        for (size_t i = 0; i < s->n; i++)
            add(s, batch, &s->copies[i]);
        CHECK(batch->unsorted == !queue_in_plan_order(batch));
        CHECK(batch->unsorted == shuffled);
        mapping_clear_last_error();
        mapping__inject_fault_any(s->dev, fault);
        mapping_status st = mapping_batch_flush(NULL, batch);
        int fired = mapping__fault_remaining(s->dev) < 0;
        mapping__inject_fault_any(s->dev, -1);
        if (st == MAPPING_OK) {
            CHECK(mapping_batch_count(batch) == 0);
            for (size_t i = 0; i < s->n; i++)
                CHECK(copy_state(s, &s->copies[i]) == 1);
            mapping_batch_destroy(batch);
            if (!fired)
                break;
            continue;
        }
        r.failures++;
        CHECK_STATUS(st, MAPPING_ERR_FAULT_INJECTED);
        char message[1024];
        snprintf(message, sizeof message, "%s", mapping_last_error_message());
        bool unknown = strstr(message, "which copies completed is unknown") != NULL;
        size_t not_done = 0;
        for (size_t i = 0; i < s->n; i++)
            not_done += !copy_state(s, &s->copies[i]);
        if (unknown) {
            r.unknown++;
            char named[64];
            snprintf(named, sizeof named, "copy 0 of %zu", s->n);
            if (!strstr(message, named) || !strstr(message, "0 copies done"))
                test_fail(__FILE__, __LINE__, "fault %d: the failed wait's message does not say \"%s\" and "
                          "\"0 copies done\": %s", fault, named, message);
            if (mapping_batch_count(batch) != s->n)
                test_fail(__FILE__, __LINE__, "fault %d: the wait failed, yet %zu of %zu copies are queued: %s", fault,
                          mapping_batch_count(batch), s->n, message);
        } else if (mapping_batch_count(batch) != not_done) {
            test_fail(__FILE__, __LINE__, "fault %d: %zu copies queued, %zu not done: %s", fault,
                      mapping_batch_count(batch), not_done, message);
        }
        /* The order flag of the refilled queue, and the queue itself. */
        if (batch->unsorted != !queue_in_plan_order(batch))
            test_fail(__FILE__, __LINE__, "fault %d: the refilled queue of %zu copies is %sin plan order but "
                      "flagged %s", fault, batch->count, queue_in_plan_order(batch) ? "" : "not ",
                      batch->unsorted ? "unsorted" : "sorted");
        if (batch->count > 1 && batch->unsorted)
            r.refilled_unsorted++;
        else if (batch->count > 1)
            r.refilled_sorted++;
        size_t largest = 0;
        for (size_t i = 0; i < batch->count; i++)
            largest = batch->copies[i].bytes > largest ? batch->copies[i].bytes : largest;
        CHECK(batch->largest == largest);
        /* The retry lands everything: as refilled (the flag alone decides
         * the path), or after a late copy out of order. */
        int late_added = fault % 2;
        if (late_added) {
            add(s, batch, &late);
            CHECK(batch->count < 2 || batch->unsorted);
        }
        CHECK_OK(mapping_batch_flush(NULL, batch));
        CHECK(mapping_batch_count(batch) == 0);
        for (size_t i = 0; i < s->n; i++)
            CHECK(copy_state(s, &s->copies[i]) == 1);
        CHECK(copy_state(s, &late) == late_added);
        mapping_batch_destroy(batch);
    }
    CHECK(fault < MAX_FAULTS);
    printf("%s: %d faults failed the flush (%d at its one wait); refilled queues: %d unsorted, %d in order\n",
           shuffled ? "shuffled (general flush)" : "plan order (one-pass flush)", r.failures, r.unknown,
           r.refilled_unsorted, r.refilled_sorted);
    return r;
}

TEST(batch_refilled_by_a_failed_flush_keeps_its_order_flag_and_lands_every_copy)
{
    static scene S;
    scene *s = &S;
    scene_open(s);
    sweep_result in_order = sweep(s, 0), shuffled = sweep(s, 1);
    CHECK(in_order.failures >= 2 && shuffled.failures >= 2);
    /* A failure part-way through a shuffled queue leaves it unsorted. */
    CHECK(shuffled.refilled_unsorted >= 1);
    scene_close(s);
}

TEST(batch_blocking_flush_whose_one_wait_fails_keeps_every_copy_queued)
{
    static scene S;
    scene *s = &S;
    scene_open(s);
    if (!s->dev->blocking.state)
        test_skip("back end %s has no blocking stream: a blocking flush waits for each step on its own",
                  test_backend());
    bool mapped = s->dev->map_copies;
    s->dev->map_copies = false; /* copies through mapped memory queue nothing: no one wait to fail */
    sweep_result in_order = sweep(s, 0), shuffled = sweep(s, 1);
    CHECK(in_order.unknown >= 1 && shuffled.unknown >= 1);
    s->dev->map_copies = mapped;
    scene_close(s);
}

/* ---- a failed wait with the work still queued ---- */

static void *open_gate_later(void *gate)
{
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    test_gate_open(gate);
    return NULL;
}

/* Queues n small copies of `src` into buf (plan order), flushes blocking
 * with the n-th back-end call failing; returns the status. */
static mapping_status flush_small(mapping_batch *batch, const unsigned char *src, mapping_buffer *buf, int fault)
{
    for (size_t i = 0; i < SLOTS; i++)
        CHECK_OK(mapping_batch_add_to_gpu(batch, src + i * SMALL, buf, dev_off(i), SMALL));
    mapping_clear_last_error();
    mapping__inject_fault_any(mapping_buffer_device(buf), fault);
    mapping_status st = mapping_batch_flush(NULL, batch);
    mapping__inject_fault_any(mapping_buffer_device(buf), -1);
    return st;
}

/* The one wait of a blocking flush fails while its steps are still queued
 * (here: behind a host function holding the device's blocking stream). The
 * caller then drops the copies and flushes others: the batch must not
 * reuse its staging before the first flush's steps are done, or they move
 * the new bytes into the old destinations (neither old nor copied). */
TEST(batch_flush_after_a_failed_wait_does_not_reuse_staging_still_in_use)
{
    mapping_device *dev = test_device();
    if (!dev->blocking.state)
        test_skip("back end %s has no blocking stream: a blocking flush waits for each step on its own",
                  test_backend());
    static unsigned char ones[BUF], twos[BUF], got[BUF], zeros[BUF];
    memset(ones, 1, sizeof ones);
    memset(twos, 2, sizeof twos);
    mapping_buffer *a, *b;
    CHECK_OK(mapping_allocate_gpu(dev, BUF, &a));
    CHECK_OK(mapping_allocate_gpu(dev, BUF, &b));
    bool mapped = dev->map_copies;
    dev->map_copies = false; /* copies through mapped memory queue nothing: no one wait to fail */
    mapping_batch *batch;
    CHECK_OK(mapping_batch_create(dev, &batch));
    /* Which call is the wait: the one whose failure says so (the staging
     * allocated first, so that every flush makes the same calls). */
    CHECK_OK(flush_small(batch, ones, a, -1));
    int wait_call = -1;
    for (int fault = 0; fault < 20 && wait_call < 0; fault++) {
        mapping_status st = flush_small(batch, ones, a, fault);
        if (getenv("MAPPING_TEST_VERBOSE"))
            printf("fault %d: %s: %s\n", fault, mapping_status_name(st), mapping_last_error_message());
        if (st != MAPPING_OK && strstr(mapping_last_error_message(), "which copies completed is unknown"))
            wait_call = fault;
        mapping_batch_clear(batch);
        CHECK_OK(mapping_sync_to_cpu(a, got)); /* drains the device's queue */
    }
    CHECK(wait_call >= 0);
    CHECK_OK(flush_small(batch, ones, a, -1)); /* waits for what the failed wait left, if anything */
    CHECK_OK(mapping_fill_gpu(NULL, a, 0, BUF, 0));
    CHECK_OK(mapping_fill_gpu(NULL, b, 0, BUF, 0));

    test_gate gate = TEST_GATE_INIT;
    CHECK_OK(dev->be->launch_host(dev->state, dev->blocking.state, test_gate_wait, &gate));
    CHECK_STATUS(flush_small(batch, ones, a, wait_call), MAPPING_ERR_FAULT_INJECTED);
    CHECK(strstr(mapping_last_error_message(), "which copies completed is unknown") != NULL);
    CHECK(mapping_batch_count(batch) == SLOTS);
    CHECK(!test_gate_passed(&gate)); /* the steps are still queued */
    pthread_t opener;
    CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0);
    mapping_batch_clear(batch);
    CHECK_OK(flush_small(batch, twos, b, -1)); /* other bytes, another buffer, the same layout */
    CHECK(pthread_join(opener, NULL) == 0);
    CHECK(test_gate_passed(&gate));
    CHECK_OK(mapping_sync_to_cpu(a, got));
    for (size_t i = 0; i < SLOTS; i++) { /* each copy of the failed flush: old bytes or copied ones */
        const unsigned char *at = got + dev_off(i);
        if (memcmp(at, ones, SMALL) && memcmp(at, zeros, SMALL))
            test_fail(__FILE__, __LINE__, "copy %zu of the flush whose wait failed wrote 0x%02x: neither its old "
                      "bytes nor its source's", i, at[0]);
    }
    CHECK_OK(mapping_sync_to_cpu(b, got));
    for (size_t i = 0; i < SLOTS; i++)
        CHECK_BYTES(got + dev_off(i), twos, SMALL);
    mapping_batch_destroy(batch);
    mapping_free_gpu(a);
    mapping_free_gpu(b);
    dev->map_copies = mapped;
}
