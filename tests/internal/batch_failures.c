/*
 * A failed flush: it names the first copy not done, leaves the destinations
 * of copies not done untouched, keeps what was done, and leaves exactly the
 * copies not done queued. Checked for a fault at every back-end operation
 * the flush makes, so the test does not depend on how a back end plans it.
 */
#include <stdio.h>
#include "testing/test_hooks.h"
#include "harness.h"

enum { SMALL = 64, N_SMALL = 12, BUF = 64 << 10 };
static const size_t LARGE = (size_t)5 << 20; /* above the straight-through threshold */

typedef struct scenario {
    mapping_buffer *a, *b, *big, *src_buf;
    unsigned char  *h2d_src;   /* sources of host-to-device copies */
    unsigned char  *d2h_dst;   /* destinations of device-to-host copies */
    unsigned char  *device_content;
    unsigned char  *large_src;
    unsigned char  *large_dst;
} scenario;

enum { INITIAL_DEVICE = 0x11, INITIAL_HOST = 0x22 };

/* Queues, in this order: small copies into a and b (alternating), one large
 * host-to-device copy, small device-to-host copies, one large device-to-host. */
static size_t queue_copies(mapping_batch *batch, scenario *s)
{
    size_t n = 0;
    for (size_t i = 0; i < N_SMALL; i++, n++)
        CHECK_OK(mapping_batch_add_to_gpu(batch, s->h2d_src + i * SMALL, i % 2 ? s->a : s->b, i * 2 * SMALL, SMALL));
    CHECK_OK(mapping_batch_add_to_gpu(batch, s->large_src, s->big, 0, LARGE));
    n++;
    for (size_t i = 0; i < N_SMALL; i++, n++)
        CHECK_OK(mapping_batch_add_to_cpu(batch, s->src_buf, i * 3 * SMALL, s->d2h_dst + i * SMALL, SMALL));
    CHECK_OK(mapping_batch_add_to_cpu(batch, s->src_buf, 0, s->large_dst, LARGE));
    return n + 1;
}

static void reset(mapping_device *dev, scenario *s)
{
    CHECK_OK(mapping_fill_gpu(NULL, s->a, 0, BUF, INITIAL_DEVICE));
    CHECK_OK(mapping_fill_gpu(NULL, s->b, 0, BUF, INITIAL_DEVICE));
    CHECK_OK(mapping_fill_gpu(NULL, s->big, 0, LARGE, INITIAL_DEVICE));
    CHECK_OK(mapping_sync_to_gpu(s->device_content, s->src_buf));
    memset(s->d2h_dst, INITIAL_HOST, N_SMALL * SMALL);
    memset(s->large_dst, INITIAL_HOST, LARGE);
    (void)dev;
}

static int all_equal(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* 1 = the copy was done, 0 = its destination is untouched; fails otherwise. */
static int copy_state(scenario *s, size_t index, unsigned char *scratch)
{
    const unsigned char *expect, *got;
    size_t bytes;
    if (index < N_SMALL) {
        CHECK_OK(mapping_sync_to_cpu_range(NULL, index % 2 ? s->a : s->b, index * 2 * SMALL, scratch, SMALL));
        got = scratch, expect = s->h2d_src + index * SMALL, bytes = SMALL;
        if (!memcmp(got, expect, bytes))
            return 1;
        CHECK(all_equal(got, bytes, INITIAL_DEVICE));
        return 0;
    }
    if (index == N_SMALL) {
        CHECK_OK(mapping_sync_to_cpu_range(NULL, s->big, 0, scratch, LARGE));
        if (!memcmp(scratch, s->large_src, LARGE))
            return 1;
        CHECK(all_equal(scratch, LARGE, INITIAL_DEVICE));
        return 0;
    }
    if (index < 2 * N_SMALL + 1) {
        size_t i = index - N_SMALL - 1;
        got = s->d2h_dst + i * SMALL, expect = s->device_content + i * 3 * SMALL;
        if (!memcmp(got, expect, SMALL))
            return 1;
        CHECK(all_equal(got, SMALL, INITIAL_HOST));
        return 0;
    }
    if (!memcmp(s->large_dst, s->device_content, LARGE))
        return 1;
    CHECK(all_equal(s->large_dst, LARGE, INITIAL_HOST));
    return 0;
}

TEST(batch_failed_flush_names_the_first_copy_not_done_and_keeps_only_those_queued)
{
    mapping_device *dev = test_device();
    scenario s;
    CHECK_OK(mapping_allocate_gpu(dev, BUF, &s.a));
    CHECK_OK(mapping_allocate_gpu(dev, BUF, &s.b));
    CHECK_OK(mapping_allocate_gpu(dev, LARGE, &s.big));
    CHECK_OK(mapping_allocate_gpu(dev, LARGE, &s.src_buf));
    s.h2d_src = malloc(N_SMALL * SMALL);
    s.d2h_dst = malloc(N_SMALL * SMALL);
    s.device_content = malloc(LARGE);
    s.large_src = malloc(LARGE);
    s.large_dst = malloc(LARGE);
    unsigned char *scratch = malloc(LARGE);
    test_pattern(s.h2d_src, N_SMALL * SMALL, 20);
    test_pattern(s.device_content, LARGE, 21);
    test_pattern(s.large_src, LARGE, 22);

    int failures = 0;
    for (int fault = 0; fault < 64; fault++) {
        reset(dev, &s);
        mapping_batch *batch;
        CHECK_OK(mapping_batch_create(dev, &batch));
        size_t n = queue_copies(batch, &s);
        mapping__inject_fault(dev, fault);
        mapping_status st = mapping_batch_flush(NULL, batch);
        mapping__inject_fault(dev, -1);
        if (st == MAPPING_OK) {
            for (size_t i = 0; i < n; i++)
                CHECK(copy_state(&s, i, scratch) == 1);
            mapping_batch_destroy(batch);
            break;
        }
        failures++;
        CHECK_STATUS(st, MAPPING_ERR_FAULT_INJECTED);
        char message[1024];
        snprintf(message, sizeof message, "%s", mapping_last_error_message());
        size_t not_done = 0, first = n;
        for (size_t i = 0; i < n; i++)
            if (!copy_state(&s, i, scratch)) {
                not_done++;
                if (first == n)
                    first = i;
            }
        CHECK(not_done > 0);
        CHECK(mapping_batch_count(batch) == not_done);
        char named[64];
        snprintf(named, sizeof named, "copy %zu of %zu", first, n);
        if (!strstr(message, named))
            test_fail(__FILE__, __LINE__, "fault %d: message does not name \"%s\": %s", fault, named, message);
        /* Flushing again moves exactly the rest. */
        CHECK_OK(mapping_batch_flush(NULL, batch));
        for (size_t i = 0; i < n; i++)
            CHECK(copy_state(&s, i, scratch) == 1);
        mapping_batch_destroy(batch);
    }
    CHECK(failures >= 3); /* staging, at least one scatter or copy, the large copies */
    mapping_free_gpu(s.a);
    mapping_free_gpu(s.b);
    mapping_free_gpu(s.big);
    mapping_free_gpu(s.src_buf);
    free(s.h2d_src);
    free(s.d2h_dst);
    free(s.device_content);
    free(s.large_src);
    free(s.large_dst);
    free(scratch);
}
